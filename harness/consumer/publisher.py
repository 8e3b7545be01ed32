"""KV event batches on the wire as vLLM's ZmqEventPublisher sends them.

Each batch is the multipart message (topic, sequence number as 8 bytes
big-endian, msgpack payload); the payload is the array [ts, events,
data_parallel_rank], each event a map with a "type" key (0.24+) or an array
led by the type name (up to 0.23), fields at their default left out
(profile.kv_events_map_layout). A ROUTER socket answers replay requests
(client, empty frame, start sequence) with every kept batch from there on,
then the end marker (empty topic, sequence -1, empty payload). Both sockets
are bound to 127.0.0.1 only.
"""

from __future__ import annotations

import threading
import time
from typing import Any

# (field, whether it has a default: msgspec's omit_defaults leaves those out
# when unset), in vLLM's declaration order.
_FIELDS: dict[str, tuple[tuple[str, bool], ...]] = {
    "BlockStored": (("block_hashes", False), ("parent_block_hash", False), ("token_ids", False),
                    ("block_size", False), ("lora_id", False), ("medium", False),
                    ("lora_name", False), ("extra_keys", True), ("group_idx", True),
                    ("kv_cache_spec_kind", True), ("kv_cache_spec_sliding_window", True),
                    ("locality", True), ("ownership", True), ("session_id", True),
                    ("lookahead_token_ids", True)),
    "BlockRemoved": (("block_hashes", False), ("medium", False), ("group_idx", True),
                     ("locality", True), ("ownership", True)),
    "AllBlocksCleared": (),
}
END_SEQ = (-1).to_bytes(8, "big", signed=True)
HOST = "tcp://127.0.0.1"


def wire_event(event: Any, map_layout: bool) -> Any:
    """One of impl's KV events (impl/kv_events.py) as vLLM's encoder shapes it."""
    kind = type(event).__name__
    values = [(name, getattr(event, name, None), has_default) for name, has_default in
              _FIELDS[kind]]
    if map_layout:
        out: dict[str, Any] = {"type": kind}
        for name, value, has_default in values:
            if value is not None or not has_default:
                out[name] = value
        return out
    row: list[Any] = [kind, *(value for _, value, _ in values)]
    while len(row) > 1 and row[-1] is None and values[len(row) - 2][2]:
        row.pop()  # trailing defaults
    return row


class Publisher:
    """PUB and replay sockets on 127.0.0.1; `publish(events)` sends one batch."""

    def __init__(self, topic: str, map_layout: bool) -> None:
        import msgspec
        import zmq

        self._zmq = zmq
        self._encode = msgspec.msgpack.Encoder().encode
        self.map_layout = map_layout
        self.topic = topic.encode()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        port = self._pub.bind_to_random_port(HOST)
        self.endpoint = f"{HOST}:{port}"
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self.replay_endpoint = f"{HOST}:{self._router.bind_to_random_port(HOST)}"
        self._kept: list[tuple[int, bytes]] = []
        self._lock = threading.Lock()
        self._running = True
        self.next_seq = 0
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    def publish(self, events: list) -> int:
        """Send one batch; its sequence number."""
        payload = self._encode([time.time(), [wire_event(e, self.map_layout) for e in events], 0])
        seq = self.next_seq
        self.next_seq += 1
        with self._lock:
            self._kept.append((seq, payload))
        self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        return seq

    def _serve_replay(self) -> None:
        poller = self._zmq.Poller()
        poller.register(self._router, self._zmq.POLLIN)
        while self._running:
            if not poller.poll(50):
                continue
            frames = self._router.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            with self._lock:
                kept = [k for k in self._kept if k[0] >= first]
            for seq, payload in kept:
                self._router.send_multipart((client, b"", self.topic, seq.to_bytes(8, "big"),
                                             payload))
            self._router.send_multipart((client, b"", b"", END_SEQ, b""))

    def close(self) -> None:
        self._running = False
        self._thread.join(timeout=2.0)
        self._pub.close()
        self._router.close()
        self._ctx.term()
