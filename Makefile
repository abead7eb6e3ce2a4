# Two entry points: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test test-fast lint clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

run: $(BIN)/.installed
	$(BIN)/raftkv cluster up --nodes 3

# The whole suite: the fast default tests, then the slow-marked ones.
test: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/pytest -q -m "not slow"
	$(BIN)/pytest -q -m slow

test-fast: $(BIN)/.installed
	$(BIN)/pytest -q -m "not slow" -x

lint: $(BIN)/.installed
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
