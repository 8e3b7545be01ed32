"""Every followed vLLM release: overlays of each release's KV cache code,
answers recorded by one release replayed on another, bisect, and the gate
against every release (matrix/)."""
