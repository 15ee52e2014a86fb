"""``llmq capacity``'s fleet plan as tables: the CPU profile it comes from, processes per kind, topic partitions
and the brokers' bytes/s (the plain data of llmq_bench.capacity.fleet_plan and cpu_profile)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

PROCESS_COLUMNS = ("process", "CPU ms/req", "req/s per core", "cores at peak", "cores each", "processes")
PARTITION_COLUMNS = ("topic", "consumers", "partitions needed", "deployed", "consumers that get one")


def print_fleet(console: Console, plan: dict, profile: dict) -> None:
    """The profile's source and load, then the processes, the partitions and the brokers' traffic."""
    print_profile(console, profile)
    print_processes(console, plan)
    print_partitions(console, plan["partitions"])
    if "kafka_traffic" in plan:
        print_traffic(console, plan["kafka_traffic"])


def print_profile(console: Console, profile: dict) -> None:
    load = "below saturation" if profile["below_saturation"] else "at saturation or past it"
    busy, fill = profile["machine_busy_fraction"], profile["batch_fill"]
    console.print(
        f"CPU profile: {profile['source']}, HTTP-fed, {profile['batchers']} batcher(s), offered "
        f"{profile['offered_rps']:g} req/s, {profile['answered_share']:.0%} answered ({load}); batch fill "
        f"{'?' if fill is None else f'{fill:.0%}'}, machine {'?' if busy is None else f'{busy:.0%}'} busy"
    )
    alone = profile["batcher_alone_ms_per_request"]
    if alone is not None:
        console.print(
            f"the batcher alone, fed by a Kafka-direct producer: {alone:g} ms/request (such requests take the entry "
            "work an API pod does for HTTP ones); the plan, for HTTP traffic, takes the HTTP-fed figure"
        )
    growth = profile["batcher_growth"]
    if growth:
        (n1, n2), (ms1, ms2) = growth["batchers"], growth["cpu_ms_per_request"]
        console.print(
            f"batchers together: {ms1:g} ms/request at {n1}, {ms2:g} at {n2} (+{growth['ms_per_extra_batcher']:g} per "
            "batcher more; each batcher tails every result, for one): the plan takes the first figure, so it holds "
            "only while that cost does not grow with the count"
        )


def print_processes(console: Console, plan: dict) -> None:
    title = f"fleet at {plan['rps']:g} req/s, {plan['headroom']:.0%} of each kind's cores free"
    table = Table(*PROCESS_COLUMNS, title=title)
    for kind, entry in plan["processes"].items():
        table.add_row(
            "kafka brokers" if kind == "kafka" else kind,
            f"{entry['cpu_ms_per_request']:.3f}",
            f"{entry['requests_per_s_per_core'] or 0:.0f}",
            f"{entry['cores_at_peak']:.1f}",
            f"{entry['cores_per_process']:g}",
            str(entry["processes"]),
        )
    workers = plan["workers"]
    table.add_row(
        "worker (accelerators)",
        f"{workers['cpu_ms_per_request']:.3f}",
        "",
        f"{workers['cores_per_worker_at_peak']:.2f} each",
        "",
        str(workers["replicas"]),
    )
    console.print(table)
    kafka = plan["processes"]["kafka"]
    console.print(
        f"brokers: the broker's CPU per request x {kafka['replication_factor']} replicas (it was measured with one), "
        "never fewer brokers than replicas"
    )
    if not plan["one_redis_enough"]:
        console.print(
            "Redis: llmq talks to one Redis (LLMQ_REDIS_URL): the plan needs more than its one command thread"
        )


def print_partitions(console: Console, caps: list[dict]) -> None:
    title = "partitions: a consumer group gives each partition to one consumer, so the partitions cap the consumers"
    table = Table(*PARTITION_COLUMNS, title=title)
    for cap in caps:
        table.add_row(
            cap["topic"],
            cap["consumer"],
            str(cap["partitions_needed"]),
            f"{cap['partitions_deployed']} ({cap['setting']})",
            f"{cap['consumers_usable']}{'  CAPPED' if cap['capped'] else ''}",
        )
    console.print(table)


def print_traffic(console: Console, traffic: dict) -> None:
    record = traffic["record_bytes"]
    console.print(
        f"Kafka: produced {traffic['produced_bytes_per_s'] / 1e6:.0f} MB/s, replicated "
        f"{traffic['replicated_bytes_per_s'] / 1e6:.0f} MB/s, fetched {traffic['fetched_bytes_per_s'] / 1e6:.0f} MB/s "
        f"(records of {record['request']} + {record['batch_per_request']:.0f} + {record['result']} bytes per request, "
        "msgpack, uncompressed; every batcher fetches every result)"
    )
