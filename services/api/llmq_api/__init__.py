"""llmq API pods: OpenAI-compatible HTTP in front of the request topics, results back over the pod's Redis channel."""
