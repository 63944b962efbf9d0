# The two commands a user needs: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.installed
CONSTRAINTS := -c requirements/constraints.txt

.PHONY: install run test lint bench clean

$(STAMP): pyproject.toml requirements/base.txt requirements/dev.txt requirements/constraints.txt
	bash scripts/install_system_deps.sh
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0            # the CPU build, before anything that depends on torch
	$(PIP) install -q $(CONSTRAINTS) -r requirements/base.txt -r requirements/dev.txt
	$(PIP) install -q $(CONSTRAINTS) --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/m2flow run configs/ppo_mujoco.yaml $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=15 tests   # the slowest tests listed (the suite takes ~22 min on 2 cores)

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: $(STAMP)  # the CPU benchmarks; GPU ones: benchmarks/gpu_session.sh on a GPU machine
	$(BIN)/python benchmarks/engine_overhead.py
	$(BIN)/python benchmarks/channels.py
	$(BIN)/python benchmarks/modes.py
	$(BIN)/python benchmarks/planner.py
	$(BIN)/python benchmarks/simulator_ablation.py
	$(BIN)/python benchmarks/faults.py
	$(BIN)/python benchmarks/chaos.py
	$(BIN)/python benchmarks/backends.py --sizes 1m 10m
	$(BIN)/python benchmarks/planner_accuracy.py
	$(BIN)/python benchmarks/merging.py
	$(BIN)/python benchmarks/learning.py

clean:
	rm -rf $(VENV) build dist *.egg-info
