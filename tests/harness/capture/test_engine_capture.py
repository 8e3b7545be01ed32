"""Engine capture: a tiny real vLLM engine on this CPU, recorded in-process with one
layer's attention tensors; the attention metadata agrees with the replayed blocks."""

import json
import math

import pytest
import torch

from harness.backends.impl_backend import ImplBackend
from harness.report.text import format_failure
from harness.sources.replay import check_trace
from harness.trace import open_trace

pytestmark = pytest.mark.vllm


def test_engine_trace_replays_and_its_tensors_match_the_block_tables(tmp_path, small_preset):
    from safetensors import safe_open

    from harness.capture.engine_capture import EngineOptions, capture_engine
    from harness.capture.presets import load_preset

    preset = load_preset(small_preset("multi-turn-chat", requests={"count": 8},
                                      chat={"system_prompt_tokens": 80, "conversations": 3}))
    out = tmp_path / "engine.jsonl"
    r = capture_engine(preset, str(out), EngineOptions(tensors=True, tensor_steps=6),
                       progress=False)
    assert r.num_requests == 8
    o = check_trace(str(out), ["vllm", "impl"])
    assert o.exit_code == 0, o.divergence and format_failure(o.divergence)

    trace = open_trace(str(out))
    h = trace.header
    assert h.source == "engine" and h.tensors == "engine.safetensors"
    assert (h.model.num_layers, h.model.num_kv_heads, h.model.head_size) == (2, 2, 64)
    bs = h.cache.block_size
    f = safe_open(str(tmp_path / h.tensors), "pt")
    meta = f.metadata()
    # specs/ATTENTION.md: pass n follows n + 1 `step` events.
    passes = [int(s) for s in meta["steps"].split(",")]
    assert passes == list(range(6)) and meta["layer"].endswith("layers.0.self_attn.attn")
    assert (int(meta["num_heads"]), float(meta["scale"])) == (4, 64 ** -0.5)

    # Replay the calls up to each captured step's forward: the block table rows
    # and the slots written are the blocks the KV cache manager handed out.
    backend = ImplBackend(h.cache, trace.profile)
    records = iter(trace.records)
    step = 0
    for n in passes:
        want = n + 1
        # The forward runs between scheduling and update_from_output, which may
        # free requests: their tables as they were then count too.
        freed_tables = []
        for rec in records:
            if rec.event.kind == "step":
                step += 1
                if step == want + 1:
                    break
            if step == want and rec.event.kind == "free":
                freed_tables.append((rec.event.req, backend.block_table(rec.event.req)[0]))
            backend.run(rec.event)
        live = {q: backend.block_table(q)[0] for q in backend.requests}
        live.update(freed_tables)
        p = f"step.{n}."
        q, k, v, out_t = (f.get_tensor(p + x) for x in ("query", "key", "value", "output"))
        qsl, seq_lens = f.get_tensor(p + "query_start_loc"), f.get_tensor(p + "seq_lens")
        table, slots = f.get_tensor(p + "block_table"), f.get_tensor(p + "slot_mapping")
        req_ids = json.loads(meta[p + "req_ids"])
        tokens = int(qsl[-1])
        assert qsl.dtype == torch.int32 and len(req_ids) == qsl.shape[0] - 1
        assert q.shape == out_t.shape == (tokens, 4, 64) and k.shape == v.shape == (tokens, 2, 64)
        assert slots.shape[0] == tokens
        for row, (req, seq_len) in enumerate(zip(req_ids, seq_lens.tolist())):
            # Each row's block table is the blocks the trace gave its request.
            ids = table[row, : math.ceil(seq_len / bs)].tolist()
            assert live[req][: len(ids)] == ids, (n, row, req, ids, live[req])
        tables = list(live.values())
        held = {b for t in tables for b in t}
        assert {int(s) // bs for s in slots} <= held
        if step == want + 1:
            backend.run(rec.event)  # the step boundary consumed by the loop
