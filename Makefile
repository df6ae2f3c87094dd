# Every target creates and reuses the virtual environment .venv by itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODES ?= 8

.PHONY: install test test-fast trajectories run lint bench bench-network clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	@echo "Installing gossip and its dependencies (torch CPU, mpi4py, mpich, ...) into $(VENV):"
	@echo "the first time only, a few minutes (about 1.5 GB); later calls reuse it."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch 2.13.0 CPU build first, so the range in setup.cfg installs nothing more.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# everything, MPI launches and long convergence runs included (what CI runs): the in-process
# tests spread over the cores (pytest-xdist), then the tests that start several processes
# (marked `launches` by tests/conftest.py) two at a time (their ranks leave about half of the
# two cores idle, waiting on each other), and last the launches whose outcome depends on
# timing (marked `alone`: free runs, paced rounds, ranks stopped or killed) one at a time.
# Bytecode is cached even where the environment says PYTHONDONTWRITEBYTECODE: the tests start
# hundreds of interpreters, and each compiled the library's ~130 modules (and pytest each test
# module) from source again, ~3 of a launch's ~16 CPU seconds (measured on tests/engine/test_mpi.py)
test: install
	@status=0; \
	PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n auto --durations=15 -m "not launches" || status=$$?; \
	PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --durations=15 -m "launches and not alone" || status=$$?; \
	PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q --durations=5 -m "launches and alone" || status=$$?; \
	exit $$status

# the quick loop while editing: skips tests marked slow (MPI launches, long runs); ~5 min on 2 cores
test-fast: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n auto -m "not slow"

# a refactoring's guard: the first call saves every algorithm's trajectory (its bits), each later
# one compares with it and names the trajectories that changed (rm $(BEFORE) to start again)
BEFORE ?= results/trajectories-before.json
trajectories: install
	@mkdir -p $(dir $(BEFORE))
	@if [ -f $(BEFORE) ]; then OMP_NUM_THREADS=1 $(BIN)/python tests/helpers/trajectories.py --compare $(BEFORE); \
	else OMP_NUM_THREADS=1 $(BIN)/python tests/helpers/trajectories.py --save $(BEFORE) && \
		echo "after the change, make trajectories again compares with it"; fi

# CHOCO-Gossip on a ring: 'default' takes CHOCO's γ rule (docs/algorithms/choco.md, "The default
# γ"); top-k and sign get tuned steps, their worst-case δ (k/d, 1/d) being far below what dense
# vectors show, so the rule's safe γ is slow for them
run: install
	mkdir -p results
	PATH=$(abspath $(BIN)):$$PATH OMP_NUM_THREADS=1 $(BIN)/mpiexec -n $(NODES) $(BIN)/python experiments/consensus.py \
		--topology ring --rounds 2000 --log-every 10 \
		--compressor none topk:0.01 randk:0.01 sign qsgd:4bit:biased lowrank:1 \
		--gamma default 0.03 default 0.02 default default \
		--shape 40x50 --dtype float64 --out results/consensus.jsonl --plot results/consensus.png

lint: install
	$(BIN)/ruff check gossip topologies experiments tests benchmarks examples

bench: install
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_compress.py
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_engine.py --write docs/performance.md
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_startup.py --write docs/performance.md
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_scale.py --write docs/performance.md
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_transport.py
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_overlap.py
	PATH=$(abspath $(BIN)):$$PATH OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_wrap_loop.py --write docs/performance.md

# the network's tables (docs/network.md, docs/asynchronous.md): loss, running sums, asynchronous
# methods in virtual time, free runs under mpiexec (the last alone ~10 min on 2 cores)
bench-network: install
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_loss.py --rounds 1000 --seeds 0 1 2
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_running_sums.py --seeds 0 1 2
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_async.py --write docs/asynchronous.md
	PATH=$(abspath $(BIN)):$$PATH OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_free_run.py --write docs/network.md

clean:
	rm -rf $(VENV) results .pytest_cache
