"""concat_and_cache_mla: each token's latent row (kv_c, then k_pe) at its slot,
padding skipped, nothing else touched."""

import pytest
import torch

from impl.kernels.concat_and_cache_mla import concat_and_cache_mla


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_land_at_their_slots(dtype):
    g = torch.Generator().manual_seed(0)
    kv_c = torch.randn(5, 24, generator=g).to(dtype)
    k_pe = torch.randn(5, 8, generator=g).to(dtype)
    cache = torch.full((4, 4, 32), float("nan"), dtype=dtype)
    slots = torch.tensor([5, 0, -1, 15, 9])
    concat_and_cache_mla(kv_c, k_pe, cache, slots)
    flat = cache.view(-1, 32)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat[s, :24], kv_c[i]) and torch.equal(flat[s, 24:], k_pe[i])
    untouched = torch.ones(16, dtype=torch.bool)
    untouched[[5, 0, 15, 9]] = False
    assert flat[untouched].isnan().all()


def test_a_row_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="cannot hold"):
        concat_and_cache_mla(torch.zeros(2, 24), torch.zeros(2, 8), torch.zeros(4, 4, 30),
                             torch.tensor([1, 2]))
