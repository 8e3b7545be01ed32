"""vLLM's KV cache residency metrics (vllm.v1.core.kv_cache_metrics) over
impl's (impl.kv_cache_metrics).

`BlockMetricsState` is impl's class itself: same constructor, same fields,
nothing to translate. The collector is wrapped only so that the eviction
events it drains come out as vLLM's `KVCacheEvictionEvent` (the same three
fields), which vLLM's tests and its HiSparse stats compare with their own.
Both read the clock through `time.monotonic_ns`, so a test patching it
drives impl's timing.
"""

from __future__ import annotations

from harness.peer import convert
from harness.peer import features as F
from harness.peer.adapters.base import Adapter, register, unwrap
from harness.peer.lacks import require
from impl import kv_cache_metrics as imetrics

BlockMetricsState = imetrics.BlockMetricsState


@register(imetrics.KVCacheMetricsCollector)
class KVCacheMetricsCollector(Adapter):
    def __init__(self, sample_rate: float = 0.01):
        object.__setattr__(self, "_impl", imetrics.KVCacheMetricsCollector(sample_rate))

    def drain_events(self):
        return [convert.to_vllm_eviction_event(e) for e in unwrap(self).drain_events()]


def impl_collector(collector):
    """A pool's or manager's `metrics_collector` argument as impl takes it:
    None, or impl's collector (given through its adapter). A collector vLLM
    built itself would answer with vLLM's code."""
    collector = unwrap(collector)
    require(collector is None or isinstance(collector, imetrics.KVCacheMetricsCollector),
            F.METRICS_COLLECTOR, f"a collector impl did not build ({type(collector).__name__})")
    return collector
