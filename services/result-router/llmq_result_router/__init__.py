"""result-router: delivers every final result that is not a held HTTP connection (stored results, Kafka reply topics)."""
