"""The `capture` and `anonymize` verbs of `kvconform` (DESIGN.md §6).

harness/cli.py calls `register(subparsers)`. Exit codes: 0 done (and, with
--check, the capture replays conformant on impl), 1 --check found a
divergence, 2 bad input or usage (one line `file:line: field: message`),
3 the environment is wrong (vLLM missing, a version without a profile, or a
vLLM call the trace format cannot express).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness.capture.errors import EXIT_DIVERGED, EXIT_ENV, EXIT_OK, EXIT_USAGE

CAPTURE_HELP = """\
Record traces from real vLLM: every call a scheduler makes on vLLM's KV cache
manager, with vLLM's answer (specs/CAPTURE.md). Sources:

  scheduler  vLLM's real Scheduler, no model: a workload preset's synthetic
             traffic (traces/workloads/*.workload: chat, few-shot, RAG,
             ShareGPT-like lengths, tight memory, resets, LoRA/salts, chunked
             prefill), sampled tokens from a seeded RNG. Fast; deterministic.
  engine     a real vLLM engine on this CPU with a tiny random Qwen2 model
             (written locally, dummy weights, token-id prompts) running a
             preset's traffic; --tensors adds one layer's q/k/v/output and
             attention metadata per step in a safetensors sidecar;
             --multiprocess runs the engine core in its own process;
             --sliding-window N a hybrid model instead (sliding-window and
             full-attention layers: two KV cache groups).
  plugin     record an unmodified `vllm serve` (or any vLLM program) through
             the kvconform vLLM plugin: `kvconform capture plugin --dir DIR --
             vllm serve MODEL ...`; traces go to rotating parts under DIR.
  join       join a plugin session's parts into one trace.
  kv-events  subscribe to a server's KV events (ZMQ + msgpack, array or map
             encoding) and turn them into a trace of checkpoints that the impl
             must reproduce.
  overhead   steps/s of the tiny engine with and without recording.
  presets    list the workload presets.
"""


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"kvconform: {message}", file=sys.stderr)
    return code


def _env_check() -> int | None:
    """EXIT_ENV with a message when vLLM is missing or has no profile."""
    from harness.backends.vllm_backend import EnvironmentProblem, installed_vllm_profile

    try:
        installed_vllm_profile()
    except EnvironmentProblem as e:
        return _fail(str(e), EXIT_ENV)
    return None


def _check(path: str) -> int:
    """Replay a capture on impl (--check)."""
    from harness.replay import check_trace
    from harness.report import format_divergence, format_outcome_line

    o = check_trace(path, ["impl"])
    if o.error is not None:
        print(str(o.error), file=sys.stderr)
        return o.exit_code
    print(format_outcome_line(o))
    if o.divergence is not None:
        print(format_divergence(o))
    return o.exit_code


def _guarded(run) -> int:
    """Map capture failures to exit codes, one line each, never a traceback."""
    from harness.capture.errors import CaptureGap, PresetError

    try:
        return run()
    except PresetError as e:
        return _fail(str(e))
    except CaptureGap as e:
        return _fail(f"capture stopped: {e} (the trace ends before that call)", EXIT_ENV)
    except BrokenPipeError:
        return EXIT_OK  # the reader (e.g. `head`) has seen enough
    except OSError as e:
        return _fail(f"{getattr(e, 'filename', '') or ''}: {e.strerror or e}")


# -- capture scheduler ------------------------------------------------------------------------


def _cmd_scheduler(args: argparse.Namespace) -> int:
    from harness.capture.presets import load_preset, preset_names

    names = preset_names() if args.all else args.preset
    if not names:
        return _fail("capture scheduler: name --preset NAME (repeatable) or --all")
    many = len(names) > 1
    if many and args.out.endswith(".jsonl"):
        return _fail("capture scheduler: several presets need --out DIR")
    if not many and not args.out.endswith(".jsonl") and not os.path.isdir(args.out):
        return _fail(f"{args.out}: --out must be a .jsonl file or an existing folder")
    if (code := _env_check()) is not None:
        return code

    def run() -> int:
        from harness.capture.scheduler_capture import capture_preset

        worst = EXIT_OK
        for name in names:
            preset = load_preset(name)
            out = args.out if args.out.endswith(".jsonl") else str(
                Path(args.out) / f"{preset.name}.jsonl")
            r = capture_preset(preset, out, progress=True,
                               free_queue_checkpoints=not args.no_free_queue)
            print(f"{out}: {r.num_events} events, {r.num_steps} steps, "
                  f"{r.num_requests} requests (preset {preset.name})")
            if args.check:
                worst = max(worst, _check(out))
        return worst

    return _guarded(run)


# -- capture engine --------------------------------------------------------------------------


def _cmd_engine(args: argparse.Namespace) -> int:
    from harness.capture.presets import load_preset

    if not args.out.endswith(".jsonl"):
        return _fail(f"{args.out}: captures are written as .jsonl")
    if (code := _env_check()) is not None:
        return code

    def run() -> int:
        from harness.capture.engine_capture import (
            EngineEnvironmentError,
            EngineOptions,
            capture_engine,
        )

        options = EngineOptions(multiprocess=args.multiprocess, tensors=args.tensors,
                                tensor_layer=args.tensor_layer, tensor_steps=args.tensor_steps,
                                block_size=args.block_size,
                                free_queue_checkpoints=not args.no_free_queue,
                                sliding_window=args.sliding_window)
        try:
            r = capture_engine(load_preset(args.preset), args.out, options)
        except EngineEnvironmentError as e:
            return _fail(str(e), EXIT_ENV)
        print(f"{args.out}: {r.num_events} events, {r.num_requests} requests"
              + (f", tensors in {Path(args.out).with_suffix('.safetensors').name}"
                 if args.tensors else ""))
        return _check(args.out) if args.check else EXIT_OK

    return _guarded(run)


# -- capture plugin / join ---------------------------------------------------------------------


def _cmd_plugin(args: argparse.Namespace) -> int:
    from importlib.metadata import entry_points

    from harness.capture import plugin

    registered = any(ep.value.startswith("harness.capture.plugin")
                     for ep in entry_points(group="vllm.general_plugins"))
    command = [c for c in args.command if c != "--"]
    if not command:
        state = "registered" if registered else \
            "NOT registered (pip install -e . in this project registers it)"
        print(f"The kvconform vLLM plugin is {state}.\n"
              f"Record a server: {plugin.ENV_DIR}=DIR vllm serve MODEL ... (or: kvconform "
              "capture plugin --dir DIR -- vllm serve MODEL ...)\n"
              f"Settings: {plugin.ENV_MAX_EVENTS} (events per part), {plugin.ENV_FREE_QUEUE}=1 "
              f"(free queue after frees), {plugin.ENV_SOURCE}.\n"
              "Then: kvconform capture join DIR/SESSION --out trace.jsonl")
        return EXIT_OK if registered else EXIT_ENV
    if not registered:
        return _fail("the kvconform vLLM plugin is not registered (pip install -e .)", EXIT_ENV)
    os.makedirs(args.dir, exist_ok=True)
    env = dict(os.environ, **{plugin.ENV_DIR: os.path.abspath(args.dir)})
    if args.max_events is not None:
        env[plugin.ENV_MAX_EVENTS] = str(args.max_events)
    if args.free_queue:
        env[plugin.ENV_FREE_QUEUE] = "1"
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        return _fail(f"{command[0]}: {e.strerror}", EXIT_USAGE)
    return EXIT_OK  # not reached


def _cmd_join(args: argparse.Namespace) -> int:
    from harness.capture.segments import JoinError, join, sessions

    session = args.session
    found = sessions(session)
    if found and not any(p.name.startswith("part-") for p in Path(session).iterdir()):
        if len(found) > 1:
            return _fail(f"{session}: {len(found)} sessions; name one: "
                         + ", ".join(Path(f).name for f in found))
        session = found[0]
    try:
        n = join(session, args.out, include_partial=args.include_partial)
    except JoinError as e:
        return _fail(str(e))
    print(f"{args.out}: {n} events from {session}")
    return _check(args.out) if args.check else EXIT_OK


# -- capture kv-events ----------------------------------------------------------------------------


def _cmd_kv_events(args: argparse.Namespace) -> int:
    import json

    from harness.capture.kv_event_stream import EventBatch, StreamError, subscribe
    from harness.capture.kv_event_trace import EventTraceBuilder, save_batches
    from harness.capture.progress import Progress
    from impl.profiles import UnsupportedVersion, get_profile

    if not args.out.endswith(".jsonl"):
        return _fail(f"{args.out}: captures are written as .jsonl")
    if bool(args.endpoint) == bool(args.from_stream):
        return _fail("capture kv-events: give --endpoint (live) or --from-stream FILE")
    version = args.vllm_version
    if version is None:
        try:
            from harness.backends.vllm_backend import installed_vllm_version

            version = installed_vllm_version()
        except Exception:  # noqa: BLE001
            return _fail("capture kv-events: --vllm-version (the server's) is needed when "
                         "vLLM is not installed here", EXIT_ENV)
    try:
        get_profile(version)
    except UnsupportedVersion as e:
        return _fail(str(e), EXIT_ENV)
    lora_paths = {}
    for item in args.lora_path or ():
        name, sep, path = item.partition("=")
        if not sep:
            return _fail(f"--lora-path {item!r}: expected NAME=PATH")
        lora_paths[name] = path
    builder = EventTraceBuilder(version, args.hash_algo, args.hash_seed, lora_paths)
    if args.from_stream:
        def batches():
            with open(args.from_stream) as f:
                for n, line in enumerate(f, 1):
                    try:
                        d = json.loads(line)
                        yield EventBatch(d["seq"], d["ts"], d["events"], d.get("rank"),
                                         d.get("encoding", "map"))
                    except (ValueError, KeyError, TypeError) as e:
                        raise StreamError(f"{args.from_stream}:{n}: (line): not a saved "
                                          f"batch ({e})") from None
        source = batches()
    else:
        source = subscribe(args.endpoint, args.topic, args.replay_endpoint, args.seconds,
                           args.batches, args.idle)
    saved: list = []
    bar = Progress(args.batches or 0, "kv-events", unit="batch")
    try:
        for batch in source:
            builder.add_batch(batch)
            if args.save_stream:
                saved.append(batch)
            bar.update()
    except StreamError as e:
        return _fail(str(e))
    except KeyboardInterrupt:
        pass  # Ctrl-C ends a live subscription; what came is kept
    finally:
        bar.close()
    if args.save_stream:
        save_batches(saved, args.save_stream)
    where = args.endpoint or args.from_stream
    n = builder.write(args.out, f"KV events of {where}: {builder.num_batches} batches, "
                      f"{builder.num_events} events")
    skipped = sum(builder.skipped.values())
    print(f"{args.out}: {n} trace events from {builder.num_batches} batches "
          f"({builder.num_events} KV events, {skipped} left out"
          + (": " + "; ".join(f"{v} {k}" for k, v in builder.skipped.items()) if skipped
             else "") + ")")
    return _check(args.out) if args.check else EXIT_OK


# -- capture overhead / presets -----------------------------------------------------------------


def _cmd_overhead(args: argparse.Namespace) -> int:
    # One OpenMP thread: the tiny model's steps are then short and steady (the
    # worst case for the relative cost of recording); must precede torch.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if (code := _env_check()) is not None:
        return code

    def run() -> int:
        from harness.capture.overhead import measure
        from harness.capture.presets import load_preset

        o = measure(load_preset(args.preset), runs=args.runs)
        print(f"tiny engine, preset {args.preset}: {o.steps} steps a run, {o.runs} runs each "
              f"way, {o.events_per_run} events recorded a run")
        print(f"  steps/s (per CPU second, median): bare {o.bare_steps_per_s:.1f}, recorded "
              f"{o.recorded_steps_per_s:.1f} -> {o.percent:+.2f}%")
        print(f"  steps/s (per CPU second, best):   bare {max(o.bare_runs):.1f}, recorded "
              f"{max(o.recorded_runs):.1f} -> {o.best_percent:+.2f}%")
        print(f"  steps/s (wall clock, median):     bare {o.bare_wall_steps_per_s:.1f}, recorded "
              f"{o.recorded_wall_steps_per_s:.1f}")
        print(f"  time inside the recorder: {o.recording_us_per_step:.1f} us/step = "
              f"{o.direct_percent:.2f}% of a bare step")
        return EXIT_OK

    return _guarded(run)


def _cmd_presets(args: argparse.Namespace) -> int:
    from harness.capture.presets import load_preset, preset_names

    def run() -> int:
        import textwrap

        for name in preset_names():
            p = load_preset(name)
            print(f"{name:<30} {p.kind:<9} {textwrap.shorten(p.description, 76)}")
        return EXIT_OK

    return _guarded(run)


# -- anonymize -----------------------------------------------------------------------------------


def _cmd_anonymize(args: argparse.Namespace) -> int:
    from harness.capture.anonymize import AnonymizeError, anonymize, resolve_key
    from harness.trace import TraceError

    if not args.out.endswith(".jsonl"):
        return _fail(f"{args.out}: anonymised traces are written as .jsonl")
    try:
        key = resolve_key(args.key)
        target = args.out if not args.rehash else f"{args.out}.unhashed.jsonl"
        n = anonymize(args.input, target, key, args.vocab)
    except AnonymizeError as e:
        return _fail(str(e))
    except TraceError as e:
        print(str(e), file=sys.stderr)
        return e.exit_code
    if args.rehash:
        if (code := _env_check()) is not None:
            return code
        from harness.replay import check_trace
        from harness.report import format_divergence

        o = check_trace(target, ["vllm"], writer_path=args.out, explicit=True)
        os.remove(target)
        if o.error is not None:
            print(str(o.error), file=sys.stderr)
            return o.exit_code
        if o.divergence is not None:
            print(format_divergence(o))
            return EXIT_DIVERGED
    print(f"{args.out}: {n} events anonymised"
          + (" (hashes and KV events recorded anew by the installed vLLM)" if args.rehash
             else " (token-dependent answers dropped: see specs/CAPTURE.md)"))
    return EXIT_OK


# -- the parsers -------------------------------------------------------------------------------


def register(subparsers) -> None:
    """Add `capture` and `anonymize` to kvconform's verbs."""
    p = subparsers.add_parser(
        "capture", help="record traces from real vLLM (scheduler, tiny engine, server "
        "plugin, KV-event streams)", description=CAPTURE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_subparsers(dest="source", required=True, metavar="SOURCE")

    s = src.add_parser("scheduler", help="vLLM's Scheduler, no model, a workload preset",
                       description="Drive vLLM's real Scheduler with a workload preset's "
                       "synthetic traffic (no model: sampled tokens from a seeded RNG) and "
                       "record every KV cache manager call and answer.")
    s.add_argument("--preset", action="append", metavar="NAME|FILE",
                   help="a preset name (kvconform capture presets) or a preset file; "
                   "repeatable")
    s.add_argument("--all", action="store_true", help="every preset under traces/workloads/")
    s.add_argument("--out", required=True, metavar="FILE|DIR",
                   help="the trace (.jsonl), or a folder for several presets")
    s.add_argument("--no-free-queue", action="store_true",
                   help="leave out the free-queue checkpoint after each free and preemption")
    s.add_argument("--check", action="store_true", help="replay each capture on impl")
    s.set_defaults(func=_cmd_scheduler)

    e = src.add_parser("engine", help="a tiny real vLLM engine on this CPU",
                       description="Run a preset's traffic through a real vLLM engine with "
                       "a tiny random Qwen2 model (config written locally, dummy weights, no "
                       "tokenizer) and record its scheduler's KV cache manager.")
    e.add_argument("--preset", default="multi-turn-chat", metavar="NAME|FILE",
                   help="the traffic (default multi-turn-chat; no LoRA presets)")
    e.add_argument("--out", required=True, metavar="FILE", help="the trace (.jsonl)")
    e.add_argument("--multiprocess", action="store_true",
                   help="engine core in its own process (recorded by the vLLM plugin)")
    e.add_argument("--tensors", action="store_true",
                   help="also one layer's q/k/v/output and attention metadata per step, in "
                   "FILE's .safetensors sidecar (in-process only)")
    e.add_argument("--tensor-layer", type=int, default=0, metavar="N")
    e.add_argument("--tensor-steps", type=int, default=8, metavar="N",
                   help="steps with tensors, the first N (default 8)")
    e.add_argument("--block-size", type=int, default=32,
                   help="KV block size, a multiple of 32 for vLLM's CPU attention (default 32)")
    e.add_argument("--sliding-window", type=int, default=None, metavar="TOKENS",
                   help="a hybrid model instead: a tiny 4-layer Llama whose layers alternate "
                   "sliding-window attention (this window) and full attention, so vLLM "
                   "builds two KV cache groups")
    e.add_argument("--no-free-queue", action="store_true",
                   help="leave out the free-queue checkpoint after each free and preemption")
    e.add_argument("--check", action="store_true", help="replay the capture on impl")
    e.set_defaults(func=_cmd_engine)

    g = src.add_parser("plugin", help="record a running vLLM server through the plugin",
                       description="Run COMMAND (e.g. vllm serve MODEL ...) with the "
                       "kvconform vLLM plugin recording into DIR; without COMMAND, say how "
                       "to enable the plugin and whether it is registered.")
    g.add_argument("--dir", default="kvconform-capture", metavar="DIR",
                   help="where sessions go (default kvconform-capture)")
    g.add_argument("--max-events", type=int, metavar="N", help="events per part (rotation)")
    g.add_argument("--free-queue", action="store_true",
                   help="record the free queue after every free (O(pool) each)")
    g.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    g.set_defaults(func=_cmd_plugin)

    j = src.add_parser("join", help="join a plugin session's parts into one trace")
    j.add_argument("session", metavar="SESSION", help="a session folder (or a capture DIR "
                   "holding one session)")
    j.add_argument("--out", required=True, metavar="FILE")
    j.add_argument("--include-partial", action="store_true",
                   help="take the part being written (the server died)")
    j.add_argument("--check", action="store_true", help="replay the trace on impl")
    j.set_defaults(func=_cmd_join)

    k = src.add_parser("kv-events", help="a server's KV event stream as trace checkpoints",
                       description="Subscribe to vLLM's KV events (ZMQ; msgpack in the older "
                       "array or the newer map encoding) and write a trace whose checkpoints "
                       "hold the published events, preceded by the calls that make a KV "
                       "cache manager store and drop those blocks; replaying it checks the "
                       "impl's events against the server's.")
    k.add_argument("--endpoint", metavar="EP", help="the publisher, e.g. tcp://host:5557")
    k.add_argument("--replay-endpoint", metavar="EP",
                   help="vLLM's replay socket: fetch the batches published before")
    k.add_argument("--topic", default="")
    k.add_argument("--seconds", type=float, help="stop after this long")
    k.add_argument("--batches", type=int, help="stop after this many batches")
    k.add_argument("--idle", type=float, help="stop after this long without a batch")
    k.add_argument("--from-stream", metavar="FILE", help="a stream saved with --save-stream")
    k.add_argument("--save-stream", metavar="FILE", help="also save the raw batches")
    k.add_argument("--out", required=True, metavar="FILE", help="the trace (.jsonl)")
    k.add_argument("--vllm-version", help="the server's vLLM (default: the installed one)")
    k.add_argument("--hash-algo", default="sha256",
                   choices=["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"],
                   help="the server's prefix_caching_hash_algo (default sha256)")
    k.add_argument("--hash-seed", default=None,
                   help="the server's PYTHONHASHSEED (default: unset)")
    k.add_argument("--lora-path", action="append", metavar="NAME=PATH",
                   help="an adapter's path (0.32 hashes it; events carry only the name)")
    k.add_argument("--check", action="store_true", help="replay the trace on impl")
    k.set_defaults(func=_cmd_kv_events)

    o = src.add_parser("overhead", help="steps/s of the tiny engine with and without recording")
    o.add_argument("--preset", default="long-generations", metavar="NAME|FILE")
    o.add_argument("--runs", type=int, default=3, help="runs each way (default 3)")
    o.set_defaults(func=_cmd_overhead)

    ls = src.add_parser("presets", help="list the workload presets")
    ls.set_defaults(func=_cmd_presets)

    a = subparsers.add_parser(
        "anonymize", help="keyed, prefix-preserving remap of a trace's token ids",
        description="Rewrite token ids with a keyed bijection that keeps prefix sharing, "
        "block boundaries and hits (and replaces request ids, salts, LoRA and multimodal "
        "names). Token-dependent answers (block hashes, KV events) are dropped, or "
        "recorded anew from the installed vLLM with --rehash.")
    a.add_argument("input", metavar="IN")
    a.add_argument("--out", required=True, metavar="OUT", help="the anonymised trace (.jsonl)")
    a.add_argument("--key", help="the secret (default: the KVCONFORM_ANON_KEY variable)")
    a.add_argument("--vocab", type=int, help="token ids stay below this (default: one past "
                   "the trace's largest)")
    a.add_argument("--rehash", action="store_true",
                   help="record hashes and KV events anew with the installed vLLM")
    a.set_defaults(func=_cmd_anonymize)
