"""Seeded rows: a pure function of the token's prefix (and salt/LoRA)."""

import torch

from harness.attention.seeded import (
    STREAM_KEY,
    STREAM_QUERY,
    PrefixHasher,
    request_seed,
    seeded_rows,
)


def _rows(tokens, seed=0, stream=STREAM_KEY):
    h = PrefixHasher(seed)
    h.extend(tokens)
    return seeded_rows(h.get(range(len(tokens))), stream, 2, 16, torch.float32)


def test_shared_prefixes_give_identical_rows_and_divergence_changes_them():
    a = _rows([5, 6, 7, 8, 9])
    b = _rows([5, 6, 7, 1, 9])
    assert torch.equal(a[:3], b[:3])
    assert not torch.equal(a[3], b[3]) and not torch.equal(a[4], b[4])


def test_streams_salts_and_lora_differ_and_values_have_unit_variance():
    tokens = list(range(300))
    k = _rows(tokens)
    assert not torch.equal(k, _rows(tokens, stream=STREAM_QUERY))
    assert not torch.equal(k, _rows(tokens, seed=request_seed("salt")))
    assert request_seed(None, "lora-a") != request_seed("lora-a", None)
    assert abs(k.mean().item()) < 0.05 and abs(k.std().item() - 1) < 0.05
    assert k.abs().max() < 3 ** 0.5


def test_positions_past_the_known_tokens_continue_the_chain():
    h = PrefixHasher(0)
    h.extend([1, 2])
    ahead = h.get(range(1, 4))
    h.extend([-1, -1])
    assert ahead == h.get(range(1, 4))
