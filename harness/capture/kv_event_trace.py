"""A trace from a KV event stream alone: the server's events become checkpoints.

Systems that only see vLLM's KV events (routers, KV-aware load balancers) can
have them checked against kvconform's impl. Each published batch becomes
calls that make a KV cache manager store and drop exactly those blocks,
followed by a `checkpoint {fields: [events]}` whose answer is the batch as the
server published it; replaying the trace checks that the impl, given the same
blocks, emits the same events: block hashes (so hash algorithm, seed and extra
keys), parent hashes, token ids, block size, LoRA and group fields.

- BlockStored (n blocks after parent P): a request whose prompt is P's chain
  of tokens plus the event's tokens is added, looked up (it hits P's chain),
  allocated for the new tokens (which stores the n blocks) and freed.
- BlockRemoved: `evict_blocks` of the block that holds that hash.
- AllBlocksCleared: `reset_prefix_cache`.

Block ids follow from the calls alone: every synthetic request allocates only
full blocks, which are all cached, so freed blocks go to the tail of the free
queue and fresh ones come from its head in order. The pool is sized to hold
every block the stream ever stores, so the k-th stored block is block k.

What the stream does not say is left out, and counted: chains whose parent was
stored before the subscription began, multimodal and prompt-embedding blocks
(placeholder lengths and embeddings are not published), LoRA blocks under
0.32 without `--lora-path` (the adapter path is hashed but not published),
groups other than 0, and a second copy of a block already cached.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from harness.capture.kv_event_stream import EventBatch
from harness.capture.sinks import JsonlSink, encode_line
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.trace.codec import TraceHeader
from impl.profiles import get_profile


@dataclass(slots=True)
class _Block:
    block_id: int
    parent: object  # the parent's hash, None for a chain's first block
    tokens: list[int]
    salt: str | None
    copies: int = 1  # copies the server holds (it may cache a hash twice)


@dataclass(slots=True)
class EventTraceBuilder:
    vllm_version: str
    hash_algo: str = "sha256"
    hash_seed: str | None = "0"
    # LoRA name -> adapter path (0.32 hashes the path; events do not carry it).
    lora_paths: dict[str, str] = field(default_factory=dict)
    blocks: dict[object, _Block] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)
    block_size: int | None = None
    int_hashes: bool | None = None
    num_batches: int = 0
    num_events: int = 0
    next_block_id: int = 1
    _next_req: int = 0
    # Trace lines so far, spooled to disk: a long stream is never held in memory.
    _spool: object = None
    _tagged: bool = True
    num_lines: int = 0
    _max_seq: int = -1

    def __post_init__(self) -> None:
        self._tagged = get_profile(self.vllm_version).tagged_extra_keys
        self._spool = tempfile.TemporaryFile()

    # -- one batch -----------------------------------------------------------------------

    def add_batch(self, batch: EventBatch) -> list[dict]:
        """The trace events for one published batch (also kept for `write`)."""
        out: list[dict] = []
        kept: list[dict] = []
        for ev in batch.events:
            self.num_events += 1
            kind = ev["type"]
            reason = None
            if ev.get("group_idx", 0) != 0:
                reason = "KV cache group other than 0"
            elif kind == "BlockStored":
                reason = self._stored(ev, out)
            elif kind == "BlockRemoved":
                reason = self._removed(ev, out)
            else:
                out.append({"op": "reset_prefix_cache"})
                self.blocks.clear()
            if reason is None:
                kept.append(ev)
            else:
                self.skipped[reason] += 1
        self._max_seq = max(self._max_seq, batch.seq)
        if kept:
            out.append({"op": "checkpoint", "fields": ["events"], "answer": {"events": kept},
                        "note": f"KV event batch seq {batch.seq} (ts {batch.ts:.6f})"})
        self.num_batches += 1
        for line in out:
            self._spool.write(encode_line(line))
        self.num_lines += len(out)
        return out

    def _stored(self, ev: dict, out: list[dict]) -> str | None:
        hashes = ev.get("block_hashes") or []
        size = ev.get("block_size")
        if self.block_size is None:
            self.block_size = size
        elif size != self.block_size:
            return "block size differs from the stream's first"
        if self.int_hashes is None and hashes:
            self.int_hashes = isinstance(hashes[0], int)
        tokens = ev.get("token_ids") or []
        if not hashes or len(tokens) != len(hashes) * size:
            return "BlockStored without one block of tokens per hash"
        parent = ev.get("parent_block_hash")
        if parent is not None and parent not in self.blocks:
            # Its blocks stay unknown, so their children and removals are left out too.
            return "parent stored before the stream began (or left out)"
        if any(h in self.blocks for h in hashes):
            for h in hashes:
                if h in self.blocks:
                    self.blocks[h].copies += 1
            return "a copy of a block already cached"
        # Published extra keys, per block and untagged: (mm identifier, offset)
        # pairs, the LoRA name, the cache salt (a request's first block only)
        # and prompt-embedding digests (every block of such a request).
        extra = ev.get("extra_keys") or [None] * len(hashes)
        lora_name = ev.get("lora_name")
        salt = self.blocks[parent].salt if parent is not None else None
        for i, keys in enumerate(extra):
            others = [k for k in keys or () if k != lora_name]
            if any(not isinstance(k, str) for k in others):
                return "multimodal block (placeholder lengths are not published)"
            first_block = parent is None and i == 0
            if len(others) > (1 if first_block else 0):
                return "prompt-embedding block (embeddings are not published)"
            if first_block and others:
                salt = others[0]
        lora = None
        if lora_name is not None:
            path = self.lora_paths.get(lora_name)
            if self._tagged and path is None:
                return "LoRA block without --lora-path (0.32 hashes the adapter path)"
            lora = {"name": lora_name, "int_id": ev.get("lora_id") or 1}
            if path:
                lora["path"] = path
        prefix = self._chain_tokens(parent)
        req = f"e{self._next_req}"
        self._next_req += 1
        add: dict = {"op": "add_request", "req": req, "prompt": prefix + list(tokens)}
        if lora is not None:
            add["lora"] = lora
        if salt is not None:
            add["cache_salt"] = salt
        if ev.get("session_id") is not None:
            add["session_id"] = ev["session_id"]
        out.append(add)
        out.append({"op": "lookup", "req": req})
        out.append({"op": "allocate", "req": req, "num_new_tokens": len(tokens)})
        out.append({"op": "free", "req": req})
        prev = parent
        for i, h in enumerate(hashes):
            self.blocks[h] = _Block(self.next_block_id, prev, tokens[i * size:(i + 1) * size],
                                    salt)
            self.next_block_id += 1
            prev = h
        return None

    def _removed(self, ev: dict, out: list[dict]) -> str | None:
        ids = []
        for h in ev.get("block_hashes") or []:
            b = self.blocks.get(h)
            if b is None:
                return "removal of a block stored before the stream began (or skipped)"
            if b.copies > 1:
                b.copies -= 1
                return "removal of one of two copies of a block"
            ids.append(b.block_id)
            del self.blocks[h]
        out.append({"op": "evict_blocks", "block_ids": ids})
        return None

    def _chain_tokens(self, h) -> list[int]:
        parts = []
        while h is not None:
            b = self.blocks[h]
            parts.append(b.tokens)
            h = b.parent
        out: list[int] = []
        for p in reversed(parts):
            out += p
        return out

    def missed_batches(self) -> int:
        """Sequence numbers never seen between 0 and the last batch received."""
        return self._max_seq + 1 - self.num_batches if self._max_seq >= 0 else 0

    # -- the trace -----------------------------------------------------------------------------

    def header(self, description: str) -> TraceHeader:
        cache = CacheConfig(
            num_blocks=max(self.next_block_id + 1, 2),
            groups=(GroupConfig(self.block_size or 16),),
            hash_algo=self.hash_algo,
            hash_seed=self.hash_seed,
            max_model_len=1 << 24,
            events_use_int_hashes=self.int_hashes if self.int_hashes is not None else True,
        )
        return TraceHeader(self.vllm_version, "production", cache, description)

    def write(self, out: str, description: str) -> int:
        """Write the trace (header sized now that the whole stream is known)."""
        sink = JsonlSink(out, self.header(description))
        try:
            self._spool.seek(0)
            for raw in self._spool:
                sink.write_raw(raw)
        except BaseException:
            sink.abort()
            raise
        sink.close()
        return sink.num_events


class StreamFile:
    """The raw stream as it arrives, one JSON line per batch (seq, ts, rank,
    encoding, events), flushed per batch: what a capture saw survives the
    subscriber, and rebuilds the trace later (--from-stream) with other hash
    settings."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._f = open(path, "w")

    def write(self, b: EventBatch) -> None:
        self._f.write(json.dumps({"seq": b.seq, "ts": b.ts, "rank": b.data_parallel_rank,
                                  "encoding": b.encoding, "events": b.events}) + "\n")
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def remove(self) -> None:
        self.close()
        if os.path.exists(self.path):
            os.remove(self.path)


def read_stream(path: str) -> Iterator[EventBatch]:
    """The batches of a saved stream (StreamFile); StreamError names a bad line."""
    from harness.capture.kv_event_stream import StreamError, batch_problem

    try:
        f = open(path)
    except OSError as e:
        raise StreamError(f"{path}:0: (file): {e.strerror}") from None
    with f:
        for n, line in enumerate(f, 1):
            try:
                d = json.loads(line)
                batch = EventBatch(d["seq"], d["ts"], d["events"], d.get("rank"),
                                   d.get("encoding", "map"))
            except (ValueError, KeyError, TypeError, RecursionError) as e:
                raise StreamError(f"{path}:{n}: (line): not a saved batch ({e})") from None
            problem = batch_problem(batch)
            if problem is not None:
                raise StreamError(f"{path}:{n}: {problem}")
            yield batch

