"""``make compose-secrets``: the secrets docker-compose.yml mounts, in ``deploy/secrets/`` (never committed).

The same set as a secure local stack's (:class:`~llmq_cli.devsecrets.DevSecrets`: a CA, the broker's keystore, Redis'
certificate, one password per role), but the broker's certificate names the compose host ``kafka`` and Redis' the host
``redis``; beside them Redis' ACL file and an API keys file with one paid and one free tenant (random keys). Made once,
kept on later runs. The containers run as users of group 10001 (the images' ``llmq`` group), which is given read access;
a caller that cannot change a file's group (not root) makes the files world-readable instead, and says so.
"""

from __future__ import annotations

import argparse
import os
import secrets
from pathlib import Path

import yaml

from llmq_cli.devsecrets import DevSecrets
from llmq_core import security

CONTAINER_GID = 10001
COMPOSE_NAMES = {security.KAFKA_BROKER_PRINCIPAL: "subjectAltName=DNS:kafka", "redis": "subjectAltName=DNS:redis"}
TENANTS = {"compose-paid": "paid", "compose-free": "free"}  # tenant -> tier


def ensure(folder: Path) -> list[Path]:
    """Make the missing secrets under ``folder``; returns every file compose mounts from it."""
    made = DevSecrets(folder, COMPOSE_NAMES)
    made.ensure()
    acl = folder / "redis.acl"
    acl.write_text(security.redis_acl_file({role: made.password(role) for role in security.ROLES}))
    keys = folder / "api-keys.yaml"
    if not keys.exists():
        entries = [
            {"tenant": tenant, "key": f"sk-{tenant}-{secrets.token_hex(16)}", "tier": tier}
            for tenant, tier in TENANTS.items()
        ]
        keys.write_text(yaml.safe_dump({"keys": entries}, sort_keys=False))
    files = [made.ca, made.broker_keystore, made.cert("redis"), made.key("redis"), acl, keys]
    files += [made.password_file(role) for role in security.ROLES]
    return files


def share_with_containers(files: list[Path]) -> bool:
    """Readable by group 10001 (0640); False when the group could not be set (the files are then 0644)."""
    try:
        for path in files:
            os.chown(path, -1, CONTAINER_GID)
            os.chmod(path, 0o640)
        return True
    except PermissionError:
        for path in files:
            os.chmod(path, 0o644)
        return False


def api_keys(folder: Path) -> dict[str, str]:
    """tenant -> its API key, from ``folder``'s api-keys.yaml."""
    return {entry["tenant"]: entry["key"] for entry in yaml.safe_load((folder / "api-keys.yaml").read_text())["keys"]}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m llmq_cli.compose_secrets", description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="deploy/secrets", type=Path)
    args = parser.parse_args()
    files = ensure(args.folder.resolve())
    if not share_with_containers(files):
        print(f"compose-secrets: could not give {args.folder} to group {CONTAINER_GID}: its files are world-readable")
    print(f"compose-secrets: {len(files)} files in {args.folder} (API keys: {args.folder / 'api-keys.yaml'})")


if __name__ == "__main__":
    main()
