# barrierflow: the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test bench lock clean

setup: $(STAMP)

# Re-installs only when the pinned requirements or the package metadata change.
$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# Until the Airflow issue lands, the main job is the reference pipeline run
# from the CLI over a generated landing directory.
run: setup
	$(BIN)/barrierflow demo

test: setup
	$(BIN)/pytest

bench: setup
	$(BIN)/python bench/run_bench.py

lock:
	$(BIN)/pip freeze --exclude-editable | grep -vE '^(pip)==' > requirements.txt.new && mv requirements.txt.new requirements.txt

clean:
	rm -rf warehouse landing bench-work .pytest_cache
