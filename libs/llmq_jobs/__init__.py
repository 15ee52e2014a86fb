"""Batch jobs (OpenAI's /v1/files and /v1/batches): records, the Redis store, the Kafka job log, the file store and the
regions' rebuild and takeover. Imported by the API, the result-router and the CLI only (the batcher and the worker never
see a job: its lines reach them as ordinary requests)."""
