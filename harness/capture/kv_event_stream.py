"""Subscribing to a vLLM server's KV cache events (ZMQ + msgpack) and decoding them.

vLLM's ZmqEventPublisher sends each batch as a multipart message
`(topic, seq as 8 bytes big-endian, payload)`; the payload is a msgpack-encoded
KVEventBatch `[ts, events, data_parallel_rank?]`. Events come in two encodings:

- the older **array** encoding (vLLM up to 0.17.x: `array_like=True` structs):
  `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
  lora_id, medium, lora_name, extra_keys?, ...]`, trailing defaults left out;
- the newer **map** encoding (0.32): `{"type": "BlockStored", "block_hashes":
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
    """A message that is not a vLLM KV event batch."""


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
    return EventBatch(seq, float(obj[0]), events, rank, encoding)


def subscribe(endpoint: str, topic: str = "", replay_endpoint: str | None = None,
              seconds: float | None = None, max_batches: int | None = None,
              idle_seconds: float | None = None) -> Iterator[EventBatch]:
    """Yield batches as they arrive, until `seconds` pass, `max_batches` came,
    or nothing came for `idle_seconds`."""
    import zmq

    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.connect(endpoint)
    count = 0
    last_seq = -1
    try:
        if replay_endpoint is not None:
            for batch in _replay(ctx, replay_endpoint):
                yield batch
                last_seq = batch.seq
                count += 1
                if max_batches is not None and count >= max_batches:
                    return
        deadline = None if seconds is None else time.monotonic() + seconds
        last_message = time.monotonic()
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        while max_batches is None or count < max_batches:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return
            if idle_seconds is not None and now - last_message >= idle_seconds:
                return
            if not poller.poll(100):
                continue
            frames = sub.recv_multipart()
            last_message = time.monotonic()
            if len(frames) != 3:
                raise StreamError(f"message of {len(frames)} frames (expected topic, seq, "
                                  "payload)")
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq <= last_seq:
                continue  # already had it from the replay
            if replay_endpoint is not None and last_seq >= 0 and seq > last_seq + 1:
                # A batch published while our subscription was still being set
                # up (ZMQ's slow joiner): fetch the gap from the replay socket.
                for batch in _replay(ctx, replay_endpoint, start=last_seq + 1):
                    if batch.seq >= seq:
                        break
                    yield batch
                    count += 1
            last_seq = seq
            yield decode_payload(frames[2], seq)
            count += 1
    finally:
        sub.close(linger=0)


def _replay(ctx, endpoint: str, start: int = 0) -> Iterator[EventBatch]:
    import zmq

    req = ctx.socket(zmq.DEALER)
    req.connect(endpoint)
    try:
        req.send_multipart((b"", start.to_bytes(8, "big")))
        while True:
            if not req.poll(5000):
                raise StreamError(f"no answer from the replay endpoint {endpoint}")
            frames = req.recv_multipart()
            # (empty delimiter, topic, seq, payload) from 0.32; 0.17 sends no topic.
            if len(frames) < 3:
                raise StreamError(f"malformed replay message of {len(frames)} frames")
            seq_bytes, payload = frames[-2], frames[-1]
            if seq_bytes == END_SEQ:
                return
            yield decode_payload(payload, int.from_bytes(seq_bytes, "big", signed=True))
    finally:
        req.close(linger=0)
