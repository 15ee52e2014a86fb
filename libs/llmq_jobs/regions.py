"""Batch jobs across regions: rebuild a region's Redis view from its job topics, take over a lost region's jobs from
the topics MirrorMaker 2 mirrored here (``llmq region failover --from a``), take them back when it returns
(``--failback``), and count the lines both regions ran.

A takeover writes a claim with the next epoch to this region's own owners topic before anything else, then copies
the job's record, lines and settled results into this region's own topics (so this region's log alone can finish it,
and the peer sees its progress once it is back), then rebuilds the Redis view: lines settled in the mirrored ledger
are not run again.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from llmq_core.clock import Clock
from llmq_core.settings import JobsSettings, Settings
from llmq_jobs import jobs
from llmq_jobs.filestore import FileStore
from llmq_jobs.joblog import JobLog, JobSnapshot, JobTopics, list_topics, mirrored_regions, read_topics
from llmq_jobs.jobs import JobOwner
from llmq_jobs.store import JobStore


@dataclass(frozen=True, slots=True)
class Takeover:
    """One job taken over: its status, the epoch of the new claim, lines settled already and lines still to run."""

    batch_id: str
    status: str
    epoch: int
    settled: int
    to_run: int


async def restore(
    store: JobStore,
    files: FileStore,
    snapshot: JobSnapshot,
    batch_id: str,
    owner: JobOwner | None,
    settings: JobsSettings,
) -> None:
    """Rebuild this region's view of one job from ``snapshot``: its counters and usage from the logged results (an
    ended job's too: they are what it bills); an active job gets its prepared file (the logged lines in their order)
    and its ledger (settled lines from the logged results, the rest pending round 0); an ended one its results file
    and its expiry."""
    record = snapshot.records[batch_id]
    spec = record.spec
    retention_s = jobs.retention_s(spec, settings)
    results = snapshot.results.get(batch_id, {})
    created_at = record.times.get(jobs.IN_PROGRESS, spec.created_ms // 1000)
    ended_s = None if record.status in jobs.ACTIVE_STATUSES else record.times.get(record.status)
    expires_at = jobs.output_files_expire_at(spec, retention_s, ended_s)
    outputs = [] if record.status == jobs.FAILED else jobs.output_files(spec, created_at, expires_at)
    if record.status not in jobs.ACTIVE_STATUSES:
        if record.status != jobs.FAILED:
            await files.write(spec.results_path, [msgspec.json.encode(r) + b"\n" for r in results.values()])
        until_s = jobs.retained_until(record, retention_s)
        await store.jobs.restore_job(record, owner, files=outputs, results=results, until_s=until_s)
        return
    prepared, offsets, states, position = [], {}, {}, 0
    for custom_id, request in snapshot.lines.get(batch_id, {}).items():
        prepared.append(request + b"\n")
        offsets[custom_id] = f"{position}:{position + len(prepared[-1])}"
        position += len(prepared[-1])
        states[custom_id] = jobs.pending(0)
    states.update({custom_id: jobs.OUTCOME_STATE[r.outcome] for custom_id, r in results.items()})
    await files.write(spec.prepared_path, prepared)
    await store.jobs.restore_job(record, owner, files=outputs, lines=states, offsets=offsets, results=results)


async def rebuild(settings: Settings, store: JobStore, files: FileStore, own: JobTopics = JobTopics()) -> int:
    """Rebuild this region's Redis view of every job in its own job topics (after Redis lost it), each job's owner
    the highest claim in the own owners topic and every configured peer's mirrored here. Returns how many jobs."""
    snapshot = await read_topics(settings, own)
    for region in mirrored_regions(await list_topics(settings), settings.region.peer_regions):
        for claim in (await read_topics(settings, JobTopics.mirrored(region), kinds=("owners",))).owners.values():
            snapshot.owners[claim.batch_id] = jobs.highest(claim, snapshot.owners.get(claim.batch_id))
    for batch_id in snapshot.records:
        await restore(store, files, snapshot, batch_id, snapshot.owners.get(batch_id), settings.jobs)
    return len(snapshot.records)


async def take_over(
    settings: Settings,
    store: JobStore,
    files: FileStore,
    log: JobLog,
    source_region: str,
    clock: Clock,
    *,
    failback: bool = False,
) -> list[Takeover]:
    """Take over every job whose highest known claim is ``source_region``'s, from its topics mirrored here, under the
    same batch ids with the next epoch; this region's own topics are ``log``'s. ``failback``: only the jobs this
    region claimed before (taking its own back). ValueError for a region that is not a configured peer."""
    if source_region not in settings.region.peer_regions:
        raise ValueError(f"region {source_region!r} is not a peer of this region (LLMQ_REGION_PEERS)")
    source = await read_topics(settings, JobTopics.mirrored(source_region))
    own = (await read_topics(settings, log.topics, kinds=("owners",))).owners
    taken = []
    for batch_id, record in source.records.items():
        known = jobs.highest(source.owners.get(batch_id), own.get(batch_id))
        if known is None or known.region != source_region:
            continue
        mine = jobs.highest(own.get(batch_id), jobs.creation_claim(batch_id))
        if failback and (mine is None or mine.region != settings.region.name):
            continue
        lines, results = source.lines.get(batch_id, {}), source.results.get(batch_id, {})
        claim = JobOwner(
            batch_id=batch_id,
            region=settings.region.name,
            epoch=known.epoch + 1,
            at_ms=clock.now_ms(),
            settled=len(results),
        )
        await log.put_owner(claim)
        await log.put_record(record)
        if record.status in jobs.ACTIVE_STATUSES:
            await log.put_lines(batch_id, lines)
        await log.put_results(batch_id, results)
        await restore(store, files, source, batch_id, claim, settings.jobs)
        to_run = sum(1 for custom_id in lines if custom_id not in results)
        taken.append(Takeover(batch_id, record.status, claim.epoch, len(results), to_run))
    return taken


async def count_reruns(
    settings: Settings, source: JobTopics, batch_ids: set[str], own: JobTopics = JobTopics()
) -> dict[str, int]:
    """Per job this region took over from ``source``: the lines settled in the source region that this region ran
    again, because their settlement had not been mirrored when it took over. Complete once the source is back and
    its mirror caught up (its ledger then holds what it settled before it was lost)."""
    theirs = (await read_topics(settings, source, kinds=("ledger",))).results
    claims = (await read_topics(settings, own, kinds=("owners",))).owners
    return {
        batch_id: max(0, len(theirs.get(batch_id, {})) - claims[batch_id].settled)
        for batch_id in batch_ids
        if batch_id in claims
    }
