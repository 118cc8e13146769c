# spark-statebackend developer tasks. `make test` and `make demo` install what they need first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
JAR    := spark_statebackend/jars/spark-statebackend-bridge.jar
AZURITE := .azurite/node_modules/.bin/azurite-blob
JAVA_SRC := $(shell find jvm-bridge/src -name '*.java' 2>/dev/null)
PYTEST_ARGS ?=

.PHONY: setup test demo bench lint jar azurite clean

setup: $(STAMP) $(AZURITE) jar

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

$(AZURITE): .azurite/package.json .azurite/package-lock.json
	cd .azurite && npm ci --no-audit --no-fund --loglevel=error
	touch $(AZURITE)

azurite: $(AZURITE)

# The Java shim is compiled against the jars inside the installed pyspark: no Maven repository here.
jar: $(JAR)

$(JAR): $(STAMP) $(JAVA_SRC)
	@if [ -n "$(JAVA_SRC)" ]; then \
	  SPARK_JARS=$$($(BIN)/python -c 'import pyspark,os;print(os.path.join(os.path.dirname(pyspark.__file__),"jars"))'); \
	  rm -rf jvm-bridge/classes && mkdir -p jvm-bridge/classes spark_statebackend/jars && \
	  javac -nowarn -d jvm-bridge/classes -cp "$$SPARK_JARS/*" $(JAVA_SRC) && \
	  jar cf $(JAR) -C jvm-bridge/classes . && echo "built $(JAR)"; \
	else mkdir -p spark_statebackend/jars; echo "no Java sources yet"; fi

test: setup
	$(BIN)/pytest $(PYTEST_ARGS)

demo: setup
	$(BIN)/python -m spark_statebackend.demo

bench: setup
	$(BIN)/python -m benchmarks.run

lint: $(STAMP)
	$(BIN)/ruff check spark_statebackend tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) jvm-bridge/classes $(JAR) .azurite/node_modules work bench-results
