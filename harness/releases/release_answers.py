"""A trace's answers from whatever vLLM this process imports, whatever
release the trace was recorded on: the per-release half of `kvconform bisect`,
run once per release with that release's overlay on PYTHONPATH.

    PYTHONPATH=.vllm-0.25.1 python -m harness.releases.release_answers TRACE...

prints JSON lines, per trace: first {"trace": path, "vllm": version,
"profile": name or null}, then per event {"line", "op", "answer"}; an event the
release cannot execute (the adapter refuses it, or vLLM raises) ends that
trace's run with {"line", "op", "error", "message"}; a malformed trace ends it
with {"line", "op": "trace", "error": "TraceError", "message", "exit_code"}.
The recorded answers and expectations in the trace are not read: the releases
are compared with each other, not with the trace.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator

from harness.trace import TraceError, open_trace

MARKER = "kvconform-answers: "
# Raised by the adapter failing to drive the release (a signature the API-shape
# table got wrong), not by the release's own KV cache logic: the run stops with
# exit 3 instead of recording a difference. A missing module is always the
# environment's; the others only when raised outside vLLM's own code (vLLM
# 0.23-0.25 raise TypeError building any sink group themselves: that is the
# release refusing the config).
ADAPTER_ERRORS = (ImportError, TypeError, AttributeError, NameError)


def _adapter_failure(e: BaseException) -> bool:
    if isinstance(e, ImportError):
        return True
    if not isinstance(e, ADAPTER_ERRORS):
        return False
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{os.sep}vllm{os.sep}" not in tb.tb_frame.f_code.co_filename


class AdapterFailure(RuntimeError):
    """The vLLM adapter cannot drive this release (exit 3)."""


def _error(line: int, op: str, e: BaseException) -> dict:
    return {"line": line, "op": op, "error": type(e).__name__,
            "message": str(e).splitlines()[0][:300] if str(e) else ""}


def _bad_trace(e: TraceError) -> dict:
    return {"line": e.line, "op": "trace", "error": "TraceError", "message": str(e),
            "exit_code": e.exit_code}


def release_answers(path: str) -> Iterator[dict]:
    """The header line, then one dict per event (the last may be an error)."""
    from harness.backends.vllm_backend import (
        EnvironmentProblem,
        VllmBackend,
        installed_vllm_version,
    )

    version = installed_vllm_version()
    try:
        trace = open_trace(path, any_version=True)
    except TraceError as e:
        yield {"trace": path, "vllm": version, "profile": None}
        yield _bad_trace(e)
        return
    try:
        backend = VllmBackend(trace.header.cache, any_release=True)
    except EnvironmentProblem:
        raise
    except Exception as e:  # noqa: BLE001 - the release refuses the config itself
        if _adapter_failure(e):
            raise AdapterFailure(f"{path}:1: vLLM {version}: {type(e).__name__}: {e}") from None
        yield {"trace": path, "vllm": version, "profile": None}
        yield _error(1, "header", e)
        return
    yield {"trace": path, "vllm": version,
           "profile": backend.profile.name if backend.profile else None}
    records = iter(trace.records)
    while True:
        try:
            record = next(records)
        except StopIteration:
            return
        except TraceError as e:
            yield _bad_trace(e)
            return
        event = record.event
        try:
            answer = backend.run(event)
        except Exception as e:  # noqa: BLE001 - any refusal is this release's answer
            if _adapter_failure(e):
                raise AdapterFailure(f"{path}:{record.line}: vLLM {version} ({event.kind}): "
                                     f"{type(e).__name__}: {e}") from None
            yield _error(record.line, event.kind, e)
            return
        yield {"line": record.line, "op": event.kind, "answer": answer}


def main(argv: list[str] | None = None) -> int:
    from harness.backends.vllm_backend import EnvironmentProblem
    from harness.core.exit_codes import ExitCode

    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m harness.releases.release_answers TRACE...", file=sys.stderr)
        return ExitCode.BAD_INPUT
    logging.disable(logging.WARNING)
    out = sys.stdout
    try:
        for path in argv:
            for item in release_answers(path):
                out.write(MARKER + json.dumps(item) + "\n")
    except EnvironmentProblem as e:
        print(f"kvconform: {e}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    except AdapterFailure as e:
        print(f"kvconform: the vLLM adapter cannot drive this release: {e}".splitlines()[0],
              file=sys.stderr)
        return ExitCode.ENVIRONMENT
    out.flush()
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
