PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-cluster demo lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,redshift,demo,workers]'
	touch $(STAMP)

# The cluster tests (a real Prefect server with workers, Dask, the UI in Chromium) take
# minutes of both cores each: `make test` leaves them to `make test-cluster`; CI runs both.
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile -m "not workers and not browser"

test-cluster: $(STAMP)
	$(BIN)/python -m pytest -m "workers or browser"

demo: $(STAMP)
	$(BIN)/fleet-import demo

lint: $(STAMP)
	$(BIN)/ruff check fleet_import fleet_cli flows blocks migrations tests benchmarks
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache
