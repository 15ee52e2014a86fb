"""The API pod's side of Anthropic's Message Batches (``/v1/messages/batches``) on the same job engine as
``/v1/batches`` (:class:`~llmq_api.batch_jobs.builder.JobBuilder`, the result-routers' driver and ledger): one
engine, two formats at the edge. Every batch belongs to the tenant that created it; any other tenant, and
``/v1/batches``, get the same 404 as for a missing one.

Creating a batch streams its body: each request is split off (:mod:`~llmq_api.batch_jobs.message_requests`),
checked as an input line of ``/v1/messages`` (a chunk at a time, in a thread) and staged into the prepared file and
the ledger, so the pod holds one chunk at a time. A structural fault (a custom_id not 1-64 of ``[A-Za-z0-9_-]``, a
repeated one, no params object, too many requests) refuses the whole create 400; a request whose params fail
validation is accepted and ends ``errored`` with ``invalid_request_error``, as Anthropic does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec

from llmq_api.auth import Principal
from llmq_api.batch_jobs import inputs, message_render
from llmq_api.batch_jobs.access import check_deferred, not_found, take_request
from llmq_api.batch_jobs.builder import InvalidInput, JobBuilder
from llmq_api.batch_jobs.message_requests import RequestSplitter, input_line
from llmq_api.errors import ApiError, invalid
from llmq_core import ids, wire
from llmq_core.constants import ANTHROPIC
from llmq_core.requests import echo
from llmq_jobs import jobs, lines
from llmq_jobs.jobs import JobView

MAX_LIST_LIMIT = 1000  # Anthropic's
# A structural fault of a request (inputs' codes): the param it names within the request, and a message in the
# Messages API's terms (None: the engine's own).
_FAULTS = {
    "missing_custom_id": ("custom_id", "custom_id is required"),
    "invalid_custom_id": ("custom_id", None),
    "duplicate_custom_id": ("custom_id", None),
    "invalid_body": ("params", "params must be an object: the Messages request"),
}


class MessageBatches:
    """``/v1/messages/batches`` of one API pod, on ``builder``'s job engine (shared with ``/v1/batches``)."""

    def __init__(self, builder: JobBuilder) -> None:
        self.builder = builder
        self.settings, self.store, self.files = builder.settings, builder.store, builder.files
        self.clock, self.limiter = builder.clock, builder.limiter

    async def create(self, principal: Principal, body: AsyncIterator[bytes]) -> JobView:
        """Create a batch from the chunks of a create body. Raises 400 (the body's shape, a structural fault of a
        request, too many requests, an estimate over the batch quota, results over the job's bound), 403 (the key
        may not use the deferred class), 413 (a request over the line bound), 429 (as ``/v1/batches``)."""
        check_deferred(principal, "create message batches")
        await take_request(self.limiter, principal)
        jobs_settings = self.settings.jobs
        expiry_s = jobs_settings.message_batch_expiry_s
        spec = self.builder.new_spec(
            ids.batch_job_id(self.settings.region.name),
            principal,
            jobs.MESSAGES_ENDPOINT,
            expiry_s,
            input_file_id="",
            completion_window=f"{expiry_s}s",
            output_file_id="",
            error_file_id="",
            api_format=ANTHROPIC,
        )
        checker = self.builder.checker(jobs.MESSAGES_ENDPOINT, jobs_settings.message_batch_max_requests)
        splitter = RequestSplitter(jobs_settings.batch_max_line_bytes)
        try:
            return await self.builder.build(spec, principal, _requests(body, splitter, checker), checker.checked)
        except InvalidInput as failed:
            raise _refusal(failed.checked.errors[0], jobs_settings.message_batch_max_requests) from None

    async def get(self, principal: Principal, batch_id: str) -> JobView:
        job = await self.store.jobs.get_job(batch_id)
        if job is None or job.spec.tenant_id != principal.tenant_id or job.spec.api_format != ANTHROPIC:
            raise not_found("message batch", batch_id)
        return job

    async def list(
        self, principal: Principal, before_id: str | None, after_id: str | None, limit: int
    ) -> tuple[list[JobView], bool]:
        """The tenant's Message Batches, newest first: those just newer than ``before_id``, or older than
        ``after_id`` (ids of earlier pages), or the newest; (batches, has_more)."""
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise invalid(f"limit must be between 1 and {MAX_LIST_LIMIT}, got {echo(limit)}", param="limit")
        if before_id and after_id:
            raise invalid("Give before_id or after_id, not both", param="before_id")
        before = await self.get(principal, before_id) if before_id else None
        after = await self.get(principal, after_id) if after_id else None
        return await self.store.jobs.list_jobs(principal.tenant_id, after, limit, ANTHROPIC, before=before)

    async def cancel(self, principal: Principal, batch_id: str) -> JobView:
        """Ask for a cancel: ``canceling`` now, ``ended`` once its running requests stopped (the driver gives them
        ``batch_end_grace_ms``); the rest end ``canceled``. A canceling or ended batch is returned as it is."""
        await self.get(principal, batch_id)
        now_ms = self.clock.now_ms()
        await self.store.jobs.move_status(
            batch_id, [jobs.VALIDATING, jobs.IN_PROGRESS], jobs.CANCELLING, now_ms // 1000, end_ms=now_ms
        )
        return await self.builder.read(batch_id)

    async def delete(self, principal: Principal, batch_id: str) -> None:
        """Forget an ended batch and its results; 400 while it is in progress or canceling."""
        job = await self.get(principal, batch_id)
        if message_render.processing_status(job) != "ended":
            raise invalid(
                f"Message Batch {batch_id} is {message_render.processing_status(job)}: only an ended batch may be "
                "deleted (cancel it first)",
                param="message_batch_id",
            )
        await self.store.jobs.delete_job(batch_id)
        if self.store.jobs.log is not None:
            await self.store.jobs.log.drop_record(batch_id)
        await self.files.delete(job.spec.results_path)

    async def results(self, principal: Principal, batch_id: str) -> AsyncIterator[bytes]:
        """The results as JSONL, one line per request (any order), streamed from the results file. A canceling
        batch is waited for (its end takes ``batch_end_grace_ms`` and a driver's tick; at most a lease more); 400
        for one in progress, or one still canceling after that. Raises before the first chunk."""
        job = await self.get(principal, batch_id)
        jobs_settings = self.settings.jobs
        give_up_ms = self.clock.now_ms() + jobs_settings.batch_end_grace_ms + jobs_settings.batch_lease_ms
        while message_render.processing_status(job) == "canceling" and self.clock.now_ms() < give_up_ms:
            await asyncio.sleep(jobs_settings.batch_tick_ms / 1000)
            job = await self.get(principal, batch_id)
        status = message_render.processing_status(job)
        if status != "ended":
            raise invalid(
                f"Message Batch {batch_id} is {status}: its results are ready once it has ended",
                param="message_batch_id",
            )
        return _result_lines(self.files.iter_bytes(job.spec.results_path))


