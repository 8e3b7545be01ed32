"""`make matrix` / `kvconform matrix`: the conformance gate against every
profiled vLLM release through its overlay (harness/matrix/run.py), one row per
release (harness/matrix/table.py) in .matrix/matrix.md and .matrix/matrix.json.
"""
