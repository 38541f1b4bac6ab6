PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,redshift,demo,workers]'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile

demo: $(STAMP)
	$(BIN)/fleet-import demo

lint: $(STAMP)
	$(BIN)/ruff check fleet_import fleet_cli flows blocks migrations tests benchmarks
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache
