"""llmq worker: runs Batches from one partition of llmq.batches on an engine and answers every request."""
