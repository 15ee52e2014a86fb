# One image for every llmq service. EXTRAS=worker adds torch + transformers (the llmq-tiny / checkpoint workers).
FROM python:3.11-slim
ARG EXTRAS=""
WORKDIR /app
COPY pyproject.toml README.md ./
COPY libs libs
COPY services services
COPY cli cli
COPY bench bench
RUN pip install --no-cache-dir ".${EXTRAS:+[$EXTRAS]}"
ENV PYTHONUNBUFFERED=1
ENTRYPOINT []
