"""batcher: forms accelerator batches from queued requests and routes each to a worker."""
