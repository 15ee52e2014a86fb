"""In-process tier: every service's loop in the test's own process against the run's one Kafka broker and Redis."""
