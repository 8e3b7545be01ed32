"""Subscribing to a vLLM server's KV cache events (ZMQ + msgpack) and decoding them.

vLLM's ZmqEventPublisher sends each batch as a multipart message
`(topic, seq as 8 bytes big-endian, payload)`; the payload is a msgpack-encoded
KVEventBatch `[ts, events, data_parallel_rank?]`. Events come in two encodings:

- the older **array** encoding (vLLM 0.17 to 0.23: `array_like=True`
  structs): `["BlockStored", block_hashes, parent_block_hash, token_ids,
  block_size, lora_id, medium, lora_name, extra_keys, ...]`, every field of
  the release written, nulls included (traces/vectors/VERSION/events.json);
- the **map** encoding (0.24 on): `{"type": "BlockStored", "block_hashes":
  ..., ...}`, fields at their default left out.

Both decode to the form trace checkpoints hold (harness/backends/base.py's
kv_event_json): `{"type": ..., field: value}` with null fields left out, bytes
as hex. With a replay endpoint (vLLM's ROUTER socket), batches published
before subscribing are fetched first, from sequence 0.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Field order of the array encoding: 0.17's fields, then those later releases
# appended (array-encoded streams of those releases keep the same prefix).
ARRAY_FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                    "kv_cache_spec_sliding_window", "locality", "ownership", "session_id"),
    "BlockRemoved": ("block_hashes", "medium", "group_idx", "locality", "ownership"),
    "AllBlocksCleared": (),
}
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class StreamError(ValueError):
    """A message that is not a vLLM KV event batch (bad input)."""


@dataclass(slots=True)
class EventBatch:
    seq: int
    ts: float
    events: list[dict]
    data_parallel_rank: int | None
    encoding: str  # "array" or "map"


def _plain(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def normalize_event(raw: Any) -> tuple[dict, str]:
    """One decoded event -> (checkpoint form, its encoding)."""
    if isinstance(raw, dict):
        kind = raw.get("type")
        if kind not in ARRAY_FIELDS:
            raise StreamError(f"unknown KV event type {kind!r}")
        out = {"type": kind}
        for k, v in raw.items():
            if k != "type" and v is not None:
                out[k] = _plain(v)
        return out, "map"
    if isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        kind = raw[0]
        names = ARRAY_FIELDS.get(kind)
        if names is None:
            raise StreamError(f"unknown KV event type {kind!r}")
        if len(raw) - 1 > len(names):
            raise StreamError(f"{kind} with {len(raw) - 1} fields; this reader knows {len(names)}")
        out = {"type": kind}
        for name, v in zip(names, raw[1:]):
            if v is not None:
                out[name] = _plain(v)
        return out, "array"
    raise StreamError(f"not a KV event: {raw!r:.80}")


def decode_payload(payload: bytes, seq: int = -1) -> EventBatch:
    import msgspec

    try:
        obj = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as e:
        raise StreamError(f"batch {seq}: not msgpack ({e})") from None
    if not isinstance(obj, (list, tuple)) or len(obj) < 2 or not isinstance(obj[1], list):
        raise StreamError(f"batch {seq}: not a KVEventBatch [ts, events, dp_rank?]")
    events, encodings = [], set()
    for raw in obj[1]:
        ev, enc = normalize_event(raw)
        events.append(ev)
        encodings.add(enc)
    encoding = encodings.pop() if len(encodings) == 1 else ("mixed" if encodings else "none")
    rank = obj[2] if len(obj) > 2 else None
    try:
        batch = EventBatch(seq, float(obj[0]), events, rank, encoding)
    except (TypeError, ValueError):
        raise StreamError(f"batch {seq}: ts: a number, not {obj[0]!r:.40}") from None
    problem = batch_problem(batch)
    if problem is not None:
        raise StreamError(f"batch {seq}: {problem}")
    return batch


def _is_hash(h) -> bool:
    return (isinstance(h, int) and not isinstance(h, bool)) or isinstance(h, str)


def _is_count(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1


def batch_problem(b: EventBatch) -> str | None:
    """What makes a batch unusable for a trace (`field: message`), or None:
    a stream may come from anywhere, and its fields go straight into requests."""
    if not isinstance(b.seq, int) or isinstance(b.seq, bool):
        return f"seq: an integer, not {b.seq!r:.40}"
    if not isinstance(b.ts, (int, float)) or isinstance(b.ts, bool):
        return f"ts: a number, not {b.ts!r:.40}"
    if not isinstance(b.events, list):
        return "events: a list of events"
    for i, ev in enumerate(b.events):
        if not isinstance(ev, dict) or ev.get("type") not in ARRAY_FIELDS:
            return f"events[{i}]: not a KV event ({str(ev)[:60]})"
        hashes, tokens = ev.get("block_hashes", []), ev.get("token_ids", [])
        parent = ev.get("parent_block_hash")
        if not isinstance(hashes, list) or not all(map(_is_hash, hashes)) or (
                parent is not None and not _is_hash(parent)):
            return f"events[{i}].block_hashes: integers or hex strings"
        if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens):
            return f"events[{i}].token_ids: a list of token ids"
        if ev["type"] != "BlockStored":
            continue
        if not _is_count(ev.get("block_size")):
            return f"events[{i}].block_size: a positive integer"
        for name in ("lora_name", "session_id"):
            if ev.get(name) is not None and not isinstance(ev[name], str):
                return f"events[{i}].{name}: a string"
        lora_id = ev.get("lora_id")
        if lora_id is not None and not _is_count(lora_id):
            return f"events[{i}].lora_id: a positive integer"
        extra = ev.get("extra_keys")
        if extra is not None and not (isinstance(extra, list) and all(
                k is None or isinstance(k, list) for k in extra)):
            return f"events[{i}].extra_keys: a list (per block) of lists or nulls"
    return None


@dataclass(slots=True)
class Listen:
    """Where and how to receive a server's KV events (`capture kv-events`).

    vLLM's publisher binds its PUB socket only for wildcard (`tcp://*:P`,
    `tcp://[::]:P`), `ipc://` and `inproc://` endpoints and connects to any
    other, such as `tcp://127.0.0.1:P` (its replay socket is always bound). So
    a subscriber connects (`bind=False`) to a publisher that binds, and binds
    (`bind=True`) an address the publisher connects to: the way to keep both
    on the loopback interface.
    """

    endpoint: str
    bind: bool = False
    topic: str = ""
    replay_endpoint: str | None = None
    # Until the first batch: how long to wait for the server (it may still be
    # starting: 1-4 minutes on a small machine).
    wait_seconds: float = 300.0
    # After the first batch: stop after this long in all, after this many
    # batches, or after this long without one.
    seconds: float | None = None
    max_batches: int | None = None
    idle_seconds: float | None = None

    def describe(self) -> str:
        if self.bind:
            return (f"listening on {self.endpoint} (bound here: start vLLM with "
                    f"--kv-events-config '{{\"enable_kv_cache_events\": true, \"publisher\": "
                    f"\"zmq\", \"endpoint\": \"{self.endpoint}\"}}')")
        return (f"subscribed to {self.endpoint} (vLLM must bind it: an endpoint tcp://*:PORT "
                "or ipc://PATH; for tcp://127.0.0.1:PORT vLLM connects, use --bind)")


class StreamUnavailable(StreamError):
    """The server did not answer: nothing to subscribe to (the environment)."""


def subscribe(listen: Listen, status=None) -> Iterator[EventBatch]:
    """Yield batches as they arrive (see Listen for when it stops). `status`
    is called with a line for the user now and then (waiting, retrying)."""
    import zmq

    say = status or (lambda line: None)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, listen.topic.encode())
    try:
        if listen.bind:
            try:
                sub.bind(listen.endpoint)
            except zmq.ZMQError as e:
                raise StreamUnavailable(f"cannot bind {listen.endpoint}: {e}") from None
        else:
            sub.connect(listen.endpoint)
        say(listen.describe())
        yield from _receive(ctx, sub, listen, say)
    finally:
        sub.close(linger=0)


def _receive(ctx, sub, listen: Listen, say) -> Iterator[EventBatch]:
    import zmq

    count = 0
    last_seq = -1
    started = time.monotonic()
    if listen.replay_endpoint is not None:
        for batch in _replay(ctx, listen.replay_endpoint, 0, started + listen.wait_seconds,
                             say):
            yield batch
            last_seq = batch.seq
            count += 1
            if listen.max_batches is not None and count >= listen.max_batches:
                return
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    last_message = time.monotonic() if count else None
    deadline = None
    next_note = started + 10.0
    while listen.max_batches is None or count < listen.max_batches:
        now = time.monotonic()
        if last_message is None:
            if now - started >= listen.wait_seconds:
                return  # the caller says nothing came
            if now >= next_note:
                say(f"waiting for the server's first batch ({now - started:.0f} s of "
                    f"{listen.wait_seconds:.0f} s)")
                next_note = now + 10.0
        else:
            if deadline is not None and now >= deadline:
                return
            if listen.idle_seconds is not None and now - last_message >= listen.idle_seconds:
                return
        if not poller.poll(100):
            continue
        frames = sub.recv_multipart()
        if last_message is None and listen.seconds is not None:
            deadline = time.monotonic() + listen.seconds
        last_message = time.monotonic()
        if len(frames) != 3:
            raise StreamError(f"message of {len(frames)} frames (expected topic, seq, "
                              "payload)")
        seq = int.from_bytes(frames[1], "big", signed=True)
        if seq <= last_seq:
            continue  # already had it from the replay
        if listen.replay_endpoint is not None and seq > last_seq + 1:
            # Batches published before our subscription took hold (ZMQ's slow
            # joiner), or before we came: fetch the gap from the replay socket.
            try:
                for batch in _replay(ctx, listen.replay_endpoint, last_seq + 1,
                                     time.monotonic() + 5.0, say):
                    if batch.seq >= seq:
                        break
                    yield batch
                    count += 1
            except StreamUnavailable:
                pass  # the server is going away; the caller counts the gap
        last_seq = seq
        yield decode_payload(frames[2], seq)
        count += 1


def _replay(ctx, endpoint: str, start: int, deadline: float, say) -> Iterator[EventBatch]:
    """Batches from `start` on, from vLLM's replay socket; asked again until
    `deadline` while the server does not answer (it may still be starting)."""
    import zmq

    while True:
        req = ctx.socket(zmq.DEALER)
        req.connect(endpoint)
        try:
            req.send_multipart((b"", start.to_bytes(8, "big")))
            if req.poll(5000):
                while True:
                    frames = req.recv_multipart()
                    # (empty delimiter, topic, seq, payload) from 0.32; 0.17 sends no topic.
                    if len(frames) < 3:
                        raise StreamError(f"malformed replay message of {len(frames)} frames")
                    seq_bytes, payload = frames[-2], frames[-1]
                    if seq_bytes == END_SEQ:
                        return
                    yield decode_payload(payload, int.from_bytes(seq_bytes, "big", signed=True))
                    if not req.poll(5000):
                        raise StreamUnavailable(f"the replay endpoint {endpoint} stopped "
                                                "answering")
        finally:
            req.close(linger=0)
        if time.monotonic() >= deadline:
            raise StreamUnavailable(f"no answer from the replay endpoint {endpoint}")
        say(f"no answer from the replay endpoint {endpoint} yet; asking again")
