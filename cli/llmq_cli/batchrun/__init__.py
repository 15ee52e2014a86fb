"""``llmq batch run``: a job larger than one batch, as shards that fit the target's limits, submitted, polled,
collected into a manifest keyed by custom_id, retried for the ids still missing, and joined into one output file.

Modules: ``jobfile`` (read and check the job), ``shard`` (cut it to fit), ``outcomes`` (sort result lines),
``manifest`` (SQLite state), ``api`` (the HTTP edge), ``pipeline`` (the loop), ``report`` (files and summary),
``command`` (the typer command).
"""
