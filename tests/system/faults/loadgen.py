"""Load generators that run through a fault and count, for every request sent, how it ended.

:class:`HttpLoad` sends OpenAI completions (plain or ``stream: true``) to API pods at a steady rate; :class:`KafkaLoad`
produces GenerationRequests with a :class:`~llmq_core.wire.KafkaReply` straight to Kafka and counts the replies on its
own reply topic. Every request ends as exactly one :class:`Ending`; a :class:`Tally` counts them and gives latencies.

Prompts are unique per request and llmq-sim replays the prompt, so an answer is checked against its own prompt: text
from someone else's request (or a stream that repeats itself) is caught, not counted as answered.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import math
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from llmq_core import constants, wire

DEV_KEY = "llmq-dev-key"
LOST_SLACK_S = 5.0  # a request with no ending this long after its deadline is lost (it hangs)
CONNECT_TIMEOUT_S = 2.0
READY_POLL_S = 0.1


class Ending(str, enum.Enum):
    """How one request ended, as its caller saw it."""

    ONCE = "answered once"  # 200 with exactly its own answer
    ERROR = "clear error"  # an OpenAI error object with a 4xx/5xx status (or an error event in a stream)
    TIMEOUT = "504"  # the deadline passed: 504, or a deadline error event in a stream
    LOST = "lost"  # nothing at all by deadline + LOST_SLACK_S
    TWICE = "answered twice"  # a second answer (Kafka reply), or a stream that repeats text
    WRONG = "wrong answer"  # an answer that is not this request's own
    DROPPED = "connection dropped"  # the server closed the connection without an answer (its process died)


@dataclass(frozen=True, slots=True)
class Record:
    """One request. ``sent_s`` is ``time.monotonic()`` at sending; ``latency_ms`` until its ending."""

    seq: int
    pod: int
    sent_s: float
    latency_ms: float
    ending: Ending
    status: int = 0
    retry_after: str | None = None
    request_id: str | None = None
    detail: str = ""


class Tally:
    """The records of one run, with counts and latency percentiles."""

    def __init__(self, records: Iterable[Record]) -> None:
        self.records = sorted(records, key=lambda r: r.seq)

    def __len__(self) -> int:
        return len(self.records)

    def count(self, ending: Ending) -> int:
        return sum(1 for r in self.records if r.ending is ending)

    def counts(self) -> dict[str, int]:
        """{ending: count} over every Ending (zeros included), in Ending order."""
        seen = Counter(r.ending for r in self.records)
        return {e.value: seen.get(e, 0) for e in Ending}

    def where(self, *, since_s: float | None = None, until_s: float | None = None, status: int | None = None) -> Tally:
        """The records matching every given filter (sent in [since_s, until_s), monotonic seconds; HTTP status)."""
        return Tally(
            r
            for r in self.records
            if (since_s is None or r.sent_s >= since_s)
            and (until_s is None or r.sent_s < until_s)
            and (status is None or r.status == status)
        )

    def percentile_ms(self, q: float) -> float:
        """The ``q`` quantile (0..1, nearest rank) of the answered requests' latencies; NaN when there are none."""
        values = sorted(r.latency_ms for r in self.records if r.ending is Ending.ONCE)
        if not values:
            return math.nan
        return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]

    def p99_ms(self) -> float:
        return self.percentile_ms(0.99)

    def failures(self) -> list[Record]:
        """The requests not answered once."""
        return [r for r in self.records if r.ending is not Ending.ONCE]

    def summary(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in self.counts().items() if v)
        return f"{len(self)} requests: {counts}; p99 {self.p99_ms():.0f} ms"


def sim_answer(prompt: str, max_tokens: int) -> str:
    """llmq-sim's completion: the prompt's own bytes from its start, cycled, ``max_tokens`` of them (ASCII prompts)."""
    data = prompt.encode()
    return bytes(data[i % len(data)] for i in range(max_tokens)).decode("utf-8", errors="ignore")


