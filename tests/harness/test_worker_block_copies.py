"""impl's copy-on-write block copies against vLLM 0.32's
copy_kv_cache_blocks_inplace, on CPU tensors (kernel blocks included)."""

import torch

from impl.worker.block_copies import copy_kv_cache_blocks_inplace


def _caches(seed: int):
    g = torch.Generator().manual_seed(seed)
    # 6 manager blocks of 2 kernel blocks, and a layer without a split.
    return [torch.randn(12, 2, 4, 8, generator=g), torch.randn(6, 4, 3, generator=g)]


def test_copies_match_vllm():
    from vllm.v1.worker.utils import copy_kv_cache_blocks_inplace as vllm_copy

    for seed, copies in enumerate([[(1, 3)], [(2, 4), (5, 1)], [(1, 2), (2, 3)]]):
        ours, theirs = _caches(seed), _caches(seed)
        copy_kv_cache_blocks_inplace(ours, 6, copies)
        vllm_copy(theirs, 6, copies)
        for a, b in zip(ours, theirs):
            assert torch.equal(a, b), copies
        assert not torch.equal(ours[0], _caches(seed)[0])


def test_a_wrong_copy_is_seen():
    # Negative control: copying one block too far must not compare equal.
    from vllm.v1.worker.utils import copy_kv_cache_blocks_inplace as vllm_copy

    ours, theirs = _caches(0), _caches(0)
    copy_kv_cache_blocks_inplace(ours, 6, [(1, 4)])
    vllm_copy(theirs, 6, [(1, 3)])
    assert not torch.equal(ours[0], theirs[0])
