"""Engine implementations: ``simulated`` (fixed batch time) and ``transformers`` (continuous batching, imported lazily)."""
