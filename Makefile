# Stockade: `make run` starts the shop, `make test` runs every test.
# Both install what is missing first (Debian/Ubuntu; elsewhere they say what to install).

SHELL := /bin/bash
APT := DEBIAN_FRONTEND=noninteractive apt-get
# The API fuzzer the contract test runs, pinned, in a virtualenv of the project's own.
SCHEMATHESIS_VERSION := 4.32.5
# The fake Stripe server that local mode and the payment tests run (a process, never linked).
LOCALSTRIPE_VERSION := 1.15.10
VENV := .venv
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test test-stress deps-stress bench cluster build deps-run deps-test deps-bench deps-cluster deps-schemathesis \
	deps-axe deps-localstripe deps-lighthouse lighthouse lint clean sqlx-cli sqlx-prepare

## run: install PostgreSQL and Redis if missing, build, start the shop in local mode
run: deps-run
	cargo build --release --locked
	./target/release/stockade serve

## test: install test dependencies if missing, then lint and run the whole suite (which
## prints its ten slowest tests and fails if a process a test started outlives it)
test: deps-test lint
	scripts/test-suite.sh

## test-stress: the whole suite (lint aside) with both cores kept busy by stress-ng
test-stress: deps-test deps-stress
	scripts/test-stress.sh

## cluster: HAProxy, three app processes, PgBouncer, three PostgreSQL nodes under Patroni
## and etcd, Redis Sentinel
cluster: deps-cluster
	cargo build --release --locked
	./target/release/stockade cluster

## bench: the app's rates next to pgbench's on its own durable PostgreSQL (bench-report/)
bench: deps-bench
	cargo build --release --locked
	./target/release/stockade bench

## lighthouse: Lighthouse's four scores (mobile) for the catalogue, a product and a checkout
## of the release build, with the HTML and JSON reports in lighthouse-report/
lighthouse: deps-run deps-lighthouse
	cargo build --release --locked
	scripts/lighthouse.sh

## lint: formatting, clippy, the docker-compose file, and .sqlx/ matching the queries
lint: sqlx-cli
	cargo fmt --check
	cargo clippy --locked --all-targets -- -D warnings
	docker-compose -f docker-compose.yml config -q
	scripts/sqlx-prepare.sh --check

# sqlx-cli at the version of sqlx in Cargo.toml (a few minutes to build, once).
SQLX_VERSION := $(shell sed -n 's/^sqlx = { version = "\([^"]*\)".*/\1/p' Cargo.toml)

## sqlx-cli: install `cargo sqlx` (pinned to the sqlx in Cargo.toml) if missing
sqlx-cli:
	@[ "$$(cargo sqlx --version 2>/dev/null)" = "sqlx-cli-sqlx $(SQLX_VERSION)" ] || \
	  cargo install sqlx-cli --locked --force --version $(SQLX_VERSION) \
	    --no-default-features --features postgres,rustls

## sqlx-prepare: rewrite .sqlx/ after adding or changing a `query!` (a throwaway database)
sqlx-prepare: sqlx-cli
	scripts/sqlx-prepare.sh

build:
	cargo build --release --locked

clean:
	cargo clean