async def _requests(
    body: AsyncIterator[bytes], splitter: RequestSplitter, checker: inputs.InputChecker
) -> AsyncIterator[list[inputs.InputLine]]:
    """The body's requests as checked input lines, a chunk's at a time (each chunk split and checked in a thread);
    the rest is left unread once there are too many."""

    def check(chunk: bytes) -> list[inputs.InputLine]:
        first = splitter.count
        requests = splitter.feed(chunk) if chunk else splitter.end()
        return [line for i, raw in enumerate(requests, first) for line in checker.check(input_line(i, raw))]

    async for chunk in body:
        yield await asyncio.to_thread(check, chunk)
        if checker.stopped:
            return
    yield check(b"") + checker.end()


def _refusal(fault: jobs.LineError, max_requests: int) -> ApiError:
    """The 400 of a create whose requests have a structural fault (the first one found)."""
    if fault.code == "too_many_lines":
        return invalid(f"A Message Batch has at most {max_requests} requests", param="requests")
    if fault.code == "empty_file":
        return invalid("requests must hold at least one request", param="requests")
    where = f"requests[{(fault.line or 1) - 1}]"
    param, message = _FAULTS.get(fault.code, (None, None))
    return invalid(message or fault.message, param=f"{where}.{param}" if param else where, code=fault.code)


async def _result_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The results file's ``wire.FinalResult`` lines as Anthropic's result lines, a chunk at a time."""
    rest = b""
    async for chunk in chunks:
        *lines, rest = (rest + chunk).split(b"\n")
        rendered = [_render(line) for line in lines if line]
        if rendered:
            yield b"".join(rendered)
    if rest.strip():
        yield _render(rest)


def _render(line: bytes) -> bytes:
    result = msgspec.json.decode(line, type=wire.FinalResult)
    return msgspec.json.encode(lines.result_line(result)) + b"\n"