class HttpLoad:
    """Sends completions at ``rate_per_s`` to ``ports`` (round robin) from :meth:`start` until :meth:`stop`.

    Like a Kubernetes Service it follows the pods' readiness (``/readyz``, every READY_POLL_S): a request goes to its
    round-robin pod, or to the next ready one while that pod answers 503 or refuses (a draining pod keeps its listener
    open for ``LLMQ_API_SHUTDOWN_DELAY_MS`` so that this is seen first); with no pod ready, round robin. A refused
    connection is retried on the next pod, as a load balancer would (nothing reached the server). Each request carries
    ``x-llmq-timeout-ms: timeout_ms``; one without an ending by then + LOST_SLACK_S counts as lost.
    """

    def __init__(
        self,
        ports: Sequence[int],
        *,
        rate_per_s: float,
        timeout_ms: int = 20_000,
        max_tokens: int = 8,
        stream: bool = False,
        key: str = DEV_KEY,
        traffic_class: str | None = None,
        tag: str = "load",
        prompt_suffix: str = "",
    ) -> None:
        self.ports = list(ports)
        self.rate_per_s = rate_per_s
        self.timeout_ms = timeout_ms
        self.max_tokens = max_tokens
        self.stream = stream
        self.headers = {"authorization": f"Bearer {key}", "x-llmq-timeout-ms": str(timeout_ms)}
        if traffic_class:
            self.headers[constants.HTTP_TRAFFIC_CLASS] = traffic_class
        self.tag = f"{tag}-{uuid.uuid4().hex[:6]}"
        self.prompt_suffix = prompt_suffix
        self.records: list[Record] = []
        self.rerouted = 0
        self._seq = 0
        self._ids: Counter[str] = Counter()
        self._tasks: set[asyncio.Task] = set()
        self._pacer: asyncio.Task | None = None
        self._ready = [True] * len(self.ports)
        self._watcher: asyncio.Task | None = None
        # One connection per request: reusing a kept-alive one the server is closing (its timer runs while this loaded
        # process has not read the last response yet) would read as a dropped connection.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S), limits=limits)

    def start(self) -> None:
        self._watch()
        self._pacer = asyncio.create_task(self._pace())

    async def stop(self) -> Tally:
        """Stop sending, wait for every request to end (bounded by its deadline + slack), and count."""
        for task in (self._pacer, self._watcher):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self._client.aclose()
        return self.tally()

    def tally(self) -> Tally:
        """Count the requests ended so far; an id answered on two requests turns both into TWICE."""
        twice = {rid for rid, n in self._ids.items() if n > 1}
        return Tally(dataclasses.replace(r, ending=Ending.TWICE) if r.request_id in twice else r for r in self.records)

    def burst(self, count: int, pod: int | None = None) -> list[asyncio.Task]:
        """Send ``count`` requests now (to ``pod`` or round robin); returns their tasks."""
        self._watch()
        return [self._spawn(pod) for _ in range(count)]

    def _watch(self) -> None:
        if self._watcher is None and len(self.ports) > 1:
            self._watcher = asyncio.create_task(self._follow_readiness())

    async def _follow_readiness(self) -> None:
        """Only a definite answer moves a pod in or out of rotation: 503 or a refused connection out, 200 in; a slow
        probe (a loaded pod) leaves it where it is."""
        async with httpx.AsyncClient(timeout=1.0) as probe:
            while True:
                for i, port in enumerate(self.ports):
                    try:
                        self._ready[i] = (await probe.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
                    except httpx.ConnectError:
                        self._ready[i] = False
                    except httpx.HTTPError:
                        pass
                await asyncio.sleep(READY_POLL_S)

    async def _pace(self) -> None:
        interval_s = 1 / self.rate_per_s
        next_s = time.monotonic()
        while True:
            self._spawn(None)
            next_s += interval_s
            await asyncio.sleep(max(0.0, next_s - time.monotonic()))

    def _spawn(self, pod: int | None) -> asyncio.Task:
        seq = self._seq
        self._seq += 1
        task = asyncio.create_task(self._one(seq, seq % len(self.ports) if pod is None else pod))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _one(self, seq: int, pod: int) -> Record:
        prompt = f"{self.tag} #{seq}: the quick brown fox{self.prompt_suffix}"
        body = {"model": "llmq-sim", "prompt": prompt, "max_tokens": self.max_tokens, "stream": self.stream}
        sent_s = time.monotonic()
        bound_s = self.timeout_ms / 1000 + LOST_SLACK_S
        outcome: dict = {}
        try:
            async with asyncio.timeout(bound_s):
                outcome = await self._send(body, pod, sim_answer(prompt, self.max_tokens))
        except TimeoutError:
            outcome = {"ending": Ending.LOST, "detail": f"no ending within {bound_s:.0f} s"}
        fields = {"pod": pod, **outcome}
        record = Record(seq=seq, sent_s=sent_s, latency_ms=(time.monotonic() - sent_s) * 1000, **fields)
        if record.request_id and record.ending in (Ending.ONCE, Ending.WRONG):
            self._ids[record.request_id] += 1
        self.records.append(record)
        return record

    async def _send(self, body: dict, pod: int, expected: str) -> dict:
        order = [(pod + attempt) % len(self.ports) for attempt in range(len(self.ports))]
        for target in sorted(order, key=lambda t: not self._ready[t]):  # stable: the ready ones first, in turn
            url = f"http://127.0.0.1:{self.ports[target]}/v1/completions"
            try:
                async with self._client.stream("POST", url, json=body, headers=self.headers) as response:
                    return {"pod": target, **await _read(response, self.stream, expected)}
            except httpx.ConnectError:
                self.rerouted += 1
                continue
            except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError) as exc:
                return {"pod": target, "ending": Ending.DROPPED, "detail": repr(exc)}
        return {"ending": Ending.ERROR, "detail": "every pod refused the connection"}


