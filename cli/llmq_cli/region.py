"""``llmq region``: batch jobs across regions (docs/operations/multi-region.md). Run against the region that acts (its
``LLMQ_*`` settings: Kafka, Redis, file store, ``LLMQ_REGION``).

- ``failover --from a``: take over region a's unfinished jobs from a's job topics mirrored here (an operator's
  decision, not a detector's: a region cut off by a partition keeps running, and only a person who knows it is lost,
  or fenced, should move its jobs); refused (exit 2) while a's inbound MirrorMaker 2 (b -> a) does not beat, since a
  would not learn of the takeover and would keep running the jobs, unless ``--force`` (a is lost, or fenced);
- ``failover --from b --failback``: in region a once it is back and its mirror of b has caught up: take back the jobs
  b took over (the highest claim moves to a; b stops at its next step);
- ``reruns --from a``: lines of the jobs taken over from a that ran in both regions;
- ``rebuild``: rebuild this region's Redis view of its jobs from its own job topics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import asdict

import typer

from llmq_core import ids, kafka
from llmq_core.clock import SYSTEM_CLOCK
from llmq_core.redis_client import make_redis
from llmq_core.settings import Settings, load_settings
from llmq_jobs import heartbeats, regions
from llmq_jobs.filestore import FileStore
from llmq_jobs.joblog import JobLog, JobTopics, read_topics
from llmq_jobs.store import JobStore

region_app = typer.Typer(help="Batch jobs across regions: failover, fail-back, reruns, rebuild.", no_args_is_help=True)


@contextlib.asynccontextmanager
async def _store(settings: Settings):
    producer = kafka.make_producer(settings, max_batch_size=settings.kafka.producer_max_batch_bytes)  # job topics only
    await producer.start()
    redis = make_redis(settings)
    try:
        yield JobStore(redis, log=JobLog(producer)), FileStore(settings.jobs.files_url)
    finally:
        await redis.aclose()
        await producer.stop()


def _region_name(value: str) -> str:
    """--from: a region's name (as LLMQ_REGION takes it), so a typo is refused instead of reading as no jobs."""
    try:
        return ids.check_region(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _settings_of_other_region(source: str) -> Settings:
    """This region's settings; --from naming this region itself (its jobs are already here) or a region that is not
    a configured peer (its claims do not count here) is refused."""
    settings = load_settings()
    if source == settings.region.name:
        raise typer.BadParameter(f"{source!r} is this region (LLMQ_REGION): name the region to take over from")
    if source not in settings.region.peer_regions:
        raise typer.BadParameter(f"{source!r} is not among this region's peers (LLMQ_REGION_PEERS)")
    return settings


@region_app.command("failover")
def failover(
    source: str = typer.Option(
        ..., "--from", callback=_region_name, help="The region whose jobs to take over (lost, or fenced)."
    ),
    failback: bool = typer.Option(False, help="Take back only the jobs this region owned before (fail-back)."),
    force: bool = typer.Option(
        False, help="Go ahead although --from's inbound MirrorMaker 2 does not beat (the region is lost, or fenced)."
    ),
) -> None:
    """Take over the jobs whose owner is region --from, from its job topics mirrored here (<from>.llmq.jobs.*); prints
    one JSON line per job (batch_id, status, epoch, settled, to_run), then taken_over, from and the seconds it took.
    Refused (exit 2) while the newest heartbeat of --from's inbound MirrorMaker 2 is older than
    LLMQ_REGION_FAILOVER_HEARTBEAT_MAX_AGE_S, or missing, unless --force."""

    settings = _settings_of_other_region(source)
    if not force:
        _require_inbound_mirror(settings, source)

    async def go() -> list[regions.Takeover]:
        await kafka.ensure_topics(settings)
        async with _store(settings) as (store, files):
            return await regions.take_over(settings, store, files, store.log, source, SYSTEM_CLOCK, failback=failback)

    started = time.monotonic()
    taken = asyncio.run(go())
    for job in taken:
        typer.echo(json.dumps(asdict(job)))
    typer.echo(json.dumps({"taken_over": len(taken), "from": source, "seconds": round(time.monotonic() - started, 3)}))


def _require_inbound_mirror(settings: Settings, peer: str) -> None:
    """Refuse (exit 2) a failover whose source would not learn of it: its inbound mirror (this region -> peer) has
    not beaten lately, as its heartbeats mirrored back here say (:mod:`llmq_jobs.heartbeats`)."""
    topic = heartbeats.heartbeats_topic(peer)
    seen = asyncio.run(heartbeats.heartbeats_ms(settings, topic, settings.region.name, peer))
    verdict = heartbeats.decide(
        seen,
        SYSTEM_CLOCK.now_ms(),
        int(settings.region.failover_heartbeat_max_age_s * 1000),
        flow=f"{settings.region.name}->{peer}",
        topic=topic,
    )
    if not verdict.allowed:
        typer.echo(
            f"refused: {verdict.reason}: region {peer!r} would not learn of the takeover and would keep running its"
            f" jobs. Start its inbound MirrorMaker 2 and wait for it to catch up, or pass --force if {peer!r} is lost"
            " or fenced off.",
            err=True,
        )
        raise typer.Exit(2)


@region_app.command("reruns")
def reruns(
    source: str = typer.Option(..., "--from", callback=_region_name, help="The region the jobs were taken over from."),
) -> None:
    """Per job taken over from region --from: the lines that ran in both regions (complete once --from is back and
    its mirror caught up); one JSON object, batch id -> lines."""

    settings = _settings_of_other_region(source)

    async def go() -> dict[str, int]:
        claims = (await read_topics(settings, JobTopics(), kinds=("owners",))).owners
        taken = {b for b, claim in claims.items() if claim.region == settings.region.name and claim.epoch > 0}
        return await regions.count_reruns(settings, JobTopics.mirrored(source), taken)

    typer.echo(json.dumps(asyncio.run(go())))


@region_app.command("rebuild")
def rebuild() -> None:
    """Rebuild this region's Redis view of its batch jobs from its own job topics (after Redis lost its data)."""

    async def go() -> int:
        settings = load_settings()
        async with _store(settings) as (store, files):
            return await regions.rebuild(settings, store, files)

    typer.echo(json.dumps({"rebuilt": asyncio.run(go())}))
