PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-fast test-embedded test-e2e test-crash test-faults test-cluster mutate mutate-changed demo lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,redshift,demo,workers]'
	touch $(STAMP)

# The cluster tests (a real Prefect server with workers, Dask, the UI in Chromium) take
# minutes of both cores each: `make test` leaves them to `make test-cluster`; CI runs both.
# The fault-injection suite (tests/faults, marker `faults`) takes minutes: `make test` runs
# only its sampled cells (marker `faults_sample`), `make test-faults` all of it; CI runs both.
# The crash matrix, the soak and the takeover of killed and frozen holders (marker `crash`)
# kill and stall real processes: minutes, so `make test` leaves them to `make test-crash`.
# make test and test-faults mostly wait (lease TTLs, Prefect's and moto's answers, bounds
# waited out): one core busy of two at -n 2, so they run more workers than cores.
# The end-to-end tests (marker `e2e`: `fleet-import run`, `batches`, `slices`, the demo,
# `prefect deploy --all` against a real server, sixteen importing processes at once; tens of
# seconds each) are left to `make test-e2e`; CI runs both.
TEST_MARKERS := not workers and not browser and not crash and not e2e and (not faults or faults_sample)

test: $(STAMP)
	$(BIN)/python -m pytest -n 4 --dist loadfile --durations=15 -m "$(TEST_MARKERS)"

# What a machine without PostgreSQL runs `make test` on: the embedded server from the
# pgserver wheel (data in $TMPDIR/fleet-import-test-pgdata, on a loopback port), with
# FLEET_TEST_DATABASE_URL at a closed port so that nothing answers there. The parts of
# `make test` that meet the server most (the store, the warehouses, the fault proxy in front
# of it, the error boundaries); CI runs it besides `make test` on the machine's PostgreSQL.
EMBEDDED_TESTS := tests/store tests/warehouse tests/faults tests/test_error_boundaries.py \
	tests/test_pgtools.py

test-embedded: $(STAMP)
	env FLEET_TEST_DATABASE_URL=postgresql://postgres@127.0.0.1:1/postgres \
		$(BIN)/python -m pytest -n 4 --dist loadfile -m "$(TEST_MARKERS)" $(EMBEDDED_TESTS)

test-e2e: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile -m e2e

test-crash: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile -m crash

test-faults: $(STAMP)
	$(BIN)/python -m pytest -n 3 --dist loadfile -m faults

# The tests that need no server (tests/no_servers.py: the fakes' branch tests, the pure
# ones), in seconds, with every server pointed at a closed port and refused outright, so none
# is reached and the embedded PostgreSQL is never started. Fake AWS credentials keep boto3
# away from any real account.
FAST_ENV := FLEET_TEST_NO_SERVERS=1 \
	FLEET_TEST_DATABASE_URL=postgresql://postgres@127.0.0.1:1/postgres \
	PREFECT_API_URL=http://127.0.0.1:1/api AWS_ENDPOINT_URL=http://127.0.0.1:1 \
	AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1

test-fast: $(STAMP)
	env $(FAST_ENV) $(BIN)/python -m pytest -n 2 -m fast -p no:cacheprovider

test-cluster: $(STAMP)
	$(BIN)/python -m pytest -m "workers or browser"

# Generated mutants (mutmut 3, [tool.mutmut] in pyproject.toml) of the modules that decide
# what is published or refused: hours on two cores, so not in CI. mutmut keeps each result
# in mutants/ and tests again only the functions changed since, so a stopped run goes on where
# it stopped. `make mutate-changed` runs the mutants of the functions changed against
# MUTATE_BASE (default origin/main, else main): run it before stopping on any change to them.
# The figures of the last full run, and every survivor, are in tests/README.md.
MUTATE_CHILDREN ?= 2

mutate: $(STAMP)
	$(BIN)/mutmut run --max-children $(MUTATE_CHILDREN)
	$(BIN)/mutmut export-cicd-stats
	cat mutants/mutmut-cicd-stats.json
	$(BIN)/mutmut results

mutate-changed: $(STAMP)
	$(BIN)/python -m tests.mutate_changed --max-children $(MUTATE_CHILDREN) \
		$(if $(MUTATE_BASE),--base $(MUTATE_BASE))

demo: $(STAMP)
	$(BIN)/fleet-import demo

lint: $(STAMP)
	$(BIN)/ruff check fleet_import fleet_cli flows blocks migrations tests benchmarks
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache
