# Herald — the two entry points a fresh machine needs: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?= -m "not soak" --durations=30
# Two workers (pytest-xdist), each module whole on one; the modules that start their own
# Herald cluster, and the Spark tests, each one after the other (tests/conftest.py).
PYTEST_WORKERS ?= -n 2 --dist loadgroup

.PHONY: run test lint bench compare clean chromium etcd iptables nemesis soak

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The SDK (herald-client, package `herald`) first: the application depends on it and it
# is not on PyPI. Both editable, so the checkout is what runs.
$(VENV)/.installed: pyproject.toml client/pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ./client
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml client/pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ./client
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed

## Install and run the server on its embedded defaults (./herald-data, 127.0.0.1:8080).
run: $(VENV)/.installed
	$(BIN)/herald serve

## Install everything the tests need, lint, type-check and run the whole suite.
test: $(VENV)/.installed-test chromium etcd iptables
	@command -v java >/dev/null || { echo "Spark tests need Java 17: apt-get install -y openjdk-17-jre-headless"; exit 1; }
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

## The browser the console tests drive (Debian's chromium; Playwright downloads nothing).
chromium:
	@command -v chromium >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

## The coordination store the cluster tests start on loopback (Debian's etcd-server 3.4).
etcd:
	@command -v etcd >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server; }

## The partitions of the nemesis (tests/nemesis: iptables on loopback, as root).
iptables:
	@command -v iptables >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables; }

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## The tests of many minutes `make test` leaves out (10,000 topics under the open-files limit).
soak: $(VENV)/.installed-test etcd
	$(BIN)/pytest -m soak

## A Jepsen-style run against a real cluster (issue 25; root: iptables). Exit 1 on a violation.
SEED    ?= 1
MINUTES ?= 60
nemesis: $(VENV)/.installed-test etcd iptables
	$(BIN)/python -m tests.nemesis --seed $(SEED) --minutes $(MINUTES) $(if $(OUT),--out $(OUT))

## Benchmarks print figures (they are not tests): storage engine, then end to end.
bench: $(VENV)/.installed-test
	$(BIN)/python -m bench.storage
	$(BIN)/python -m bench.herald_bench

## Herald beside Redis Streams, NATS JetStream and RabbitMQ (their servers from apt-get).
compare: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	@command -v redis-server >/dev/null && command -v nats-server >/dev/null \
		&& [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq redis-server nats-server rabbitmq-server; }
	$(BIN)/python -m bench.compare

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
