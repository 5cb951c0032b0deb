# Stockade: `make run` starts the shop, `make test` runs every test.
# Both install what is missing first (Debian/Ubuntu; elsewhere they say what to install).

SHELL := /bin/bash
APT := DEBIAN_FRONTEND=noninteractive apt-get
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test build deps-run deps-test lint clean

## run: install PostgreSQL and Redis if missing, build, start the shop in local mode
run: deps-run
	cargo build --release --locked
	./target/release/stockade serve

## test: install test dependencies if missing, then lint and run the whole suite
test: deps-test lint
	cargo test --locked --all-targets

## lint: formatting, clippy, and the docker-compose file
lint:
	cargo fmt --check
	cargo clippy --locked --all-targets -- -D warnings
	docker-compose -f docker-compose.yml config -q

build:
	cargo build --release --locked

clean:
	cargo clean

# Installs the Debian packages named in $(1) when the check $(2) fails.
define ensure
	@if ! ( $(2) ) >/dev/null 2>&1; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    echo "Installing $(1)"; \
	    $(SUDO) $(APT) update -qq && $(SUDO) $(APT) install -y -qq $(1) >/dev/null; \
	  else \
	    echo "Please install: $(3)"; exit 1; \
	  fi; \
	fi
endef

PG_CHECK := command -v initdb || ls /usr/lib/postgresql/*/bin/initdb
deps-run:
	$(call ensure,postgresql,$(PG_CHECK),PostgreSQL server (postgres and initdb; Fedora: postgresql-server; macOS: brew install postgresql))
	$(call ensure,redis-server,command -v redis-server,Redis server (Fedora: redis; macOS: brew install redis))

deps-test: deps-run
	$(call ensure,chromium chromium-driver,command -v chromium && command -v chromedriver,Chromium and ChromeDriver)
	$(call ensure,docker-compose,command -v docker-compose,docker-compose (to validate docker-compose.yml))
