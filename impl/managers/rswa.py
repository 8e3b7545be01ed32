"""Reference sliding window, R-SWA (vLLM's name: RSWAManager); specs/KV_CACHE_MANAGER.md §9.9.

Full attention over the prompt (image and text stay readable to every
decoded token), a window over what is decoded: a decoded token reads the
`rswa_window` tokens before it and the whole prompt. Blocks between the
prompt's last block and the window hold nothing anyone reads again, so they
are given back as the window moves, bounding a request at prompt + window.
"""

from impl.kv_cache_spec import RSWASpec
from impl.managers.full_attention import FullAttentionManager
from impl.math_utils import cdiv


class RSWAManager(FullAttentionManager):
    # Frees blocks (its gap): not the full-attention fast path that never does.
    skips_tokens = True

    def __init__(self, kv_cache_spec: RSWASpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.rswa_window = kv_cache_spec.rswa_window

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        """Free the gap: whole blocks after the prompt's last one and before
        the window's first token. Without the prompt length, nothing."""
        if num_prompt_tokens is None:
            return
        size = self.block_size
        window_start = max(num_prompt_tokens, num_computed_tokens - self.rswa_window)
        self._remove_blocks_in_range(request_id, cdiv(num_prompt_tokens, size),
                                     window_start // size)
