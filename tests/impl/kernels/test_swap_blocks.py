"""swap_blocks: blocks move between two caches (device and host in vLLM)."""

import pytest
import torch

from impl.kernels.swap_blocks import swap_blocks


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_blocks_move_and_others_stay(dtype):
    src = torch.randn(6, 16, 2, 32).to(dtype)
    dst = torch.zeros(8, 16, 2, 32).to(dtype)
    swap_blocks(src, dst, torch.tensor([[0, 7], [4, 1], [5, 2]]))
    assert torch.equal(dst[7].view(torch.uint8), src[0].view(torch.uint8))
    assert torch.equal(dst[1].view(torch.uint8), src[4].view(torch.uint8))
    assert torch.equal(dst[2].view(torch.uint8), src[5].view(torch.uint8))
    untouched = [0, 3, 4, 5, 6]
    assert not dst[untouched].view(torch.uint8).any()


def test_strided_layer_views_swap():
    # A key view of the LBNHC layout (not contiguous) swaps like any cache.
    raw = torch.randn(4, 16, 2, 64)
    key = raw[..., :32]
    host = torch.zeros(4, 16, 2, 32)
    swap_blocks(key, host, torch.tensor([[3, 0]]))
    assert torch.equal(host[0], key[3])


def test_mismatched_caches_and_duplicate_destinations_are_refused():
    a = torch.zeros(4, 16, 2, 32)
    with pytest.raises(ValueError, match="cannot swap"):
        swap_blocks(a, torch.zeros(4, 16, 2, 16), torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="distinct"):
        swap_blocks(a, torch.zeros(4, 16, 2, 32), torch.tensor([[0, 1], [2, 1]]))
