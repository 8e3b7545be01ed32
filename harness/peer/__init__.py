"""`kvconform peer`: vLLM's own KV-cache unit tests, run on vLLM and on impl.

The pipeline: fetch the installed vLLM version's sdist (`fetch.py`), pick the
KV-cache test files (`selection.py`), run them on vLLM, then again with the
vLLM names each test module imported rebound to adapters over impl
(`rebind.py`, `adapters/`), counting calls into impl per test
(`instrument.py`); every outcome gets a reason (`classify.py`) and the
results land in `.peer/summary.json`, `summary.md` and `gaps.md`
(`summary.py`). `run.py` drives it; `plugin.py` is the pytest side.
"""
