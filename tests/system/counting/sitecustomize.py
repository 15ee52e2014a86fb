"""Counts what a service process sends (test_pipeline_counts.py puts this folder on its PYTHONPATH): Kafka requests by
kind, records produced and Redis round trips (a command or a whole pipeline each), written every 0.2 s as JSON to
``$LLMQ_TEST_COUNTS_DIR/<pid>.json``. Production code is untouched: only the services a test starts this way count."""

import collections
import json
import os
import threading
import time

FOLDER = os.environ.get("LLMQ_TEST_COUNTS_DIR")


def _install(folder: str) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.conn import AIOKafkaConnection
    from redis.asyncio.connection import AbstractConnection

    counts: collections.Counter = collections.Counter()
    kafka_send, redis_send = AIOKafkaConnection.send, AbstractConnection.send_packed_command
    record_send = AIOKafkaProducer.send

    async def counted_record_send(self, *args, **kwargs):
        counts["kafka.records"] += 1
        return await record_send(self, *args, **kwargs)

    def counted_kafka_send(self, request, expect_response=True):
        counts[f"kafka.{type(request).__name__}"] += 1
        return kafka_send(self, request, expect_response)

    async def counted_redis_send(self, command, check_health=True):
        counts["redis.round_trips"] += 1
        return await redis_send(self, command, check_health)

    AIOKafkaProducer.send = counted_record_send
    AIOKafkaConnection.send = counted_kafka_send
    AbstractConnection.send_packed_command = counted_redis_send
    path = os.path.join(folder, f"{os.getpid()}.json")

    def dump() -> None:
        while True:
            time.sleep(0.2)
            with open(path + ".tmp", "w") as out:
                json.dump(dict(counts), out)
            os.replace(path + ".tmp", path)

    threading.Thread(target=dump, daemon=True).start()


if FOLDER:
    _install(FOLDER)