async def _read(response: httpx.Response, stream: bool, expected: str) -> dict:
    """Classify one HTTP answer (read to its end)."""
    base = {
        "status": response.status_code,
        "retry_after": response.headers.get(constants.HTTP_RETRY_AFTER),
        "request_id": response.headers.get(constants.HTTP_REQUEST_ID),
    }
    if response.status_code != 200:
        raw = await response.aread()
        try:
            error = json.loads(raw)["error"]
        except (ValueError, KeyError, TypeError):
            return {**base, "ending": Ending.WRONG, "detail": f"not an error object: {raw[:200]!r}"}
        ending = Ending.TIMEOUT if response.status_code == 504 else Ending.ERROR
        return {**base, "ending": ending, "detail": f"{error.get('type')}: {error.get('message')}"}
    if not stream:
        payload = json.loads(await response.aread())
        return {**base, **_judge(payload["choices"][0]["text"], expected)}
    text = []
    async for line in response.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if "error" in event:
            ending = Ending.TIMEOUT if event["error"].get("type") == "timeout_error" else Ending.ERROR
            return {**base, "ending": ending, "detail": f"stream error event: {event['error'].get('message')}"}
        text.extend(c.get("text") or "" for c in event.get("choices", ()))
    return {**base, **_judge("".join(text), expected)}


def _judge(text: str, expected: str) -> dict:
    if text == expected:
        return {"ending": Ending.ONCE}
    if len(text) > len(expected) and text.startswith(expected):
        return {"ending": Ending.TWICE, "detail": f"text repeats: {text!r}"}
    return {"ending": Ending.WRONG, "detail": f"expected {expected!r}, got {text!r}"}


KAFKA_TENANT = "kafka-producer"  # whose Kafka-direct ids KafkaLoad's are (stored tenant-scoped: ids.tenant_scoped_id)


