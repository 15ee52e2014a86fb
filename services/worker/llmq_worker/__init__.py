"""llmq worker: runs Batches from one partition of llmq.batches on an engine and answers every request.

Engines (``--engine``): ``simulated`` (llmq-sim, fixed batch time), ``transformers`` (continuous batching on transformers'
ContinuousBatchingManager) and ``vllm`` (optional extra, GPU). Sampling follows OpenAI: ``seed`` reproduces its answer
exactly on llmq-sim (its replay is deterministic) and for a request run alone on the transformers engine (each choice
draws from its own seeded generator); in mixed batches, and on vLLM across GPUs or versions, it is best effort, since
other batch shapes can change the logits' last bits. ``logit_bias`` ids are checked against the model's vocabulary (an
unknown id: ``invalid_request_error``, not retried) and applied by the transformers and vllm engines; llmq-sim checks them
but its replay ignores them.
"""
