# One image for every llmq service. EXTRAS=worker adds torch + transformers (the llmq-tiny / checkpoint workers).
# The packages are exactly the versions uv.lock pins (those the tests ran with); then the project itself, without deps.
FROM python:3.11-slim
ARG EXTRAS=""
WORKDIR /app
RUN pip install --no-cache-dir uv
COPY pyproject.toml uv.lock README.md ./
COPY libs libs
COPY services services
COPY cli cli
COPY bench bench
RUN set --; for extra in $(echo "$EXTRAS" | tr ',' ' '); do set -- "$@" --extra "$extra"; done; \
    uv export --frozen --no-emit-project --no-hashes --quiet "$@" -o /tmp/requirements.txt \
    && uv pip install --system --no-cache -r /tmp/requirements.txt \
    && uv pip install --system --no-cache --no-deps . \
    && rm /tmp/requirements.txt
# Not root: a service that is broken into gets an unprivileged user, owning only the batch file store's mount point.
RUN useradd --system --uid 10001 --no-create-home --home-dir /app llmq \
    && install -d -o llmq -g llmq -m 0700 /data/files
USER llmq
ENV PYTHONUNBUFFERED=1
ENTRYPOINT []
