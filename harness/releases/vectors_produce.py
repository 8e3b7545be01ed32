"""The golden vectors of whatever vLLM this process imports (one release: its
overlay first on the module path, or the installed vLLM), from its own code:
its block hasher and NONE_HASH, its KV cache manager's events, and its ZMQ
publisher's bytes. specs/VECTORS.md is the format.

    PYTHONPATH=.vllm-0.25.1:. python -m harness.releases.vectors_produce OUT [VERSION]

(VERSION: refuse, before any work, unless that is the release imported)
writes OUT/hashes.json and OUT/events.json and prints one line
`kvconform-vectors: {"vllm", "files": {name: bytes}, "seconds"}`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from harness.backends.base import BackendError, kv_event_json
from harness.releases import vectors_corpus as corpus
from harness.releases import vectors_format as fmt
from harness.trace.codec import cache_to_dict, event_to_dict

MARKER = "kvconform-vectors: "
_ENDPOINT = "inproc://kvconform-vectors"
_REPLAY = "inproc://kvconform-vectors-replay"
# Waiting for the publisher thread to send a batch (it polls every 0.1 s).
_RECV_TIMEOUT_MS = 10_000


class ProduceError(RuntimeError):
    """The release's code did not give what a vector needs (environment: exit 3)."""


def _backend(config):
    from harness.backends.vllm_backend import VllmBackend

    return VllmBackend(config, any_release=True)


def _profile_name(version: str) -> str | None:
    from impl.profiles import UnsupportedVersion, get_profile

    try:
        return get_profile(version).name
    except UnsupportedVersion:
        return None


# -- hashes -------------------------------------------------------------------------


def _algorithms() -> list[str]:
    """The corpus's algorithms this release knows by name."""
    from vllm.utils.hashing import get_hash_fn_by_name

    known = []
    for name in corpus.ALGORITHMS:
        try:
            get_hash_fn_by_name(name)
        except (ValueError, KeyError, ImportError):
            continue
        known.append(name)
    return known


def _none_hashes(algorithms: list[str]) -> dict:
    """Each algorithm's NONE_HASH per mode, as the release derives it; an
    unseeded one that two derivations disagree on is random (null)."""
    from harness.core.cache_config import CacheConfig

    out = {}
    for algo in algorithms:
        row = {}
        for mode in corpus.NONE_HASH_MODES:
            config = CacheConfig(num_blocks=4, hash_algo=algo, hash_seed=corpus.seed_of(mode))
            first = _backend(config).none_hash
            again = _backend(config).none_hash
            row[mode] = first if first == again else None
        out[algo] = row
    return out


def _hash_case(case: corpus.HashCase, none_hash: str) -> dict | None:
    """The case's inputs and the release's block hashes; None when the
    release cannot hash its keys (lookahead before 0.33)."""
    try:
        backend = _backend(corpus.hash_config(case))
    except BackendError:
        return None
    request = corpus.hash_request(case)
    hashes = backend.run(request)["block_hashes"]
    if backend.none_hash != none_hash:
        raise ProduceError(f"{case.id}: NONE_HASH {backend.none_hash} is not the "
                           f"{case.none_hash} one ({none_hash})")
    out: dict = {"id": case.id, "algorithm": case.algorithm, "none_hash": case.none_hash,
                 "block_size": corpus.BLOCK_SIZE, "tokens": request.prompt}
    if request.lora is not None:
        lo = request.lora
        out["lora"] = {"name": lo.name, "int_id": lo.int_id, "path": lo.path}
    if request.cache_salt is not None:
        out["cache_salt"] = request.cache_salt
    if request.mm:
        out["mm"] = [{"identifier": m.identifier, "offset": m.offset, "length": m.length}
                     for m in request.mm]
    if request.prompt_embeds is not None:
        emb = request.prompt_embeds
        out["prompt_embeds"] = {"dim": emb.dim, "seed": emb.seed, "dtype": "float32",
                                "bytes": emb.to_bytes(len(request.prompt)).hex()}
    lookahead = corpus.hash_config(case).num_hash_lookahead_tokens
    if lookahead:
        out["lookahead"] = lookahead
    out["block_hashes"] = hashes
    return out


