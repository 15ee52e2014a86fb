"""Batch jobs and files in Redis, one part per thing it guards: file records (:class:`FileIndex`), the tenants' byte
quotas (:class:`Quotas`), job records (:class:`JobTable`), the per-line ledger (:class:`Ledger`), the drivers' leases
(:class:`Leases`) and the regions' claims (:class:`Owners`). :class:`JobStore` holds one of each over one Redis.

Shared by the API pod (creates files and jobs, reads them, asks for a cancel) and the result-router (settles lines,
drives jobs). Key names: :mod:`llmq_core.constants`; line states and statuses: :mod:`llmq_jobs.jobs`.
"""

from __future__ import annotations

from redis.asyncio import Redis

from llmq_jobs.joblog import JobLog
from llmq_jobs.store.fencing import Leases, Owners
from llmq_jobs.store.files import FileIndex
from llmq_jobs.store.ledger import Ledger, LineChange
from llmq_jobs.store.quotas import Quotas
from llmq_jobs.store.table import JobTable

__all__ = ["FileIndex", "JobStore", "JobTable", "Leases", "Ledger", "LineChange", "Owners", "Quotas"]


class JobStore:
    """The parts over one Redis; ``log`` (the job log the parts write ahead of Redis) is None only in tests of pure
    Redis behaviour."""

    def __init__(self, redis: Redis, log: JobLog | None = None) -> None:
        self.redis = redis
        self.log = log
        self.files = FileIndex(redis)
        self.quotas = Quotas(redis)
        self.jobs = JobTable(redis, log, self.quotas)
        self.ledger = Ledger(redis, log)
        self.leases = Leases(redis)
        self.owners = Owners(redis)
