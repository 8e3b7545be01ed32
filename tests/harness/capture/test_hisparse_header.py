"""Capture of a HiSparse model (specs/CAPTURE.md): its header states the
HiSparse groups and the host pool as a trace does and round-trips into the
same managers; the trace ends after the header (its connector's calls are
not recorded), and HiSparse layouts a trace cannot state are refused."""

from types import SimpleNamespace

import pytest

from harness.capture.errors import CaptureGap

pytestmark = pytest.mark.vllm


def _groups(source_host_resident=True, indexer_role="HISPARSE_INDEXER"):
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    full = kvi.FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
    return [
        kvi.KVCacheGroupSpec(["s"], full, role=kvi.KVCacheGroupRole.HISPARSE_SOURCE,
                             host_resident=source_host_resident),
        kvi.KVCacheGroupSpec(["i"], full, role=kvi.KVCacheGroupRole[indexer_role]),
        kvi.KVCacheGroupSpec(["r"], kvi.HiSparseResidentSpec(block_size=16, page_size=64)),
        kvi.KVCacheGroupSpec(["h"], kvi.HiSparseHotSpec(block_size=16, page_size=64,
                                                        blocks_per_request=3)),
    ]


def _scheduler(groups, host=24):
    from vllm.v1.kv_cache_interface import KVCacheConfig

    kv = KVCacheConfig(num_blocks=40, kv_cache_tensors=[], kv_cache_groups=groups,
                       hisparse_host_num_blocks=host)
    return SimpleNamespace(
        kv_cache_config=kv,
        cache_config=SimpleNamespace(prefix_caching_hash_algo="sha256",
                                     enable_prefix_caching=True),
        max_model_len=512, log_stats=True, enable_kv_cache_events=True,
        scheduler_config=SimpleNamespace(watermark=0.0),
        vllm_config=SimpleNamespace(max_in_flight_tokens=64),
        block_size=16, hash_block_size=16)


def test_the_header_states_hisparse_groups_and_the_host_pool():
    from harness.backends.impl_backend import ImplBackend
    from harness.capture.header import cache_config_of
    from impl.managers.hisparse import HiSparseHotManager, HiSparseSourceManager
    from impl.profiles import get_profile

    config = cache_config_of(_scheduler(_groups()))
    assert [(g.kind, g.role, g.blocks_per_request) for g in config.groups] == [
        ("full_attention", "hisparse_source", None), ("full_attention", "hisparse_indexer", None),
        ("hisparse_resident", None, None), ("hisparse_hot", None, 3)]
    assert (config.hisparse_host_num_blocks, config.max_in_flight_tokens) == (24, 64)
    managers = ImplBackend(config, get_profile("0.32")).manager.coordinator.single_type_managers
    assert isinstance(managers[0], HiSparseSourceManager)
    assert isinstance(managers[3], HiSparseHotManager) and managers[3].blocks_per_request == 3


def _resident_on_host():
    from dataclasses import replace

    groups = _groups()
    groups[2] = replace(groups[2], host_resident=True)
    return groups


@pytest.mark.parametrize("groups,match", [
    (lambda: _groups(source_host_resident=False), "host_resident=False and role HISPARSE_SOURCE"),
    (_resident_on_host, "host_resident=True and role DEFAULT"),
])
def test_hisparse_layouts_a_trace_cannot_state_are_refused(groups, match):
    from harness.capture.header import cache_config_of

    with pytest.raises(CaptureGap, match=match):
        cache_config_of(_scheduler(groups()))


def test_the_trace_of_a_hisparse_model_ends_after_its_header():
    """Its connector's calls are not recorded: a strict recorder refuses at
    once; a lenient one (the server plugin) stops and writes nothing more."""
    from harness.backends.vllm_backend import VllmBackend
    from harness.capture.header import cache_config_of
    from harness.capture.recorder import Recorder, instrument, uninstrument
    from impl.profiles import get_profile

    config = cache_config_of(_scheduler(_groups()))
    for strict in (True, False):
        backend = VllmBackend(config, get_profile("0.32"))
        sink = _ListSink()
        recorder = Recorder(sink, 16, strict=strict)
        try:
            if strict:
                with pytest.raises(CaptureGap, match="HiSparse"):
                    instrument(backend.manager, recorder)
            else:
                instrument(backend.manager, recorder)
                assert not recorder.active and "HiSparse" in recorder.gap and sink.closed
        finally:
            uninstrument(backend.manager)
        assert sink.lines == []


class _ListSink:
    def __init__(self) -> None:
        self.lines, self.closed = [], False

    def write(self, obj: dict) -> None:
        self.lines.append(obj)

    def close(self) -> None:
        self.closed = True