def hashes_doc(version: str) -> dict:
    algorithms = _algorithms()
    none_hash = _none_hashes(algorithms)
    cases, unavailable = [], []
    for case in corpus.hash_cases():
        value = none_hash.get(case.algorithm, {}).get(case.none_hash)
        if case.algorithm not in algorithms or value is None:
            continue  # no such algorithm, or a random NONE_HASH: nothing to reproduce
        done = _hash_case(case, value)
        if done is None:
            unavailable.append(case.keys)
            continue
        cases.append(done)
    return {
        "format": fmt.FORMAT, "kind": "block_hashes", "vllm": version,
        "profile": _profile_name(version),
        "algorithms": algorithms,
        "seeds": {"seeded": corpus.SEED, "unseeded": None, "fixed": corpus.FIXED_SEED},
        "none_hash": none_hash,
        "unavailable_keys": sorted(set(unavailable)),
        "cases": cases,
    }


# -- KV events ------------------------------------------------------------------------


def _wire_schema() -> dict:
    """The event structs' layout and fields, read from the release's classes."""
    import msgspec
    from vllm.distributed import kv_events as ke

    def fields(cls) -> list[dict]:
        return [{"name": f.encode_name, "required": f.required}
                for f in msgspec.structs.fields(cls)]

    stored_cfg = ke.BlockStored.__struct_config__
    batch_cfg = ke.KVEventBatch.__struct_config__
    return {
        "layout": "array" if stored_cfg.array_like else "map",
        "tag_field": stored_cfg.tag_field,
        "events": {cls.__name__: fields(cls)
                   for cls in (ke.BlockStored, ke.BlockRemoved, ke.AllBlocksCleared)},
        "batch": {"layout": "array" if batch_cfg.array_like else "map",
                  "fields": fields(ke.KVEventBatch)},
    }


def _run_trace(trace: corpus.EventTrace) -> list[list] | str:
    """Per step, the release's raw events; or why the release cannot run it."""
    try:
        backend = _backend(trace.cache)
        steps = []
        for step in trace.steps:
            for event in step:
                backend.run(event)
            steps.append(list(backend.manager.take_events()))
    except BackendError as e:
        return str(e)
    return steps


class _Wire:
    """The release's own ZmqEventPublisher, and a subscriber reading what it sends."""

    def __init__(self) -> None:
        import zmq
        from vllm.distributed.kv_events import ZmqEventPublisher

        self._zmq = zmq
        self.publisher = ZmqEventPublisher(0, endpoint=_ENDPOINT, replay_endpoint=_REPLAY,
                                           topic=corpus.TOPIC)
        self.sub = zmq.Context.instance().socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(_ENDPOINT)

    def send(self, ts: float, events: list) -> tuple[int, bytes, list[bytes]]:
        """Publish one batch; (seq, payload, frames) as a subscriber gets them."""
        from vllm.distributed.kv_events import KVEventBatch

        self.publisher.publish(KVEventBatch(ts=ts, events=events))
        if not self.sub.poll(_RECV_TIMEOUT_MS):
            raise ProduceError("the release's ZMQ publisher sent nothing")
        frames = self.sub.recv_multipart()
        return int.from_bytes(frames[1], "big"), frames[-1], frames

    def replay_frames(self) -> list[str]:
        """The frames of one message of the replay socket, described."""
        zmq = self._zmq
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.connect(_REPLAY)
        try:
            dealer.send_multipart((b"", (0).to_bytes(8, "big")))
            if not dealer.poll(_RECV_TIMEOUT_MS):
                raise ProduceError("the release's replay socket did not answer")
            frames = dealer.recv_multipart()
        finally:
            dealer.close(linger=0)
        return _describe(frames)

    def close(self) -> None:
        self.sub.close(linger=0)
        self.publisher.shutdown()


