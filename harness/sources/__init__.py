"""Where events come from and how they are run: a recorded trace
(replay.check_trace), a seeded scheduler workload (workload.py) and where
vLLM's scheduler ends a Mamba chunk (mamba_chunks.py)."""
