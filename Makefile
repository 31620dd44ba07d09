# barrierflow: the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup browser postgres run lint test bench bench-airflow lock clean

setup: $(STAMP)

# Re-installs only when the pinned requirements or the package metadata change.
$(STAMP): requirements.txt pyproject.toml
	$(MAKE) browser postgres
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	# The package's bytecode, as a wheel install writes it (an editable one does not, nor does Python under
	# PYTHONDONTWRITEBYTECODE): each driver and Spark Python worker daemon imports it ~0.2 s faster.
	$(BIN)/python -m compileall -q include
	# A class-data-sharing archive of Spark's classes, which every Spark JVM barrierflow starts maps (faster start).
	$(BIN)/python -m barrierflow.execution.jvm_archive || echo "no JVM class archive: Spark JVMs start without one"
	touch $(STAMP)

# The browser tests drive Debian's headless Chromium through chromedriver.
APT := $(shell [ "$$(id -u)" = 0 ] || echo sudo) env DEBIAN_FRONTEND=noninteractive apt-get -y -q
browser:
	@[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || \
	$(APT) install chromium chromium-driver >/dev/null || \
	{ $(APT) update >/dev/null && $(APT) install chromium chromium-driver >/dev/null; }

# make run keeps Airflow's metadata in Debian's PostgreSQL server (started by make run itself).
postgres:
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || \
	$(APT) install postgresql >/dev/null || \
	{ $(APT) update >/dev/null && $(APT) install postgresql >/dev/null; }

# The main job on embedded defaults: Airflow on http://127.0.0.1:8080 (PostgreSQL
# on loopback, LocalExecutor, login admin/admin), Spark local[*], tables in ./warehouse, and
# a generator writing sensor_stats input into ./landing. Ctrl-C stops it all.
run: setup
	$(BIN)/python -m barrierflow.tools.devserver

# Lint, type checks and the import layers (all configured in pyproject.toml); make test runs them first.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test: setup lint
	$(BIN)/pytest -n 2 --dist loadgroup --durations=40

bench: setup
	$(BIN)/python bench/run_bench.py

# The make-run stack for 6 minutes per process mode (warm engine, then spark-submit), one after the other.
bench-airflow: setup
	$(BIN)/python bench/airflow_bench.py --keep bench-work/airflow

lock:
	{ head -4 requirements.txt; $(BIN)/pip freeze --all --exclude-editable | grep -vE '^pip==' | sort -f; } > requirements.txt.new
	mv requirements.txt.new requirements.txt

clean:
	rm -rf warehouse landing bench-work .pytest_cache .airflow test-artifacts
