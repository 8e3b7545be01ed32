"""vLLM inputs to impl's: fields copied, features impl lacks refused by name."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm


def test_attention_spec_fields_are_copied():
    import torch
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    from harness.peer import convert
    from impl import kv_cache_spec as ispec

    spec = convert.to_impl_spec(SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=64,
                                                  dtype=torch.bfloat16, sliding_window=128))
    assert spec == ispec.SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=64,
                                           dtype_size=2, sliding_window=128)


def test_a_spec_field_impl_cannot_express_raises_the_feature():
    import torch
    from vllm.v1.kv_cache_interface import MambaSpec

    from harness.peer import convert
    from harness.peer.lacks import ImplLacks

    spec = MambaSpec(block_size=16, shapes=((1, 1),), dtypes=(torch.float32,),
                     mamba_cache_mode="align", tp_replicated=True)
    with pytest.raises(ImplLacks, match="Mamba tp_replicated"):
        convert.to_impl_spec(spec)
    # Prefill checkpoint blocks are impl's too now.
    checkpoints = MambaSpec(block_size=16, shapes=((1, 1),), dtypes=(torch.float32,),
                            mamba_cache_mode="align", num_prefill_checkpoint_blocks=1,
                            prefill_checkpoint_alignment=16)
    converted = convert.to_impl_spec(checkpoints)
    assert (converted.num_prefill_checkpoint_blocks,
            converted.prefill_checkpoint_alignment) == (1, 16)


def test_not_from_impl_refuses_every_use():
    from harness.peer.lacks import ImplLacks, NotFromImpl, take_seen

    value = NotFromImpl("shared_prefix_boundary", "retention")
    _blocks, _n, unused = ("b", 1, value)  # unpacking is fine
    assert unused is value
    with pytest.raises(ImplLacks):
        assert value == 0
    assert ("retention", "the test reads shared_prefix_boundary") in take_seen()


def test_replicated_specs_and_draft_groups_are_copied():
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
    )

    from harness.peer import convert

    draft = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16,
                              dcp_sharded=False)
    config = KVCacheConfig(num_blocks=4, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["target"], FullAttentionSpec(block_size=16, num_kv_heads=1,
                                                       head_size=8, dtype=torch.float16)),
        KVCacheGroupSpec(["draft"], draft, is_eagle_group=True)])
    ours = convert.to_impl_config(config)
    assert [g.is_eagle_group for g in ours.kv_cache_groups] == [False, True]
    assert [g.kv_cache_spec.dcp_sharded for g in ours.kv_cache_groups] == [True, False]
    assert not ours.needs_kv_cache_zeroing
    mamba = KVCacheConfig(num_blocks=4, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["m"], MambaSpec(block_size=16, shapes=((1,),),
                                          dtypes=(torch.float32,)))])
    # vLLM zeroes new blocks of a model with state-space layers.
    assert convert.to_impl_config(mamba).needs_kv_cache_zeroing


def test_a_kpool_tail_spec_is_a_circular_buffer_to_managers_but_refused_in_sizing():
    # 0.31's KpoolTailSpec (a SlidingWindowSpec); 0.32 has none, so a
    # stand-in of the same name and base.
    import dataclasses

    import torch
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    from harness.peer import convert
    from harness.peer.adapters import sizing
    from harness.peer.lacks import ImplLacks
    from impl import kv_cache_spec as ispec

    tail_cls = dataclasses.make_dataclass("KpoolTailSpec", [], bases=(SlidingWindowSpec,),
                                          frozen=True)
    tail = tail_cls(block_size=64, num_kv_heads=1, head_size=8, dtype=torch.float32,
                    sliding_window=64)
    converted = convert.to_impl_spec(tail)
    assert converted == ispec.CircularBufferSpec(block_size=64, num_kv_heads=1, head_size=8,
                                                 dtype_size=4)
    assert not converted.prefix_cacheable
    with pytest.raises(ImplLacks, match="KpoolTailSpec sizing"):
        sizing.is_kv_cache_spec_uniform({"tail": tail})
    # Negative control: its base class is still a sliding window, sized as one.
    window = SlidingWindowSpec(block_size=64, num_kv_heads=1, head_size=8,
                               dtype=torch.float32, sliding_window=64)
    assert isinstance(convert.to_impl_spec(window), ispec.SlidingWindowSpec)
    assert sizing.is_kv_cache_spec_uniform({"window": window})
