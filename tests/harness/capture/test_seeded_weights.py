"""Seeded engine weights (issue 14 item 1): O(1) queries, keys, values and
attention outputs, where vLLM's dummy loader gave ~1e-3; the golden engine
sidecars were recorded with them and say so."""

import json
import math
from pathlib import Path

import pytest
import torch

from harness.capture.seeded_weights import Q_STD, seeded_state_dict
from harness.capture.tiny_model import TinyModel

GOLDEN = Path(__file__).resolve().parents[3] / "traces" / "golden" / "v0.32"


@pytest.mark.parametrize("model", [TinyModel(), TinyModel.hybrid(64)],
                         ids=["qwen2", "hybrid-llama"])
def test_every_weight_the_architecture_loads_with_its_scale(model):
    sd = seeded_state_dict(model, seed=3)
    h, d = model.hidden_size, model.head_size
    q = sd["model.layers.0.self_attn.q_proj.weight"].float()
    assert q.shape == (model.num_attention_heads * d, h)
    assert math.isclose(q.std().item(), Q_STD / math.sqrt(h), rel_tol=0.05)
    k = sd["model.layers.1.self_attn.k_proj.weight"].float()
    assert math.isclose(k.std().item(), 1 / math.sqrt(h), rel_tol=0.05)
    assert ("model.layers.0.self_attn.q_proj.bias" in sd) == (model.architecture == "Qwen2")
    assert len([n for n in sd if n.endswith("mlp.down_proj.weight")]) == model.num_hidden_layers
    assert all(t.dtype == torch.bfloat16 for t in sd.values())
    again = seeded_state_dict(model, seed=3)
    assert all(torch.equal(sd[n], again[n]) for n in sd)
    assert not torch.equal(seeded_state_dict(model, seed=4)["lm_head.weight"],
                           sd["lm_head.weight"])


def test_a_layers_projections_of_a_normed_input_are_o1():
    model = TinyModel()
    sd = seeded_state_dict(model, seed=0)
    x = torch.randn(512, model.hidden_size)
    x = x / x.pow(2).mean(-1, keepdim=True).sqrt()  # RMS-normed, weight 1
    q = x @ sd["model.layers.0.self_attn.q_proj.weight"].float().T
    v = x @ sd["model.layers.0.self_attn.v_proj.weight"].float().T
    assert 0.8 * Q_STD < q.std().item() < 1.2 * Q_STD and 0.8 < v.std().item() < 1.2


@pytest.mark.parametrize("name", ["engine-multi-turn-chat", "engine-hybrid-sliding-window"])
def test_golden_sidecars_hold_o1_tensors_from_seeded_weights(name):
    from safetensors import safe_open

    meta = safe_open(str(GOLDEN / f"{name}.safetensors"), "pt").metadata()
    assert meta["weights"].startswith("seeded normal weights")
    steps = meta["steps"].split(",")
    assert len(steps) == 16
    for s in steps:
        rms = json.loads(meta[f"step.{s}.rms"])
        assert 1.0 < rms["query"] < 4.0 and 0.5 < rms["key"] < 2.0
        assert 0.5 < rms["value"] < 2.0 and 0.1 < rms["output"] < 2.0
