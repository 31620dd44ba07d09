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

# The main job on embedded defaults: sample input in ./landing, Spark
# local[*], tables in ./warehouse. Re-running adds files and runs new epochs.
run: setup
	$(BIN)/barrierflow generate ./landing --files 4 --start-index $$(ls landing 2>/dev/null | grep -c '\.jsonl$$')
	$(BIN)/barrierflow run sensor_stats --param landing_dir=./landing --param max_files_per_epoch=2 --until-caught-up
	$(BIN)/barrierflow query sensor_stats "SELECT * FROM sensor_totals ORDER BY sensor_id"

test: setup
	$(BIN)/pytest -n 2

bench: setup
	$(BIN)/python bench/run_bench.py

lock:
	$(BIN)/pip freeze --all --exclude-editable | grep -vE '^(pip)==' > requirements.txt.new && mv requirements.txt.new requirements.txt

clean:
	rm -rf warehouse landing bench-work .pytest_cache
