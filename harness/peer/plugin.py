"""The pytest side of `kvconform peer` (loaded with `-p harness.peer.plugin`).

Both runs: every test gets vLLM's own `skip_global_cleanup` marker (these are
CPU unit tests; vLLM's GPU/distributed teardown costs seconds a test and
checks nothing), and each test's outcome is recorded.

The impl run (KVCONFORM_PEER_MODE=impl): impl's callables are counted
(instrument.py), the test modules' vLLM names are rebound to the adapters
(rebind.py) once collection has imported them, and each test's record
carries how many impl calls it made and the features impl lacked on its
way (lacks.py).

Records go to the file named by KVCONFORM_PEER_RECORDS (JSON lines), written
by the controller (xdist workers send their reports to it).
"""

from __future__ import annotations

import json
import os
import re

import pytest

MODE = os.environ.get("KVCONFORM_PEER_MODE", "vllm")
RECORDS = os.environ.get("KVCONFORM_PEER_RECORDS")


def pytest_configure(config) -> None:
    if MODE == "impl":
        from harness.peer import instrument

        instrument.install()
        instrument.install_vllm()
    config._kvconform_records = {}


def pytest_collection_modifyitems(session, config, items) -> None:
    marker = pytest.mark.skip_global_cleanup
    for item in items:
        item.add_marker(marker)
    if MODE == "impl":
        from harness.peer import rebind

        rebind.rebind_test_modules()
        rebind.rebind_vllm_callers()
        rebind.install_import_hook()
        for item in items:
            callspec = getattr(item, "callspec", None)
            if callspec is not None:
                rebind.rebind_instances(callspec.params)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    if MODE == "impl":
        from harness.peer import instrument, lacks

        instrument.reset()
        lacks.take_seen()


def _exception_summary(excinfo) -> dict:
    from harness.peer.lacks import ImplLacks, MissingImplAPI

    exc = excinfo.value
    first = str(exc).splitlines()[0][:300] if str(exc) else ""
    out = {"exc_type": type(exc).__name__, "message": first}
    # The ImplLacks behind the failure, if any (possibly chained).
    seen = set()
    cur = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ImplLacks):
            out["lacks"] = cur.feature
            out["lacks_detail"] = cur.detail
            if isinstance(cur, MissingImplAPI):
                out["missing_api"] = f"{cur.owner}.{cur.name}"
            break
        cur = cur.__cause__ or cur.__context__
    if "missing_api" not in out:
        api = _impl_api_error(exc)
        if api:
            out["lacks"], out["lacks_detail"], out["missing_api"] = "API", api, api
    tb = excinfo.traceback
    if tb:
        entry = tb[-1]
        out["where"] = f"{entry.path}:{entry.lineno + 1}"
    return out


_UNEXPECTED_KW = re.compile(r"(\w+(?:\.\w+)?)\(\) got an unexpected keyword argument '(\w+)'")


def _impl_api_error(exc) -> str | None:
    """`Class.name` when the error is a name impl's object lacks: an
    AttributeError on an impl object, or an impl callable refusing a vLLM
    keyword."""
    if isinstance(exc, AttributeError):
        obj = getattr(exc, "obj", None)
        if obj is not None and type(obj).__module__.startswith("impl."):
            return f"{type(obj).__name__}.{exc.name}"
    if isinstance(exc, TypeError):
        m = _UNEXPECTED_KW.search(str(exc))
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if m and tb is not None and "/harness/peer/instrument.py" in tb.tb_frame.f_code.co_filename:
            return f"{m.group(1)}({m.group(2)}=...)"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and report.outcome == "failed":
        report.user_properties.append(("kvconform_exc", _exception_summary(call.excinfo)))
    if call.when == "teardown" and MODE == "impl":
        from harness.peer import instrument, lacks

        report.user_properties.append(("kvconform_impl_calls", instrument.calls()))
        vllm_calls = instrument.vllm_calls()
        top = sorted(vllm_calls.items(), key=lambda kv: -kv[1])[:5]
        report.user_properties.append(("kvconform_vllm_calls", [sum(vllm_calls.values()), top]))
        report.user_properties.append(("kvconform_lacks_seen", lacks.take_seen()))


def pytest_runtest_logreport(report) -> None:
    config = _CONFIG[0]
    if config is None or hasattr(config, "workerinput"):
        return
    rec = config._kvconform_records.setdefault(report.nodeid, {"nodeid": report.nodeid,
                                                               "outcome": "passed"})
    if report.outcome == "failed":
        if rec["outcome"] != "failed":
            rec["phase"] = report.when
        rec["outcome"] = "failed"
    elif report.outcome == "skipped" and rec["outcome"] == "passed":
        rec["outcome"] = "skipped"
        if isinstance(report.longrepr, tuple):
            rec["skip_reason"] = str(report.longrepr[2])[:200]
    for key, value in report.user_properties:
        if key == "kvconform_exc" and "exc" not in rec:
            rec["exc"] = value
        elif key == "kvconform_impl_calls":
            rec["impl_calls"] = value
        elif key == "kvconform_vllm_calls":
            rec["vllm_kv_calls"], rec["vllm_kv_top"] = value
        elif key == "kvconform_lacks_seen":
            rec["lacks_seen"] = value
    rec["duration"] = round(rec.get("duration", 0) + report.duration, 4)


def pytest_collectreport(report) -> None:
    """A test file that does not import (on a release's overlay: a module
    or op it lacks) is one record, so the summary lists it as not runnable
    on vLLM instead of losing its tests silently."""
    config = _CONFIG[0]
    if config is None or hasattr(config, "workerinput") or report.outcome != "failed":
        return
    if not report.nodeid.endswith(".py"):
        return
    text = str(report.longrepr).strip().splitlines()
    errors = [line for line in text if line.startswith("E ")]
    last = errors[-1] if errors else (text[-1] if text else "")
    config._kvconform_records[report.nodeid] = {
        "nodeid": report.nodeid, "outcome": "failed", "phase": "collect",
        "exc": {"exc_type": "CollectionError", "message": last.removeprefix("E ").strip()[:300]}}


_CONFIG = [None]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session) -> None:
    _CONFIG[0] = session.config


def pytest_sessionfinish(session, exitstatus) -> None:
    config = session.config
    if hasattr(config, "workerinput") or not RECORDS:
        return
    with open(RECORDS, "w") as f:
        for rec in config._kvconform_records.values():
            rec.setdefault("mode", MODE)
            f.write(json.dumps(rec, default=str) + "\n")