@dataclass(eq=False)
class KafkaLoad:
    """Produces GenerationRequests with ``reply_to=KafkaReply(reply_topic)`` at ``rate_per_s`` (an internal producer)
    and counts the replies per request_id on ``reply_topic``; :meth:`stop` waits for stragglers up to ``settle_s``."""

    bootstrap: str
    reply_topic: str
    _: dataclasses.KW_ONLY
    rate_per_s: float
    timeout_ms: int = 60_000
    max_tokens: int = 8
    # request_id -> (monotonic sent, expected text)
    sent: dict[str, tuple[float, str]] = dataclasses.field(default_factory=dict, init=False)
    # request_id -> [(monotonic received, reply)]
    replies: dict[str, list[tuple[float, dict]]] = dataclasses.field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True)
        self._consumer = AIOKafkaConsumer(
            self.reply_topic, bootstrap_servers=self.bootstrap, group_id=None, auto_offset_reset="earliest"
        )
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        await self._producer.start()
        await self._consumer.start()
        self._tasks = [asyncio.create_task(self._pace()), asyncio.create_task(self._collect())]

    async def stop(self, settle_s: float) -> Tally:
        """Stop producing; wait until every request has a reply (or ``settle_s`` passed, or stragglers' deadlines), count."""
        self._tasks[0].cancel()
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline and any(rid not in self.replies for rid in self.sent):
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # a duplicate would follow closely: give it a moment to show up
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._producer.stop()
        await self._consumer.stop()
        return self.tally()

    def tally(self) -> Tally:
        records = []
        for seq, (request_id, (sent_s, expected)) in enumerate(self.sent.items()):
            replies = self.replies.get(request_id, [])
            latency_ms = (replies[0][0] - sent_s) * 1000 if replies else math.nan
            if not replies:
                ending, detail = Ending.LOST, "no reply"
            elif len(replies) > 1:
                ending, detail = Ending.TWICE, f"{len(replies)} replies"
            elif replies[0][1].get("outcome") != "succeeded":
                ending, detail = Ending.ERROR, str(replies[0][1].get("error"))
            else:
                text = replies[0][1]["choices"][0]["text"]
                ending, detail = (Ending.ONCE, "") if text == expected else (Ending.WRONG, text)
            records.append(
                Record(
                    seq=seq,
                    pod=-1,
                    sent_s=sent_s,
                    latency_ms=latency_ms,
                    ending=ending,
                    request_id=request_id,
                    detail=detail,
                )
            )
        return Tally(records)

    async def _pace(self) -> None:
        interval_s = 1 / self.rate_per_s
        while True:
            await self.produce_one()
            await asyncio.sleep(interval_s)

    async def produce_one(self) -> str:
        request_id = f"kreply-{uuid.uuid4().hex[:16]}"
        prompt = f"{request_id} over kafka"
        now_ms = int(time.time() * 1000)
        request = wire.GenerationRequest(
            request_id=request_id,
            tenant_id=KAFKA_TENANT,
            model="llmq-sim",
            prompt=prompt,
            sampling=wire.SamplingParams(max_tokens=self.max_tokens),
            created_ms=now_ms,
            deadline_ms=now_ms + self.timeout_ms,
            reply_to=wire.KafkaReply(topic=self.reply_topic),
        )
        self.sent[request_id] = (time.monotonic(), sim_answer(prompt, self.max_tokens))
        await self._producer.send_and_wait(
            constants.requests_topic(constants.INTERACTIVE),
            wire.encode(request),
            key=request_id.encode(),
            headers=[(constants.HEADER_CONTENT_TYPE, constants.CONTENT_TYPE_MSGPACK.encode())],
        )
        return request_id

    async def _collect(self) -> None:
        async for record in self._consumer:
            reply = json.loads(record.value)
            self.replies.setdefault(reply["request_id"], []).append((time.monotonic(), reply))
