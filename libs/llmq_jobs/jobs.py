"""Batch jobs (OpenAI ``/v1/batches``): records, ledger line states and the completion window (Redis keys: constants).

Pure: no I/O. The API pod creates a job (:class:`JobSpec` plus one ledger entry per input line); the result-router
drives it (produces its lines as ``deferred`` GenerationRequests with ``reply_to=JobReply``, settles their results) and
finalizes it. Both read and write it through :mod:`llmq_jobs.store`. Times: ``*_ms`` epoch milliseconds, ``*_at``
epoch seconds (OpenAI's unit).

A line's ledger state is one short string, compared and swapped atomically in Redis:
``p<n>`` pending in round ``n`` (queued or produced), ``r<n>`` waiting for retry round ``n``, and the terminal
``s`` succeeded, ``e`` errored, ``c`` canceled, ``x`` expired.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final, Literal

import msgspec

from llmq_core import ids, wire
from llmq_core.constants import ANTHROPIC, OPENAI
from llmq_core.requests import echo

if TYPE_CHECKING:
    from llmq_core.settings import JobsSettings

# --- batch statuses (OpenAI spelling) and endpoints ---------------------------------------------------------------

VALIDATING: Final = "validating"
IN_PROGRESS: Final = "in_progress"
FINALIZING: Final = "finalizing"
COMPLETED: Final = "completed"
FAILED: Final = "failed"
EXPIRED: Final = "expired"
CANCELLING: Final = "cancelling"
CANCELLED: Final = "cancelled"
STATUSES: Final = (VALIDATING, IN_PROGRESS, FINALIZING, COMPLETED, FAILED, EXPIRED, CANCELLING, CANCELLED)  # in order
TERMINAL_STATUSES: Final = frozenset({COMPLETED, FAILED, EXPIRED, CANCELLED})
ACTIVE_STATUSES: Final = frozenset({IN_PROGRESS, FINALIZING, CANCELLING})  # statuses the result-router drives

# OpenAI batch endpoint -> wire.Endpoint
BATCH_ENDPOINTS: Final[dict[str, wire.Endpoint]] = {
    "/v1/chat/completions": "chat.completions",
    "/v1/completions": "completions",
}
MESSAGES_ENDPOINT: Final = "/v1/messages"  # the endpoint of every Message Batch's requests (Anthropic's Messages API)


def wire_endpoint(endpoint: str) -> wire.Endpoint:
    """The internal endpoint of a job's ``endpoint`` (Anthropic's messages run as chat completions)."""
    return "chat.completions" if endpoint == MESSAGES_ENDPOINT else BATCH_ENDPOINTS[endpoint]


FILE_PURPOSE_BATCH: Final = "batch"
FILE_PURPOSE_OUTPUT: Final = "batch_output"

# --- ledger line states -------------------------------------------------------------------------------------------

PENDING: Final = "p"
RETRY: Final = "r"
SUCCEEDED: Final = "s"
ERRORED: Final = "e"
CANCELED: Final = "c"
LINE_EXPIRED: Final = "x"
TERMINAL_LINE_STATES: Final = frozenset({SUCCEEDED, ERRORED, CANCELED, LINE_EXPIRED})
OUTCOME_STATE: Final = {
    wire.Outcome.SUCCEEDED: SUCCEEDED,
    wire.Outcome.ERRORED: ERRORED,
    wire.Outcome.CANCELED: CANCELED,
    wire.Outcome.EXPIRED: LINE_EXPIRED,
}
# job hash counter of each terminal state, named by its outcome (request_counts: completed = succeeded, failed = the
# other three)
STATE_COUNTER: Final = {state: outcome.value for outcome, state in OUTCOME_STATE.items()}


def pending(round_: int) -> str:
    """The state of a line queued or produced in round ``round_`` (0: first run)."""
    return f"{PENDING}{round_}"


def retry(round_: int) -> str:
    """The state of a line waiting for retry round ``round_`` (>= 1)."""
    return f"{RETRY}{round_}"


def parse_state(state: str) -> tuple[str, int]:
    """``"p2"`` -> ``("p", 2)``; terminal states have round 0."""
    return state[:1], int(state[1:] or 0)


# --- ids ----------------------------------------------------------------------------------------------------------

CUSTOM_ID_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


def line_request_id(batch_id: str, custom_id: str, round_: int = 0) -> str:
    """The request id of one line's run: the same for every production of the same round (duplicates are suppressed
    by request id downstream), a new one per retry round (a late result of an old round is recognised as stale)."""
    base = f"{batch_id}:{custom_id}"
    return base if round_ == 0 else f"{base}:{round_}"


def unrun_line_result(
    batch_id: str,
    custom_id: str,
    outcome: wire.Outcome,
    error: wire.ErrorInfo,
    *,
    finished_ms: int,
    round_: int = 0,
    model: str = "",
    **fields,
) -> wire.FinalResult:
    """The result of round ``round_`` of a line that never ran (its body was invalid, or its job ended first): no
    choices, no usage; ``model`` when known, ``fields``: what else is (tenant_id, endpoint, created_ms)."""
    return wire.FinalResult(
        request_id=line_request_id(batch_id, custom_id, round_),
        outcome=outcome,
        model=model,
        reply_to=wire.JobReply(batch_id=batch_id, custom_id=custom_id),
        error=error,
        finished_ms=finished_ms,
        **fields,
    )


def output_line_id(request_id: str, prefix: str = "batch_req_") -> str:
    """OpenAI's ``batch_req_...`` id of an output line (``prefix`` ``msg_``: the message of a Message Batch's
    result), stable for a request id."""
    return prefix + hashlib.sha256(request_id.encode()).hexdigest()[:24]


# --- completion window --------------------------------------------------------------------------------------------

_WINDOW_RE: Final = re.compile(r"([1-9][0-9]{0,8})([smh])")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600}


def parse_window(text: str, max_s: int) -> int:
    """``completion_window`` in seconds: ``<n>s``, ``<n>m`` or ``<n>h`` (OpenAI's ``24h`` included), at most ``max_s``.

    Raises ValueError with a message for the client.
    """
    match = _WINDOW_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"completion_window must look like 24h, 90s or 10m, got {echo(text)}")
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds > max_s:
        raise ValueError(f"completion_window must be at most {max_s}s, got {echo(text)}")
    return seconds


# OpenAI's expiration policies (files' ``expires_after``, batches' ``output_expires_after``): seconds after the file's
# creation, the one anchor there is.
EXPIRY_ANCHOR: Final = "created_at"
EXPIRY_MIN_S: Final = 3_600  # 1 hour
EXPIRY_MAX_S: Final = 2_592_000  # 30 days


def check_expiry(anchor: object, seconds: object) -> tuple[str, str] | None:
    """What is wrong with an expiration policy: (its field, a message for the client); None for one OpenAI accepts."""
    if anchor != EXPIRY_ANCHOR:
        return "anchor", f"anchor must be '{EXPIRY_ANCHOR}', got {echo(anchor)}"
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not EXPIRY_MIN_S <= seconds <= EXPIRY_MAX_S:
        return "seconds", f"seconds must be an integer between {EXPIRY_MIN_S} and {EXPIRY_MAX_S}, got {echo(seconds)}"
    return None


def kept_s(expires_after_s: int | None, retention_s: int) -> int:
    """How long a file is kept: its expiration policy's seconds, at most the deployment's retention (the default)."""
    return retention_s if expires_after_s is None else min(expires_after_s, retention_s)


# --- records --------------------------------------------------------------------------------------------------------


class FileRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A file of the ``/v1/files`` API. ``path`` is its object in the file store (relative to the store root);
    output and error files of a job are rendered from the job's results (``batch_id`` and ``kind`` say which)."""

    id: str
    tenant_id: str
    filename: str
    purpose: str
    bytes: int = 0
    created_at: int
    expires_at: int | None = None
    path: str = ""
    batch_id: str | None = None
    kind: Literal["input", "output", "error"] = "input"
    sized: bool = False  # an output or error file's ``bytes`` were counted (once its job ended: see the API's files)


class LineError(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a failed batch's ``errors.data`` (OpenAI shape); ``line`` counts from 1."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a job is, fixed when it is created.

    ``total`` counts every request line; ``runnable`` those that passed validation and are in the prepared file
    ``prepared_path`` (one JSON ``wire.GenerationRequest`` per line, round 0). ``results_path`` receives the job's
    results (JSON ``wire.FinalResult`` per line) when it ends. ``expires_ms`` = created + completion window.
    """

    id: str
    tenant_id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    created_ms: int
    expires_ms: int
    metadata: dict[str, str] | None = None
    output_file_id: str
    error_file_id: str
    total: int = 0
    runnable: int = 0
    prepared_path: str = ""
    results_path: str = ""
    result_bytes: int = 0  # the most result bytes its ledger may hold: reserved from the tenant's bound while it runs
    # The API the job was created through (constants.OPENAI: /v1/batches; constants.ANTHROPIC: /v1/messages/batches):
    # its listing, its retention, whether it has output/error files. A str, as wire.GenerationRequest.api_format.
    api_format: str = OPENAI
    output_expires_after_s: int | None = None  # the create's output_expires_after (None: the retention)


COUNTERS: Final = (
    *STATE_COUNTER.values(),
    "retried",
    "dead_letters",
    "produced",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
)


class JobView(msgspec.Struct, frozen=True, kw_only=True):
    """A job as read from its Redis hash: the spec, the status with its timestamps, the counters, the errors.

    ``cursor`` is the byte offset in the prepared file up to which lines were produced (round 0).
    """

    spec: JobSpec
    status: str
    times: dict[str, int] = {}  # status -> epoch s it was entered
    counts: dict[str, int] = {}
    errors: list[LineError] = []
    cursor: int = 0
    end_ms: int = 0  # when the cancel or the window's end began to be enforced (epoch ms); 0 before
    owner_region: str = ""  # the region of the highest claim known (the one driving it); "" when none is recorded

    def count(self, name: str) -> int:
        return self.counts.get(name, 0)

    @property
    def settled(self) -> int:
        """Lines in a terminal state."""
        return sum(self.count(name) for name in STATE_COUNTER.values())

    @property
    def done(self) -> bool:
        """Every line is in a terminal state."""
        return self.settled >= self.spec.total


# --- listings (their Redis keys: constants.tenant_files_key, constants.tenant_jobs_key) ----------------------------


def listing_member(created_ms: int, object_id: str) -> str:
    """The member of a tenant listing zset: sorts by creation time, then id."""
    return f"{created_ms:015d}:{object_id}"


# --- the job log (llmq_jobs.joblog): records of the llmq.jobs.* topics ---------------------------------------------


class JobRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A job's state as its llmq.jobs.specs record (key: batch id; the latest one wins): the spec, the status it
    entered last with the times of every status, when its end began, its validation errors."""

    spec: JobSpec
    status: str
    times: dict[str, int] = {}
    end_ms: int = 0
    errors: list[LineError] = []


class JobOwner(msgspec.Struct, frozen=True, kw_only=True):
    """A claim on a job (llmq.jobs.owners, key: batch id): the region that drives it, with an epoch that every
    takeover raises. The highest claim known wins (:func:`outranks`); a region drives a job only while its own claim
    is that one (fencing)."""

    batch_id: str
    region: str
    epoch: int = 0
    at_ms: int = 0
    settled: int = 0  # a takeover's: the lines settled in the ledger it took over (the rest ran again here)


def creation_claim(batch_id: str) -> JobOwner | None:
    """The claim a job is created with: the region its id names, epoch 0 (implied, never written: an API pod writes
    no claim); None for an id that names no region."""
    region = ids.batch_job_region(batch_id)
    return None if region is None else JobOwner(batch_id=batch_id, region=region)


def outranks(claim: JobOwner, other: JobOwner | None) -> bool:
    """Whether ``claim`` beats ``other``: the higher epoch, then (two regions that took over at once) the greater
    region name, so every region that knows both picks the same owner."""
    return other is None or (claim.epoch, claim.region) > (other.epoch, other.region)


def highest(*claims: JobOwner | None) -> JobOwner | None:
    """The claim that outranks the others (None among them: unknown; all None: None)."""
    best = None
    for claim in claims:
        if claim is not None and outranks(claim, best):
            best = claim
    return best


def line_round(result: wire.FinalResult) -> int:
    """The retry round a line's result answers (0: its first run), read from its request id
    (:func:`line_request_id`): a line whose result is of round ``r`` was retried ``r`` times."""
    reply = result.reply_to
    if not isinstance(reply, wire.JobReply):
        return 0
    suffix = result.request_id.removeprefix(line_request_id(reply.batch_id, reply.custom_id))
    return int(suffix[1:]) if suffix[:1] == ":" and suffix[1:].isdigit() else 0


def result_counts(results: Iterable[wire.FinalResult]) -> dict[str, int]:
    """A job's counters as its terminal results (its ledger) give them, the same the result-router counted while it
    settled them: lines per outcome, the tokens of the succeeded ones, the dead letters (errored retryable: out of
    rounds) and ``retried`` (the rounds each result's line ran before it). ``produced`` (round 0's progress) is not
    in the results: a rebuilt active job starts round 0 again."""
    counts: dict[str, int] = {}

    def add(name: str, n: int) -> None:
        if n:
            counts[name] = counts.get(name, 0) + n

    for result in results:
        add(result.outcome.value, 1)
        add("retried", line_round(result))
        if result.outcome is wire.Outcome.SUCCEEDED and result.usage is not None:
            add("input_tokens", result.usage.prompt_tokens)
            add("cached_tokens", result.usage.cached_tokens)
            add("output_tokens", result.usage.completion_tokens)
        elif result.outcome is wire.Outcome.ERRORED and result.error is not None and result.error.retryable:
            add("dead_letters", 1)
    return counts


RETIRED_STATUSES: Final = frozenset({COMPLETED, EXPIRED, CANCELLED})  # ended by the driver: ledger retired, expiry set


def retention_s(spec: JobSpec, settings: JobsSettings) -> int:
    """How long an ended job is kept (then 404): a Message Batch ``message_batch_retention_s``, a ``/v1/batches``
    job ``files_retention_s`` (its output and error files are kept as long)."""
    return settings.message_batch_retention_s if spec.api_format == ANTHROPIC else settings.files_retention_s


def retained_until(record: JobRecord, retention_s: int) -> int | None:
    """Epoch s at which an ended job is forgotten (the driver's ``retire``: its final status's time plus the
    retention); None for a job that runs, or one that failed validation (never retired)."""
    if record.status not in RETIRED_STATUSES:
        return None
    return record.times.get(record.status, record.spec.created_ms // 1000) + retention_s


def output_files_expire_at(spec: JobSpec, retention_s: int, ended_s: int | None = None) -> int:
    """When a job's output and error files expire. With an ``output_expires_after`` they are created when the job
    ends (``ended_s``; while it runs, the latest it may end: its window's end), so they expire that many seconds
    (at most the retention) after it; without one, the retention after the window's end."""
    if spec.output_expires_after_s is None or ended_s is None:
        return spec.expires_ms // 1000 + kept_s(spec.output_expires_after_s, retention_s)
    return ended_s + kept_s(spec.output_expires_after_s, retention_s)


def output_files(spec: JobSpec, created_at: int, expires_at: int) -> list[FileRecord]:
    """The records of a job's output and error files (rendered from its results); a Message Batch has none (its
    results are served at its ``results_url``)."""
    if spec.api_format == ANTHROPIC:
        return []
    return [
        FileRecord(
            id=file_id,
            tenant_id=spec.tenant_id,
            filename=f"{spec.id}_{kind}.jsonl",
            purpose=FILE_PURPOSE_OUTPUT,
            created_at=created_at,
            expires_at=expires_at,
            path=spec.results_path,
            batch_id=spec.id,
            kind=kind,
        )
        for file_id, kind in ((spec.output_file_id, "output"), (spec.error_file_id, "error"))
    ]