def _describe(frames: list[bytes]) -> list[str]:
    """A message's frames by what they hold (specs/VECTORS.md)."""
    names = []
    for i, f in enumerate(frames):
        if i == len(frames) - 1:
            names.append("payload")
        elif i == len(frames) - 2:
            names.append("seq")
        elif f == corpus.TOPIC.encode():
            names.append("topic")
        else:
            names.append("empty" if not f else "?")
    return names


def events_doc(version: str) -> dict:
    wire_schema = _wire_schema()
    wire = _Wire()
    traces, skipped = [], []
    ts = 0.0
    publish_frames = None
    try:
        for trace, as_int in corpus.event_traces():
            steps = _run_trace(trace)
            name = trace.name + ("" if as_int else "/bytes")
            if isinstance(steps, str):
                skipped.append({"name": name, "reason": steps})
                continue
            rows = []
            for calls, raw in zip(trace.steps, steps):
                row: dict = {"calls": [event_to_dict(e) for e in calls]}
                if raw:
                    ts += 1.0
                    seq, payload, frames = wire.send(ts, raw)
                    publish_frames = publish_frames or _describe(frames)
                    decoded = fmt.decode_batch(payload)
                    named = [fmt.named_event(wire_schema, e) for e in decoded[1]]
                    own = [kv_event_json(type(e).__name__, _struct_fields(e)) for e in raw]
                    if named != own:
                        raise ProduceError(f"{name}: the wire bytes do not decode to the "
                                           "release's events")
                    row.update(seq=seq, wire=payload.hex(), decoded=fmt.hexed(decoded),
                               events=named)
                rows.append(row)
            traces.append({"name": name, "what": trace.what, "int_hashes": as_int,
                           "cache": cache_to_dict(trace.cache), "steps": rows})
        replay = wire.replay_frames()
    finally:
        wire.close()
    return {
        "format": fmt.FORMAT, "kind": "kv_events", "vllm": version,
        "profile": _profile_name(version),
        "topic": corpus.TOPIC,
        "frames": {"publish": publish_frames, "replay": replay},
        "wire": wire_schema,
        "skipped": skipped,
        "traces": traces,
    }


def _struct_fields(event) -> dict:
    import msgspec

    return msgspec.structs.asdict(event)


def produce(out: Path) -> dict[str, int]:
    """Write the installed release's files into `out`; their sizes."""
    from harness.backends.vllm_backend import installed_vllm_version

    version = installed_vllm_version()
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)  # vLLM's notes on unseeded xxhash and the publisher
    try:
        docs = ((fmt.HASHES, hashes_doc(version)), (fmt.EVENTS, events_doc(version)))
    finally:
        logging.disable(before)
    return {name: fmt.write(out, name, doc).stat().st_size for name, doc in docs}


def main(argv: list[str] | None = None) -> int:
    import json

    from harness.backends.vllm_backend import EnvironmentProblem, installed_vllm_version
    from harness.core.exit_codes import ExitCode

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 2):
        print("usage: python -m harness.releases.vectors_produce OUT [VERSION]",
              file=sys.stderr)
        return ExitCode.BAD_INPUT
    t0 = time.perf_counter()
    try:
        imported = installed_vllm_version()
        if len(argv) == 2 and imported.split("+")[0] != argv[1]:
            raise ProduceError(f"vLLM {argv[1]}: this process imports vLLM {imported}")
        sizes = produce(Path(argv[0]))
    except (EnvironmentProblem, ProduceError) as e:
        print(f"kvconform: {e}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    print(MARKER + json.dumps({"vllm": installed_vllm_version(), "files": sizes,
                               "seconds": round(time.perf_counter() - t0, 2)}), flush=True)
    os._exit(0)  # the publisher's daemon thread and zmq context: nothing left to flush


if __name__ == "__main__":
    sys.exit(main())
