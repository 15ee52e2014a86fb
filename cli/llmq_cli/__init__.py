"""The ``llmq`` command: local dev stack, demo, simulator and capacity math."""
