"""The golden set: what it holds. (Every trace under traces/ is replayed on impl,
and those of the installed vLLM diffed against it, by tests/harness/test_replay.py.)"""

import json

from harness.capture.presets import preset_names
from harness.trace import find_traces, open_trace

from .conftest import GOLDEN


def test_one_trace_per_preset_and_two_engine_traces_per_version():
    for version, engines in (("v0.32", 2), ("v0.17", 0)):
        folder = GOLDEN / version
        headers = {p: open_trace(p).header for p in find_traces([str(folder)])}
        sources = [h.source for h in headers.values()]
        assert sources.count("engine") >= engines
        described = " ".join(h.description or "" for h in headers.values())
        for name in preset_names():
            assert f"preset '{name}'" in described, (version, name)
        for h in headers.values():
            assert h.vllm_version.startswith(version[1:] + ".")
        for path in headers:
            assert sum(1 for _ in open(path)) < 8000  # modest: `make conform` stays fast


def test_the_tensor_sidecar_is_where_the_header_says():
    from safetensors import safe_open

    sidecars = 0
    for path in find_traces([str(GOLDEN)]):
        header = json.loads(open(path).readline())
        if "tensors" not in header:
            continue
        sidecars += 1
        f = safe_open(str(GOLDEN / path.split("/golden/")[1].rsplit("/", 1)[0]
                          / header["tensors"]), "pt")
        meta = f.metadata()
        assert meta["format"] == "kvconform-attention/1"
        # The layout of specs/ATTENTION.md ("Recorded tensors").
        for step in meta["steps"].split(","):
            q = f.get_tensor(f"step.{step}.query")
            qsl = f.get_tensor(f"step.{step}.query_start_loc")
            assert q.shape[1:] == (int(meta["num_heads"]), header["model"]["head_size"])
            assert len(json.loads(meta[f"step.{step}.req_ids"])) == qsl.shape[0] - 1
            assert int(qsl[-1]) == q.shape[0]
    assert sidecars == 2  # the multi-turn chat and the hybrid engine traces


def test_a_hybrid_engine_trace_with_a_sliding_window_group():
    """issue 6: a multi-group trace captured from the tiny real engine."""
    hybrid = [h for h in (open_trace(p).header for p in find_traces([str(GOLDEN / "v0.32")]))
              if h.source == "engine" and len(h.cache.groups) > 1]
    assert hybrid, "no multi-group engine trace under traces/golden/v0.32"
    kinds = {g.kind for h in hybrid for g in h.cache.groups}
    assert {"sliding_window", "full_attention"} <= kinds
