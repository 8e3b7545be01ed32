"""`make matrix` / `kvconform matrix`: the conformance gate against every
profiled vLLM release through its overlay (harness/releases/matrix/run.py), one row per
release (harness/releases/matrix/table.py) in .matrix/matrix.md and .matrix/matrix.json.
"""
