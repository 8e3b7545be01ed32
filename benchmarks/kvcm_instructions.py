"""Run by benchmarks/test_kvcm_instructions.py under callgrind: the
kvcm-ops workload on one backend, with callgrind counting only the timed
calls. Protocol on stdin/stdout: prints READY once the backends are built and
warm, runs the calls when a line arrives, prints DONE and the number of
calls, exits when stdin closes."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_kvcm_ops as ops  # noqa: E402

from harness.core.events import Checkpoint  # noqa: E402
from harness.sources.workload import SchedulerWorkload, drive  # noqa: E402


def main(name: str, rounds: int) -> None:
    stream = SchedulerWorkload(ops.SPEC, ops.P, ops.CONFIG.num_blocks).events()
    events = [e for e, _ in drive(stream, ops.MAKE["vllm"]().run)
              if not isinstance(e, Checkpoint)]
    backends = [ops.MAKE[name]() for _ in range(rounds + 1)]
    for e in events:  # the first one warms the code paths up, uncounted
        backends[0].run(e)
    print("READY", flush=True)
    sys.stdin.readline()
    for backend in backends[1:]:
        run = backend.run
        for e in events:
            run(e)
    print("DONE", len(events) * rounds, flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
