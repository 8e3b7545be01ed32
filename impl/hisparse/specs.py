"""The group specs of HiSparse's device-side groups; spec §14.

Neither takes part in prefix caching: the host (source) group owns it, and
these pages are either copies of host pages (resident) or scratch (hot).
`page_size` is the bytes one block takes, given outright.
"""

from dataclasses import dataclass
from operator import attrgetter

from impl.kv_cache_spec import KVCacheSpec
from impl.math_utils import cdiv


@dataclass(frozen=True, slots=True, kw_only=True)
class HiSparseResidentSpec(KVCacheSpec):
    """GPU pages mirroring host pages, one per block of the source group,
    reclaimable once the host copy is durable."""

    page_size: int

    prefix_cacheable = False
    has_layer_views = False  # a raw region of pages, copied whole

    def max_admission_blocks_per_request(self, max_in_flight_tokens: int,
                                         max_model_len: int) -> int:
        """Pages a request is admitted with: older ones move to the host."""
        return cdiv(min(max_in_flight_tokens, max_model_len), self.block_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class HiSparseHotSpec(KVCacheSpec):
    """A fixed region of blocks (`blocks_per_request` of them) that a request
    needs once it reads its history from the host."""

    page_size: int
    blocks_per_request: int

    prefix_cacheable = False
    has_layer_views = False  # gathered rows, laid out by the kernel
    uses_slot_mapping = False


# KV events call both kinds unknown (vLLM's KVCacheSpecKind has no name for
# them); the spec class name would otherwise give the kind.
HiSparseResidentSpec.kind = HiSparseHotSpec.kind = "unknown"
# Their page is the size given, not a grid of heads and states.
HiSparseResidentSpec.real_page_size_bytes = HiSparseHotSpec.real_page_size_bytes = property(
    attrgetter("page_size"))
