"""``llmq topics``: the llmq topics (and, on a secure cluster, every role's ACLs) on the broker the settings name."""

from __future__ import annotations

import asyncio

import typer

from llmq_cli.console import make_console
from llmq_core import security
from llmq_core.kafka import ensure_topics
from llmq_core.settings import load_settings

console = make_console()


def create_topics(
    acls: bool = typer.Option(
        False,
        help="First create every role's ACLs (a secure cluster, as the admin principal): llmq_core.security's table for "
        "LLMQ_KAFKA_REPLY_TOPIC_PREFIXES, LLMQ_KAFKA_INGRESS and LLMQ_REGION_PEERS, as `llmq dev up --secure` does.",
    ),
) -> None:
    """Create the llmq topics that are missing on the broker named by LLMQ_KAFKA_BOOTSTRAP_SERVERS (and raise the
    max.message.bytes of existing ones to what llmq needs)."""
    settings = load_settings()
    if acls:
        rows = security.settings_acls(settings)
        asyncio.run(security.apply_kafka_acls(settings, rows))
        console.print(f"{len(rows)} ACLs on {settings.kafka.bootstrap_servers}")
    asyncio.run(ensure_topics(settings, raise_limits=True))
    console.print(f"topics ready on {settings.kafka.bootstrap_servers}")
