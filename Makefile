# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv itself and
# installs what it uses: the demos the queue extra, the tests the extras and the dev tools.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
STAMP   := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# torch first and pinned: a bare `torch` may resolve a multi-GB CUDA build.
TORCH   ?= torch==2.13.0

.PHONY: venv demo-venv test test-fast lint format typecheck docs demo demo-checkpoint bench clean

venv: $(STAMP)

demo-venv: $(DEMO_STAMP)

define torch_first
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH)"
endef

$(STAMP): pyproject.toml
	$(torch_first)
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml
	$(torch_first)
	$(PIP) install -q -e '.[queue]'
	touch $(DEMO_STAMP)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

typecheck: venv
	$(VENV)/bin/mypy --strict preemptible

test: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --strict preemptible
	# The unit tests wait on sockets and subprocesses about half their time: four workers (on
	# two cores) take them from 3.4 to 1.5 minutes. The others share one SLURM controller, S3
	# servers and timing bounds, so they run one at a time.
	$(VENV)/bin/pytest -q -p no:cacheprovider -n 4 --durations=10 tests/unit
	$(VENV)/bin/pytest -q -p no:cacheprovider --durations=25 --ignore=tests/unit

test-fast: venv
	$(VENV)/bin/pytest -q -x -n 4 tests/unit

# The docs site into site/, warnings as errors (tests/test_docs_site.py checks the same in `make
# test`). `$(VENV)/bin/mkdocs serve` serves it on 127.0.0.1:8000 while you edit.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The queue manager on four virtual GPUs: a borrower shrunk to reclaim, grown back, bit-exact.
demo: demo-venv
	$(PY) examples/queue_demo.py

# The checkpoint store: a save torn by SIGKILL, a flipped bit, and the recovery from both.
demo-checkpoint: demo-venv
	$(PY) examples/checkpoint_demo.py

# Every benchmark in turn, then each ratio against its peer or goal in one table (~4 min).
bench: venv
	$(PY) benchmarks/summary.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis .mypy_cache
