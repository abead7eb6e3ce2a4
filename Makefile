# Two entry points: `make run` and `make test`. Both create .venv on first use.
# One venv, two install levels: `make run` installs raftkv alone (its runtime dependencies),
# `make test` adds the dev extras (pytest, hypothesis, Spark, ...). Each level has its own
# stamp, so `make test` after `make run` upgrades the same venv, and a changed pyproject.toml
# reinstalls.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: run test test-slow test-fast lint typecheck genproto compose-up compose-down clean spark-demo etcd-bench native

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[native]'
	touch $@

# The dev extras include every runtime dependency, so they satisfy `make run` too.
$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $@ $(RUN_STAMP)

# The gRPC server's HTTP/2 modules, compiled to C with mypyc beside their sources
# (kvserver/native.py says which and why). Rebuilt when a source in kvserver/api/grpc changes;
# until then those modules run from source, and importing kvserver warns.
NATIVE := .build/native.json
native: $(NATIVE)
$(NATIVE): kvserver/native.py $(wildcard kvserver/api/grpc/*.py) | $(RUN_STAMP)
	RAFTKV_NATIVE=0 $(BIN)/python -c 'import kvserver.native as n; n.build()'

run: $(RUN_STAMP) $(NATIVE)
	$(BIN)/raftkv cluster up --nodes 3

# The Spark example pipeline (kvserver/spark/demo.py). ENDPOINTS=url,url,... uses a running
# raftkv; otherwise a local three-node one is started in raftkv-data/spark-demo (ports 2479,
# 22479, 32479) for the run and kept on disk, so a second `make spark-demo` continues.
spark-demo: $(DEV_STAMP) $(NATIVE)
	$(BIN)/python -m kvserver.spark.demo $(if $(ENDPOINTS),--endpoints $(ENDPOINTS),--start-cluster raftkv-data/spark-demo) --out $(or $(OUT),spark-demo-out) $(DEMO_ARGS)

# What to run before a commit (a few minutes): lint, format, types, then the default suite.
test: lint typecheck $(DEV_STAMP) $(NATIVE)
	$(BIN)/pytest -q -m "not slow"

# The slow-marked suites (Spark, chaos, Docker, S3, etcd compatibility, the long simulation):
# about 50 minutes on a 2-core machine, a fifth of it the Spark cluster in compose. CI runs
# `make test test-slow`; the slowest tests are listed at the end, to see where CI's time goes.
test-slow: $(DEV_STAMP) $(NATIVE)
	$(BIN)/pytest -q -m slow --durations=30

test-fast: $(DEV_STAMP) $(NATIVE)
	$(BIN)/pytest -q -m "not slow" -x

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Static types, with the config in pyproject.toml ([tool.mypy]: the core packages and the wire
# contract strict, the rest in mypy's default mode). Tests are not checked.
typecheck: $(DEV_STAMP)
	$(BIN)/mypy raft raftpb wal snap bolt kvserver

# etcd's gRPC API: regenerate kvserver/etcdpb's *_pb2.py, *_pb2.pyi and *_pb2_grpc.py from its
# .proto files with the pinned grpcio-tools, after editing a .proto; commit the result.
# The repo root is the include root, so the descriptors are named kvserver/etcdpb/*.proto and
# the code imports `from kvserver.etcdpb import ...`. tests/grpcapi/test_genproto.py runs the
# same command and fails when the committed files differ.
genproto: $(DEV_STAMP)
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. kvserver/etcdpb/*.proto

# Three members in containers, with `docker compose` or `docker-compose`; builds the base
# image from Debian's packages when no image registry answers (deploy/up.sh).
compose-up:
	deploy/up.sh up

compose-down:
	deploy/up.sh down

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache $(NATIVE) .build/native
	find kvserver -name '*.so' -delete
	rm -f kvserver_native__mypyc.*.so

# etcd's own Go client (clientv3 3.4) as a load generator (benchmarks/etcdbench): built from
# Debian's golang-etcd-server-dev in GOPATH mode, offline; the binary is never committed.
ETCD_BENCH := .build/etcd-bench
etcd-bench: $(ETCD_BENCH)
$(ETCD_BENCH): benchmarks/etcdbench/main.go
	mkdir -p .build
	cd benchmarks/etcdbench && GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE=$(CURDIR)/.build/gocache go build -o $(CURDIR)/$(ETCD_BENCH) .