# Installs what is missing with one apt-get run (Debian/Ubuntu); elsewhere names it.
# $(1): "run" (servers), "bench" (servers, pgbench), "cluster" (servers, HAProxy, PgBouncer,
# Redis Sentinel, Patroni, etcd, pgBackRest) or "test" (all of these, browser, docker-compose,
# npm for axe-core; all but "cluster" python3-venv for localstripe and schemathesis). pgbench comes with the server on Debian
# 12; newer releases ship it in postgresql-client.
define install_missing
	@missing=""; \
	( command -v initdb || ls /usr/lib/postgresql/*/bin/initdb ) >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	if [ "$(1)" != cluster ]; then \
	  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	fi; \
	if [ "$(1)" != run ]; then \
	  ( command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench ) >/dev/null 2>&1 || missing="$$missing postgresql-client"; \
	fi; \
	if [ "$(1)" = test ] || [ "$(1)" = cluster ]; then \
	  ( command -v haproxy || test -x /usr/sbin/haproxy ) >/dev/null 2>&1 || missing="$$missing haproxy"; \
	  ( command -v pgbouncer || test -x /usr/sbin/pgbouncer ) >/dev/null 2>&1 || missing="$$missing pgbouncer"; \
	  command -v redis-sentinel >/dev/null 2>&1 || missing="$$missing redis-sentinel"; \
	  command -v pgbackrest >/dev/null 2>&1 || missing="$$missing pgbackrest"; \
	  command -v patroni >/dev/null 2>&1 || missing="$$missing patroni"; \
	  command -v etcd >/dev/null 2>&1 || missing="$$missing etcd-server"; \
	fi; \
	if [ "$(1)" = test ]; then \
	  ( command -v chromium && command -v chromedriver ) >/dev/null 2>&1 || missing="$$missing chromium chromium-driver"; \
	  command -v docker-compose >/dev/null 2>&1 || missing="$$missing docker-compose"; \
	  command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	fi; \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    echo "Installing:$$missing (apt-get; a minute or two on a fresh machine)"; \
	    echo "  updating the package lists..."; \
	    $(SUDO) $(APT) update -qq || exit 1; \
	    set -o pipefail; \
	    $(SUDO) $(APT) install -y -q $$missing | (grep --line-buffered '^Setting up ' | sed 's/^/  /' || true) || exit 1; \
	  else \
	    echo "Please install:$$missing"; \
	    echo "(a PostgreSQL server with postgres and initdb; a Redis server; for the tests and the bench pgbench; for the tests and the cluster HAProxy, PgBouncer, Redis Sentinel, Patroni, etcd and pgBackRest; for the tests Chromium with ChromeDriver, docker-compose and npm)"; \
	    exit 1; \
	  fi; \
	fi
endef

deps-run:
	$(call install_missing,run)
	@$(MAKE) --no-print-directory deps-localstripe

deps-test:
	$(call install_missing,test)
	@$(MAKE) --no-print-directory deps-schemathesis deps-localstripe deps-axe

# axe-core for the browser tests' accessibility checks, as tools/axe/package-lock.json pins
# it (npm ci), unless that lock is already installed.
deps-axe: tools/axe/node_modules/.package-lock.json
tools/axe/node_modules/.package-lock.json: tools/axe/package-lock.json
	@echo "Installing axe-core into tools/axe/ (npm ci)"
	@npm ci --prefix tools/axe --no-audit --no-fund --ignore-scripts --loglevel=error

# schemathesis $(SCHEMATHESIS_VERSION) in $(VENV)/ (from PyPI), unless that version is there.
deps-schemathesis:
	@$(VENV)/bin/schemathesis --version 2>/dev/null | grep -qxF "schemathesis, version $(SCHEMATHESIS_VERSION)" || { \
	  echo "Installing schemathesis $(SCHEMATHESIS_VERSION) into $(VENV)/ (pip; a minute on a fresh machine)"; \
	  python3 -m venv $(VENV) && \
	  $(VENV)/bin/pip install -q --disable-pip-version-check "schemathesis==$(SCHEMATHESIS_VERSION)"; \
	}

# localstripe $(LOCALSTRIPE_VERSION) in $(VENV)/ (from PyPI), unless that version is there:
# the Stripe-compatible server that local mode pays with and the payment tests start.
deps-localstripe:
	@$(VENV)/bin/pip show localstripe 2>/dev/null | grep -qxF "Version: $(LOCALSTRIPE_VERSION)" || { \
	  echo "Installing localstripe $(LOCALSTRIPE_VERSION) into $(VENV)/ (pip; a minute on a fresh machine)"; \
	  python3 -m venv $(VENV) && \
	  $(VENV)/bin/pip install -q --disable-pip-version-check "localstripe==$(LOCALSTRIPE_VERSION)"; \
	}

# Lighthouse as tools/lighthouse/package-lock.json pins it (12.2.3: 13 needs Node 22), and
# Chromium to run it in.
deps-lighthouse:
	@( command -v chromium && command -v npm && command -v curl ) >/dev/null 2>&1 || { \
	  echo "Installing: chromium npm curl (apt-get)"; \
	  $(SUDO) $(APT) update -qq && $(SUDO) $(APT) install -y -q chromium npm curl >/dev/null; \
	}
	@$(MAKE) -s --no-print-directory tools/lighthouse/node_modules/.package-lock.json
tools/lighthouse/node_modules/.package-lock.json: tools/lighthouse/package-lock.json
	@echo "Installing Lighthouse into tools/lighthouse/ (npm ci)"
	@npm ci --prefix tools/lighthouse --no-audit --no-fund --ignore-scripts --loglevel=error

deps-bench:
	$(call install_missing,bench)
	@$(MAKE) --no-print-directory deps-localstripe

deps-stress:
	@command -v stress-ng >/dev/null 2>&1 || { \
	  echo "Installing: stress-ng (apt-get)"; \
	  $(SUDO) $(APT) install -y -q stress-ng >/dev/null || \
	  { $(SUDO) $(APT) update -qq && $(SUDO) $(APT) install -y -q stress-ng >/dev/null; }; \
	}

deps-cluster:
	$(call install_missing,cluster)
