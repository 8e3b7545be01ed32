"""Where a Mamba "align" prefill keeps a reusable state; spec §9.4.2.

A state is worth keeping only at a boundary a later request can resume from.
A resend of the prompt always recomputes its last token (its logits are
wanted), so the boundary lies before it, on the grid hits land on; an EAGLE
hit matches one grid unit further and drops it, so under EAGLE the boundary
is one unit lower still. With lookahead hashing (0.33) a boundary's hash
exists only once the L tokens after it are known, so the boundary also lies
at least L tokens before the prompt's end. The names are vLLM's
(vllm.v1.kv_cache_interface).
"""

from impl.math_utils import cdiv
from impl.profiles import PromptTailBoundary


def get_mamba_prefill_checkpoint_position(
        num_tokens: int, hash_block_size: int, drop_eagle_block: bool,
        num_hash_lookahead_tokens: int = 0,
        rule: PromptTailBoundary = PromptTailBoundary.BEFORE_LAST_TOKEN,
        eagle_holds_last_token: bool = False) -> int:
    """The last grid boundary a request of `num_tokens` tokens can hit (0: none).
    `eagle_holds_last_token`: 0.31's checkpoints keep the last token back
    under EAGLE too, before dropping the unit."""
    # Without EAGLE one token must stay to recompute (0.32+: the rule), and
    # the lookahead tokens that prove the boundary's hash; EAGLE's dropped
    # unit leaves tokens to recompute (and to hash) by itself.
    held_back = 0
    if not drop_eagle_block:
        held_back = num_hash_lookahead_tokens
        if rule is PromptTailBoundary.BEFORE_LAST_TOKEN:
            held_back = max(1, held_back)
    elif eagle_holds_last_token:
        held_back = 1
    provable = num_tokens - held_back
    position = provable - provable % hash_block_size
    if drop_eagle_block:
        position -= hash_block_size
    return position if position > 0 else 0


def is_mamba_prefill_checkpoint_valid(query_start: int, query_end: int,
                                      checkpoint_position: int, hash_block_size: int,
                                      mamba_block_size: int,
                                      checkpoint_alignment: int | None) -> bool:
    """Whether a backend can export the state at `checkpoint_position` while
    computing tokens [query_start, query_end) into the checkpoint column
    (the block before the running one)."""
    if checkpoint_alignment is None:
        return False
    if checkpoint_alignment <= 0:
        raise AssertionError(f"checkpoint alignment {checkpoint_alignment} is not positive")
    # The column the query reads its initial state from must not be the one
    # the checkpoint is written to.
    reads_from = (query_start - 1) // mamba_block_size
    writes_to = cdiv(query_end, mamba_block_size) - 2
    if query_start % hash_block_size or writes_to <= reads_from:
        return False
    if not query_start < checkpoint_position < query_end:
        return False
    offset = checkpoint_position - query_start
    return offset >= hash_block_size and offset % checkpoint_alignment == 0
