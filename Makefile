# The two commands of the README. Both set everything up first (idempotent, fast when done).
#   make run  [ARGS='learner.total_steps=5 launch.num_env_actors=4']   the bounded pipeline
#   make test [PYTEST_ARGS='-m "not e2e"']                             the whole test suite
VENV ?= .venv
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup run test test-long test-fast lint bench
setup:
	@bash scripts/setup.sh

# the run itself needs no Prometheus: a user who has Java sets up and runs without root
run:
	@EMPO2_PROMETHEUS=0 EMPO2_SLURM=0 bash scripts/setup.sh
	HF_HUB_OFFLINE=1 $(VENV)/bin/empo2-run $(ARGS)

test: setup lint
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -m "not long" $(PYTEST_ARGS)

# the long runs left out of `make test`: the full kill -9 fault matrix (~18 min on 2 cores) and the chaos
# soak's short variant (tests/unit/benchmarks/test_chaos.py)
test-long: setup
	HF_HUB_OFFLINE=1 EMPO2_TEST_TIMEOUT_S=3600 $(VENV)/bin/python -m pytest -m long $(PYTEST_ARGS)

test-fast: setup lint
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -m "not e2e and not integration" $(PYTEST_ARGS)

# ruff: lint and format check (line length 120, pyproject.toml); `ruff format .` fixes the format
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Prometheus on a run's targets (the launcher's <run_dir>/prometheus/targets.json) with the rules
# of deploy/monitoring/rules.yml; prints the URLs.   make monitor [RUN_DIR=runs/<run>] (default: the newest)
RUN_DIR ?=
.PHONY: monitor
monitor: setup
	$(VENV)/bin/python -m deploy.prometheus $(RUN_DIR)
