"""Record every call a vLLM scheduler makes on its KVCacheManager, with the answer.

`instrument(manager, recorder)` swaps the live manager's class for a subclass
whose methods call vLLM's own and then report call and answer to the recorder.
The manager keeps its state and identity, so the scheduler (or a running
server) notices nothing; the recorder turns the calls into trace events, in
call order, normalised exactly as harness/backends/ normalise answers, so that a
replay compares them with ==.

What the trace cannot say is refused loudly (CaptureGap) rather than recorded
wrong: a strict recorder raises it, a lenient one (the server plugin) ends the
trace before the call, logs why, and lets vLLM carry on.

Request state the trace's backends derive (requests, tokens, computed tokens)
is mirrored here, and checked against vLLM's own request at every allocation,
so a capture that a replay could not reproduce fails at the call that broke it.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from harness.capture.errors import CaptureGap

log = logging.getLogger("kvconform.capture")

# Allocate's optional fields and their defaults (harness/core/events.py).
_ALLOCATE_DEFAULTS = {
    "num_lookahead_tokens": 0, "num_external_computed_tokens": 0,
    "delay_cache_blocks": False, "num_encoder_tokens": 0,
    "full_sequence_must_fit": False, "reserved_blocks": 0, "has_scheduled_reqs": True,
}
_STATS_FIELDS = ("requests", "queries", "hits", "preempted_requests", "preempted_queries",
                 "preempted_hits", "reset")


class Sink(Protocol):
    """Takes each event in its JSON form (harness/trace/codec.py's canonical
    form: fields at their default left out, `answer` last)."""

    def write(self, obj: dict) -> None: ...

    def commit(self) -> None:
        """A request finished: what was written must be durable before vLLM
        answers it (a server's sink writes it out; a file sink may wait)."""

    def close(self) -> None: ...


_STEP = {"op": "step", "answer": {}}


def _say(message: str) -> None:
    """A line on stderr: a server's loggers have no handler for ours."""
    print(message, file=sys.stderr, flush=True)


@dataclass(slots=True)
class _Tracked:
    """A request as the trace's backends will know it."""

    request: Any
    known_tokens: int
    known_hashes: int
    # Whether vLLM hashes this request (only with prefix caching or a connector).
    hashed: bool = True
    # Advanced as a replaying backend advances it (harness/core/events.py).
    num_computed: int = 0
    # The hit of a lookup not yet adopted by an allocation.
    pending_hit: int | None = None
    pending_ids: list | None = None


@dataclass(slots=True)
class Recorder:
    sink: Sink
    # The block size prompts are hashed in (the trace header's hash block size).
    hash_block_size: int
    # Raise CaptureGap (capture tools) or end the trace and carry on (plugin).
    strict: bool = True
    # After each free and preemption, also record the free queue (O(pool size)
    # per call: worth it for golden traces, too dear for a busy server).
    free_queue_checkpoints: bool = False
    # Called with the step number at each step boundary (attention tensors).
    step_callback: Callable[[int], None] | None = None
    # Lookup answers carry vLLM's shared-prefix boundary (the header's
    # CacheConfig.reports_shared_prefix_boundary).
    report_shared_prefix_boundary: bool = False
    active: bool = True
    num_steps: int = 0
    manager: Any = None
    gap: str | None = None
    requests: dict[str, _Tracked] = field(default_factory=dict)
    _last_usage: float | None = None

    # -- life cycle -------------------------------------------------------------------

    def stop(self, reason: str | None = None) -> None:
        """End the trace (it stays valid: a prefix of the calls)."""
        if not self.active:
            return
        self.active = False
        self.gap = self.gap or reason
        self.sink.close()

    def fail(self, message: str):
        """The call cannot be recorded: raise CaptureGap (a lenient recorder's
        `call` turns it into the end of the trace)."""
        self.gap = message
        raise CaptureGap(message)

    def call(self, hook, *args, **kwargs):
        """Run a recording hook. A lenient recorder must never break the
        server it watches: a gap or an unexpected error ends the trace instead."""
        if self.strict:
            return hook(*args, **kwargs)
        try:
            return hook(*args, **kwargs)
        except CaptureGap as e:
            _say(f"kvconform capture stopped: {e} (the trace ends before this call)")
            self.stop(str(e))
        except Exception as e:  # noqa: BLE001 - any bug here must not reach vLLM
            log.debug("kvconform capture: internal error", exc_info=True)
            _say(f"kvconform capture stopped by an internal error: {e!r} (the trace ends "
                 "before this call)")
            self.stop(f"internal error: {e!r}")
        return None

    def final_checkpoint(self) -> None:
        """Observe everything once more (drains stats and KV events), then
        pending output tokens, so the trace ends with the full state."""
        if not self.active:
            return
        for t in self.requests.values():
            self._flush_tokens(t)
        m, base = self.manager, type(self.manager).__mro__[1]
        answer = {
            "free_queue": self._free_queue(),
            "num_free": m.block_pool.get_num_free_blocks(),
            "usage": base.usage.fget(m),
            "stats": _stats_json(base.make_prefix_cache_stats(m)),
            "events": _events_json(base.take_events(m)),
        }
        self.sink.write({"op": "checkpoint", "answer": answer})

    # -- requests -----------------------------------------------------------------------

    def _track(self, request) -> _Tracked:
        """The request's trace state; its arrival is recorded at first sight."""
        rid = request.request_id
        t = self.requests.get(rid)
        if t is not None and t.request is request:
            if request.num_tokens != t.known_tokens:
                self._flush_tokens(t)
            return t
        if t is not None:
            self.fail(f"request id '{rid}' reused while the first is still live")
        if getattr(request, "prompt_embeds", None) is not None:
            self.fail(f"request '{rid}' has prompt embeddings; traces carry only "
                      "seeded ones, so its hashes could not be replayed")
        prompt = list(request.prompt_token_ids or ())
        if not prompt:
            self.fail(f"request '{rid}' has no prompt token ids")
        ev: dict[str, Any] = {"op": "add_request", "req": rid, "prompt": prompt}
        lr = getattr(request, "lora_request", None)
        if lr is not None:
            ev["lora"] = {"name": lr.lora_name, "int_id": lr.lora_int_id}
            if getattr(lr, "lora_path", ""):
                ev["lora"]["path"] = lr.lora_path
        salt = getattr(request, "cache_salt", None)
        if salt is not None:
            ev["cache_salt"] = salt
        features = getattr(request, "mm_features", None)
        if features:
            ev["mm"] = [{"identifier": str(f.identifier), "offset": f.mm_position.offset,
                         "length": f.mm_position.length} for f in features]
        if getattr(request, "skip_reading_prefix_cache", False):
            ev["skip_reading_prefix_cache"] = True
        session_id = getattr(request, "session_id", None)
        if session_id is not None:
            ev["session_id"] = session_id
        report = getattr(request, "kv_cache_report_mode", "incremental")
        if report != "incremental":
            ev["kv_cache_report_mode"] = report
        hashed = getattr(request, "_block_hasher", None) is not None
        num_prompt_hashes = len(prompt) // self.hash_block_size if hashed else 0
        # The engine hashes a request only with prefix caching (or a KV
        # connector) on; a replay always hashes, so unhashed answers are left out.
        if hashed:
            ev["answer"] = {"block_hashes": [h.hex() for h in
                                             request.block_hashes[:num_prompt_hashes]]}
        self.sink.write(ev)
        t = _Tracked(request, len(prompt), num_prompt_hashes, hashed)
        self.requests[rid] = t
        self._flush_tokens(t)
        return t

    def _flush_tokens(self, t: _Tracked) -> None:
        """Output tokens vLLM appended since the request was last seen."""
        request = t.request
        n = request.num_tokens
        if n == t.known_tokens:
            return
        if n < t.known_tokens:
            self.fail(f"request '{request.request_id}' lost tokens ({t.known_tokens} -> {n}); "
                      "the trace has no event for removing tokens")
        ev = {"op": "append_tokens", "req": request.request_id,
              "tokens": list(request.all_token_ids[t.known_tokens:n])}
        if t.hashed:
            hashes = request.block_hashes
            k = t.known_hashes
            ev["answer"] = {"block_hashes": [h.hex() for h in hashes[k:]]
                            if len(hashes) > k else []}
            t.known_hashes = len(hashes)
        self.sink.write(ev)
        t.known_tokens = n

    # -- the calls ----------------------------------------------------------------------

    # The hooks: harness/capture/recorder.py's _BEFORE hooks take the call's
    # arguments, _AFTER hooks vLLM's result and then the arguments.

    def on_lookup(self, result, request) -> None:
        blocks, hit_tokens = result[0], result[1]  # 0.26+ add a third item
        t = self._track(request)
        ids = [list(g) for g in blocks.get_block_ids()]
        answer = {"hit_tokens": hit_tokens, "block_ids": ids}
        if self.report_shared_prefix_boundary and len(result) > 2 and result[2]:
            answer["shared_prefix_boundary"] = result[2]
        self.sink.write({"op": "lookup", "req": request.request_id, "answer": answer})
        t.pending_hit, t.pending_ids = hit_tokens, ids

    def on_connector_lookup(self, result, request) -> None:
        """get_computed_blocks_for_connector: a lookup with for_connector (its
        inner plain lookup, where it falls back to one, is not recorded)."""
        blocks, hit_tokens, boundary, diverged = result
        t = self._track(request)
        ids = [list(g) for g in blocks.get_block_ids()]
        answer = {"hit_tokens": hit_tokens, "block_ids": ids}
        if self.report_shared_prefix_boundary and boundary:
            answer["shared_prefix_boundary"] = boundary
        answer["hit_diverged"] = bool(diverged)
        self.sink.write({"op": "lookup", "req": request.request_id, "for_connector": True,
                         "answer": answer})
        t.pending_hit, t.pending_ids = hit_tokens, ids

    def on_truncate(self, result, blocks, num_computed_tokens) -> None:
        """truncate_computed_blocks names no request: it cuts the pending hit
        of the request whose lookup answered these blocks."""
        ids = [list(g) for g in blocks.get_block_ids()]
        owners = [rid for rid, t in self.requests.items()
                  if t.pending_hit is not None and t.pending_ids == ids]
        if len(owners) != 1:
            self.fail(f"truncate_computed_blocks on blocks {ids}: "
                      f"{'no' if not owners else 'more than one'} request's pending lookup "
                      "answered them")
        t = self.requests[owners[0]]
        cut = [list(g) for g in result.get_block_ids()]
        self.sink.write({"op": "truncate_computed_blocks", "req": owners[0],
                         "num_computed_tokens": num_computed_tokens,
                         "answer": {"block_ids": cut}})
        t.pending_hit, t.pending_ids = num_computed_tokens, cut

    def before_allocate(self, args: dict) -> _Tracked:
        request = args["request"]
        t = self._track(request)
        rid = request.request_id
        if request.num_computed_tokens != t.num_computed:
            self.fail(f"allocate_slots for '{rid}': vLLM's request has "
                      f"{request.num_computed_tokens} computed tokens, a replay would have "
                      f"{t.num_computed} (speculative decoding or a KV connector?)")
        hit = args.get("num_new_computed_tokens", 0) or 0
        blocks = args.get("new_computed_blocks")
        ids = [list(g) for g in blocks.get_block_ids()] if blocks is not None else None
        if t.pending_hit is None:
            if hit or (ids and any(ids)):
                self.fail(f"allocate_slots for '{rid}' adopts {hit} cached tokens "
                          "without a lookup")
        elif hit != t.pending_hit or (ids is not None and any(ids) and ids != t.pending_ids):
            self.fail(f"allocate_slots for '{rid}' adopts {hit} tokens / blocks {ids}, "
                      f"not its lookup's {t.pending_hit} / {t.pending_ids}")
        if args.get("skip_zeroing_group_ids"):
            self.fail("allocate_slots with skip_zeroing_group_ids (a KV connector load)")
        return t

    def on_allocate(self, t: _Tracked, args: dict, new_blocks) -> None:
        num_new = args["num_new_tokens"]
        ev: dict[str, Any] = {"op": "allocate", "req": args["request"].request_id,
                              "num_new_tokens": num_new}
        # Allocate's optional fields that were passed with another value than
        # the default (the scheduler passes few of them for a running request).
        defaults = _ALLOCATE_DEFAULTS
        for name, value in args.items():
            if name in defaults and value != defaults[name]:
                ev[name] = value
        hit = t.pending_hit or 0
        t.pending_hit = t.pending_ids = None
        if new_blocks is None:
            ev["answer"] = {"refused": True}
            self.sink.write(ev)
            return
        ev["answer"] = {"block_ids": [[b.block_id for b in g] for g in new_blocks.blocks]}
        self.sink.write(ev)
        t.num_computed += hit + args.get("num_external_computed_tokens", 0) + num_new

    def on_record_stats(self, request, num_hits: int) -> None:
        self._track(request)
        self.sink.write({"op": "record_stats", "req": request.request_id, "num_hits": num_hits,
                         "answer": {}})

    def on_free(self, request) -> None:
        """A finished request is freed; a running one freed is being preempted."""
        rid = request.request_id
        t = self._track(request)
        if request.is_finished():
            self.sink.write({"op": "free", "req": rid, "answer": {}})
            del self.requests[rid]
        elif request.status.name == "RUNNING":
            self.sink.write({"op": "preempt", "req": rid, "answer": {}})
            t.num_computed = 0
            t.pending_hit = t.pending_ids = None
        else:
            self.fail(f"free of '{rid}' in status {request.status.name}: neither a finished "
                      "request nor a preemption")
        if self.free_queue_checkpoints:
            self.sink.write({"op": "checkpoint", "fields": ["free_queue", "num_free"], "answer": {
                "free_queue": self._free_queue(),
                "num_free": self.manager.block_pool.get_num_free_blocks()}})
        if rid not in self.requests:
            # Finished: on disk before vLLM hands the output to the client.
            self.sink.commit()

    def on_cache_blocks(self, request, num_computed_tokens: int) -> None:
        self._track(request)
        self.sink.write({"op": "cache_blocks", "req": request.request_id,
                         "num_computed_tokens": num_computed_tokens, "answer": {}})

    def on_reset(self, ok: bool) -> None:
        self.sink.write({"op": "reset_prefix_cache", "answer": {"ok": bool(ok)}})

    def on_evict(self, block_ids) -> None:
        ids = list(block_ids)
        if ids:
            self.sink.write({"op": "evict_blocks", "block_ids": ids, "answer": {}})

    def on_step(self) -> None:
        # Output tokens are flushed lazily, before the next call that involves
        # their request (all of them: vLLM reads no request it is not given).
        self.sink.write(_STEP)
        self.num_steps += 1
        if self.step_callback is not None:
            self.step_callback(self.num_steps)

    def on_take_events(self, events) -> None:
        # Draining nothing changes nothing; only drains that return events are
        # recorded, which keeps traces of long idle stretches small.
        if events:
            self.sink.write({"op": "checkpoint", "fields": ["events"],
                             "answer": {"events": _events_json(events)}})

    def on_block_copies(self, result) -> None:
        copies = result[0]
        # take_kv_cache_block_copies drains the copy-on-write copies that hits
        # ending inside a block queued (0.32 hybrid models whose hash block is
        # smaller than a group's block); the scheduler frees the blocks they
        # retained at once (deferred only with a KV connector, which the
        # recorder refuses). An empty drain changes nothing and is left out.
        if copies:
            self.sink.write({"op": "take_block_copies", "answer": {
                "copies": [[c.src_block_id, c.dst_block_id] for c in copies]}})

    def on_boundary_offloads(self, offers) -> None:
        # Mamba "align" states offered to a connector, drained every schedule
        # pass (0.29+); an empty drain changes nothing and is left out.
        if offers:
            self.sink.write({"op": "take_boundary_state_offloads", "answer": {"offloads": {
                req: [list(o) for o in offered] for req, offered in offers.items()}}})

    def on_finalize_tails(self, offers, request) -> None:
        self._track(request)
        self.sink.write({"op": "finalize_partial_tail_offloads", "req": request.request_id,
                         "answer": {"offloads": [list(o) for o in offers]}})

    def on_stats(self, stats) -> None:
        out = _stats_json(stats)
        if out is not None and any(out.values()):
            self.sink.write({"op": "checkpoint", "fields": ["stats"], "answer": {"stats": out}})

    def on_usage(self, usage: float) -> None:
        if usage != self._last_usage:
            self._last_usage = usage
            self.sink.write({"op": "checkpoint", "fields": ["usage"], "answer": {"usage": usage}})

    def _free_queue(self) -> list[int]:
        queue = self.manager.block_pool.free_block_queue
        return [b.block_id for b in queue.get_all_free_blocks()]


def _plain(value: Any) -> Any:
    """jsonable() (harness/backends/base.py) with a fast path for the lists of
    ints (token ids, int block hashes) that make up most of a KV event."""
    t = type(value)
    if t is list:
        if not value or type(value[0]) is int:
            return value
        return [_plain(v) for v in value]
    if t is bytes:
        return value.hex()
    if t is tuple:
        return [_plain(v) for v in value]
    if t is dict:
        return {k: _plain(v) for k, v in value.items()}
    return value


def _events_json(events) -> list[dict]:
    """KV events as the backends answer them (kv_event_json: None fields left out)."""
    out = []
    for e in events:
        d = {"type": type(e).__name__}
        for name in e.__struct_fields__:
            v = getattr(e, name)
            if v is not None:
                d[name] = _plain(v)
        out.append(d)
    return out


def _stats_json(stats) -> dict | None:
    if stats is None:
        return None
    return {k: getattr(stats, k) for k in _STATS_FIELDS}


# -- instrumentation ---------------------------------------------------------------------

_CLASSES: dict[type, type] = {}
_CONNECTOR_ONLY = ("pop_blocks_for_free",)


def instrument(manager, recorder: Recorder) -> None:
    """Record `manager`'s calls from now on (it must not have served any yet)."""
    base = type(manager)
    if base in _CLASSES.values():
        raise RuntimeError("this KVCacheManager is already instrumented")
    cls = _CLASSES.get(base)
    if cls is None:
        cls = _CLASSES[base] = _recording_class(base)
    recorder.manager = manager
    manager._kvconform_recorder = recorder
    manager.__class__ = cls
    if getattr(manager.kv_cache_config, "hisparse_host_num_blocks", None) is not None:
        # The header states the HiSparse groups, but the calls of its
        # connector (hisparse_step / hisparse_ack) are not recorded: a trace
        # without them would not replay, so it ends after the header.
        recorder.call(recorder.fail, "HiSparse: its connector's per-step calls are not "
                      "recorded (the trace holds the header only)")


def uninstrument(manager) -> None:
    cls = type(manager)
    if cls in _CLASSES.values():
        manager.__class__ = cls.__mro__[1]


def _arg_binder(fn) -> Callable[[tuple, dict], dict]:
    """args/kwargs -> {parameter: value} with defaults, for a method whose
    signature differs between vLLM releases (cheaper than inspect's bind)."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    names = [p.name for p in params]
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}

    def bind(args: tuple, kwargs: dict) -> dict:
        out = dict(defaults)
        out.update(zip(names, args))
        out.update(kwargs)
        return out

    return bind


# vLLM's KVCacheManager methods a recording manager wraps, and the Recorder hook
# each one calls. _BEFORE hooks see the call's arguments before vLLM runs it
# (they must precede what the call changes); _AFTER hooks see vLLM's result,
# then the arguments. allocate_slots, free and the `usage` property are
# written out below (they need both sides, or are a property).
_BEFORE = {
    "record_prefix_cache_stats": "on_record_stats",  # 0.32+
    "cache_blocks": "on_cache_blocks",
    "evict_blocks": "on_evict",
    "new_step_starts": "on_step",
}
_AFTER = {
    "get_computed_blocks": "on_lookup",
    "reset_prefix_cache": "on_reset",
    "take_events": "on_take_events",
    "take_kv_cache_block_copies": "on_block_copies",  # 0.32+
    "take_boundary_state_offloads": "on_boundary_offloads",  # 0.29+
    "finalize_partial_tail_offloads": "on_finalize_tails",  # 0.30+
    "make_prefix_cache_stats": "on_stats",
    "truncate_computed_blocks": "on_truncate",  # 0.27+
}


def _before(original, hook: str):
    def method(self, *args, **kwargs):
        r = self._kvconform_recorder
        if r.active:
            r.call(getattr(r, hook), *args, **kwargs)
        return original(self, *args, **kwargs)

    method.__name__ = original.__name__
    return method


def _after(original, hook: str):
    def method(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        r = self._kvconform_recorder
        if r.active:
            r.call(getattr(r, hook), result, *args, **kwargs)
        return result

    method.__name__ = original.__name__
    return method


def _connector_lookup(original):
    """get_computed_blocks_for_connector, recorded as one lookup: the plain
    lookup it may make inside is vLLM's, not the scheduler's."""
    def method(self, *args, **kwargs):
        r = self._kvconform_recorder
        if not r.active:
            return original(self, *args, **kwargs)
        r.active = False
        try:
            result = original(self, *args, **kwargs)
        finally:
            r.active = True
        r.call(r.on_connector_lookup, result, *args, **kwargs)
        return result

    method.__name__ = original.__name__
    return method


def _refusing(original):
    name = original.__name__

    def method(self, *args, **kwargs):
        r = self._kvconform_recorder
        if r.active:
            r.call(r.fail, f"{name} (used with KV connectors) has no trace event")
        return original(self, *args, **kwargs)

    method.__name__ = name
    return method


def _recording_class(base: type) -> type:
    bind_alloc = _arg_binder(base.allocate_slots)

    def allocate_slots(self, *args, **kwargs):
        r = self._kvconform_recorder
        if not r.active:
            return base.allocate_slots(self, *args, **kwargs)
        # The scheduler passes (request, num_new_tokens) and keywords: no binding.
        if len(args) == 2:
            bound = dict(kwargs, request=args[0], num_new_tokens=args[1])
        else:
            bound = bind_alloc(args, kwargs)
        t = r.call(r.before_allocate, bound)
        new = base.allocate_slots(self, *args, **kwargs)
        if r.active:
            r.call(r.on_allocate, t, bound, new)
        return new

    def free(self, request):
        r = self._kvconform_recorder
        if r.active:
            r.call(r._track, request)  # arrival and pending tokens go before the free
        out = base.free(self, request)
        if r.active:
            r.call(r.on_free, request)
        return out

    def usage(self):
        u = base.usage.fget(self)
        r = self._kvconform_recorder
        if r.active:
            r.call(r.on_usage, u)
        return u

    ns: dict[str, Any] = {"allocate_slots": allocate_slots, "free": free,
                          "usage": property(usage)}
    for table, wrap in ((_BEFORE, _before), (_AFTER, _after)):
        for name, hook in table.items():
            if hasattr(base, name):
                ns[name] = wrap(getattr(base, name), hook)
    if hasattr(base, "get_computed_blocks_for_connector"):  # 0.27+
        ns["get_computed_blocks_for_connector"] = _connector_lookup(
            base.get_computed_blocks_for_connector)
    for name in _CONNECTOR_ONLY:
        if hasattr(base, name):
            ns[name] = _refusing(getattr(base, name))
    return type(f"Recording{base.__name__}", (base,), ns)
