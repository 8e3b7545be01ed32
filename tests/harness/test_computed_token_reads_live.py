"""get_block_ids_for_computed_tokens and estimate_cached_tokens, differential
against the installed vLLM (specs/KV_CACHE_MANAGER.md §16.10): the same cache
config built on both backends, a few requests driven through them (prefix
hits, decode steps, skipped blocks given back, a free), and after every step
both reads compared for every live request. Negative controls: an impl bug
injected in each read is caught."""

from __future__ import annotations

import pytest

import impl.kv_cache_manager
import impl.kv_cache_spec
from harness.backends.impl_backend import ImplBackend
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.events import AddRequest, Allocate
from impl.profiles import get_profile

pytestmark = pytest.mark.vllm
P32 = get_profile("0.32")
BS = 4

# One config per kind the reads treat apart, each beside full attention
# (hash blocks of 4 tokens everywhere).
CONFIGS = {
    "sliding_window": CacheConfig(40, (GroupConfig(BS), GroupConfig(
        BS, "sliding_window", sliding_window=6))),
    "chunked_local": CacheConfig(40, (GroupConfig(BS), GroupConfig(
        BS, "chunked_local_attention", attention_chunk_size=8))),
    "mamba_align": CacheConfig(40, (GroupConfig(BS), GroupConfig(
        BS, "mamba", mamba_cache_mode="align"))),
    "two_block_sizes": CacheConfig(40, (GroupConfig(BS), GroupConfig(2 * BS))),
    "circular_buffer": CacheConfig(40, (GroupConfig(BS), GroupConfig(BS, "circular_buffer"))),
    "mla": CacheConfig(40, (GroupConfig(BS, "mla_attention"),)),
    # The cut is by the spec's block size, not the DCP-scaled one the
    # manager's blocks span: up to twice the blocks the tokens fill here.
    "dcp_sharded": CacheConfig(40, (GroupConfig(BS),), dcp_world_size=2),
    # Encoder-decoder models run without prefix caching (no cross-attention lookup).
    "cross_attention": CacheConfig(40, (GroupConfig(BS), GroupConfig(BS, "cross_attention")),
                                   enable_caching=False),
}
ENCODER_TOKENS = 10
PROBES = (0, 1, BS - 1, BS, 2 * BS + 1)


def _reads(backend) -> list:
    """Both reads for every live request, at a few token counts besides
    its own computed count."""
    out = []
    manager = backend.manager
    for req, request in sorted(backend.requests.items()):
        computed = request.num_computed_tokens
        for n in (*PROBES, computed, computed + 5):
            ids = manager.get_block_ids_for_computed_tokens(req, n)
            out.append((req, n, [list(g) for g in ids]))
        out.append((req, "cached", manager.estimate_cached_tokens(request)))
    return out


def _script(backend, encoder: bool):
    """The steps, each followed by a read of both calls."""
    extra = dict(num_encoder_tokens=ENCODER_TOKENS) if encoder else {}
    reads = []

    def admit(req, prompt):
        backend.add_request(AddRequest(req, prompt))
        _, hit = backend.lookup(req)
        assert backend.allocate(Allocate(req, len(prompt) - hit, **extra)) is not None
        reads.append(_reads(backend))

    def decode(req, token):
        backend.append_tokens(req, [token])
        assert backend.allocate(Allocate(req, 1)) is not None
        request = backend.requests[req]
        backend.manager.remove_skipped_blocks(req, request.num_computed_tokens,
                                              request.num_prompt_tokens)
        reads.append(_reads(backend))

    admit("a", list(range(14)))
    for token in (100, 101, 102):
        decode("a", token)
    admit("b", list(range(12)) + [50, 51, 52])  # hits a's first 12 tokens
    decode("b", 103)
    backend.free("a")
    reads.append(_reads(backend))
    admit("c", list(range(12)) + [60, 61, 62, 63])  # ends on a block boundary
    return reads


def divergences(config: CacheConfig, encoder: bool) -> list[str]:
    from harness.backends.vllm_backend import VllmBackend

    answers = {}
    for backend in (ImplBackend(config, P32, check=True), VllmBackend(config, P32)):
        backend.start()
        answers[backend.name] = _script(backend, encoder)
    out = []
    for step, (mine, theirs) in enumerate(zip(answers["impl"], answers["vllm"], strict=True)):
        for a, b in zip(mine, theirs, strict=True):
            if a != b:
                out.append(f"step {step}: impl {a} vs vLLM {b}")
    return out


@pytest.mark.parametrize("name", CONFIGS)
def test_both_reads_agree_with_vllm(name):
    assert divergences(CONFIGS[name], encoder=name == "cross_attention") == []


def test_the_reads_see_what_they_compare():
    """The script reaches cut tables, null padding, shared keys and a
    least-over-groups estimate, so agreement means something."""
    reads = _script(ImplBackend(CONFIGS["sliding_window"], P32), encoder=False)
    flat = [r for step in reads for r in step]
    assert any(r[1] == 0 and r[2] == [[], []] for r in flat)
    assert any(isinstance(r[1], int) and 0 in r[2][1] for r in flat)  # the window's nulls
    assert any(r[0] == "b" and r[1] == "cached" and r[2] >= 12 for r in flat)
    mamba = [r for step in _script(ImplBackend(CONFIGS["mamba_align"], P32), encoder=False)
             for r in step if r[1] == "cached"]
    assert {r[2] for r in mamba} > {0}  # the least over groups is 0, then not
    dcp = ImplBackend(CONFIGS["dcp_sharded"], P32)
    _script(dcp, encoder=False)
    # c: 16 tokens in 8-token blocks; 5 tokens keep two of them.
    assert len(dcp.manager.get_block_ids_for_computed_tokens("c", 5)[0]) == 2


# -- negative controls -------------------------------------------------------------------


def test_negative_control_cross_attention_cut_like_the_decoder(monkeypatch):
    monkeypatch.setattr(impl.kv_cache_spec.CrossAttentionSpec, "reads_encoder_tokens", False)
    assert divergences(CONFIGS["cross_attention"], encoder=True)


def test_negative_control_a_window_left_whole(monkeypatch):
    monkeypatch.setattr(impl.kv_cache_spec.SlidingWindowSpec, "token_blocks", False)
    assert divergences(CONFIGS["sliding_window"], encoder=False)


def test_negative_control_the_most_instead_of_the_least_cached(monkeypatch):
    def most(self, request):
        groups = zip(self.kv_cache_config.kv_cache_groups,
                     self.get_blocks(request.request_id).blocks)
        return max((b.block_hash_num_tokens or 0 for g, blocks in groups
                    if g.kv_cache_spec.counts_cached_tokens for b in blocks), default=0)

    monkeypatch.setattr(impl.kv_cache_manager.KVCacheManager, "estimate_cached_tokens", most)
    assert divergences(CONFIGS["mamba_align"], encoder=False)


def test_negative_control_the_cut_by_the_managers_dcp_scaled_block(monkeypatch):
    def scaled(self, request_id, num_computed_tokens):
        managers = self.coordinator.single_type_managers
        return tuple(ids[:-(-num_computed_tokens // m.block_size)]
                     for ids, m in zip(self.get_block_ids(request_id), managers))

    monkeypatch.setattr(impl.kv_cache_manager.KVCacheManager,
                        "get_block_ids_for_computed_tokens", scaled)
    assert divergences(CONFIGS["dcp_sharded"], encoder=False)
