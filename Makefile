# spark-statebackend developer tasks. `make test` and `make demo` install what they need first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
JAR    := spark_statebackend/jars/spark-statebackend-bridge.jar
AZURITE := .azurite/node_modules/.bin/azurite-blob
JAVA_SRC := $(shell find jvm-bridge/src -name '*.java' 2>/dev/null)
PYTEST_ARGS ?=
# make chaos CHAOS_ARGS="--minutes 30 --seed 42" (python -m benchmarks.chaos --help lists the options)
CHAOS_ARGS ?=

.PHONY: setup test check demo bench chaos lint jar azurite clean

setup: $(STAMP) $(AZURITE) jar

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

$(AZURITE): .azurite/package.json .azurite/package-lock.json
	cd .azurite && npm ci --no-audit --no-fund --loglevel=error
	touch $(AZURITE)

azurite: $(AZURITE)

# The Java shim is compiled against the jars inside the installed pyspark: no Maven repository here.
# tools/build_jar.py is the same code a wheel build runs (setup.py), so both make the same jar.
jar: $(JAR)

$(JAR): $(STAMP) $(JAVA_SRC)
	$(BIN)/python tools/build_jar.py $(JAR)
	@touch $(JAR)  # also when the script found it up to date, so make does not ask again

test: setup
	$(BIN)/pytest $(PYTEST_ARGS)

# The fast slice a developer runs before a commit (a few minutes on 2 cores): `lint` (ruff check, ruff
# format --check, mypy --strict), then every test that needs neither Spark nor minutes of its own
# (markers spark, slow and multihost are left out).
check: setup lint
	$(BIN)/pytest -m "not spark and not slow and not multihost" $(PYTEST_ARGS)

demo: setup
	$(BIN)/python -m spark_statebackend.demo

bench: setup
	$(BIN)/python -m benchmarks.run

# The randomized fault run (benchmarks/chaos.py): exits 0 only if nothing was lost and the blob store
# is exact; the report goes to chaos-results/seed-<seed>-<time>/chaos-report.json.
chaos: setup
	$(BIN)/python -m benchmarks.chaos $(CHAOS_ARGS)

# ruff's lint rules, its formatting (check only: `ruff format` on the same paths fixes it), mypy --strict.
lint: $(STAMP)
	$(BIN)/ruff check spark_statebackend tests benchmarks tools setup.py
	$(BIN)/ruff format --check spark_statebackend tests benchmarks tools setup.py
	$(BIN)/mypy

clean:
	rm -rf $(VENV) jvm-bridge/classes $(JAR) .azurite/node_modules work bench-results chaos-results build dist
