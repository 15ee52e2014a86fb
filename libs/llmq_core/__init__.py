"""Shared code of every llmq service: wire schemas, names, settings, clients, telemetry."""
