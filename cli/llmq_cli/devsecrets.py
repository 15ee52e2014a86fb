"""Secrets of a secure local stack (``llmq dev up --secure``): a local CA, certificates and one password per role,
made once with openssl under ``<state>/secrets`` (folder 0700, files 0600) and reused on every later start."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Mapping
from pathlib import Path

from llmq_core.security import KAFKA_BROKER_PRINCIPAL, ROLES

CERT_DAYS = 825
LOOPBACK_NAMES = "subjectAltName=IP:127.0.0.1,DNS:localhost"


class DevSecrets:
    """Paths of the secrets in ``folder``; :meth:`ensure` creates the missing ones."""

    def __init__(self, folder: Path, names: Mapping[str, str] | None = None) -> None:
        """``names``: a certificate's subjectAltName extension by its name (default: 127.0.0.1 and localhost)."""
        self.folder = folder
        self.names = dict(names or {})
        self.ca = folder / "ca.pem"
        self.broker_keystore = folder / f"{KAFKA_BROKER_PRINCIPAL}.keystore.pem"  # key + certificate (Kafka's PEM)

    def password_file(self, role: str) -> Path:
        return self.folder / f"{role}.password"

    def password(self, role: str) -> str:
        return self.password_file(role).read_text()

    def cert(self, name: str) -> Path:
        return self.folder / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.folder / f"{name}.key"

    def ensure(self, principals: tuple[str, ...] = ()) -> None:
        """The CA, a server certificate for Kafka (its mTLS principal) and Redis, a client certificate and a password
        per role and per one of ``principals`` (Kafka-direct producers; hex passwords: safe inside Kafka's
        ``--add-scram`` and Redis' ACL syntax)."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        if not self.ca.exists():
            self._openssl(  # fmt: skip
                "req",
                "-x509",
                *_new_key(self.folder / "ca.key"),
                "-days",
                str(CERT_DAYS),
                "-out",
                self.ca,
                "-subj",
                "/CN=llmq-dev-ca",
            )
        for name in (KAFKA_BROKER_PRINCIPAL, "redis", *ROLES, *principals):
            if not self.cert(name).exists():
                self._issue(name)
        if not self.broker_keystore.exists():
            keystore = self.key(KAFKA_BROKER_PRINCIPAL).read_text() + self.cert(KAFKA_BROKER_PRINCIPAL).read_text()
            _write_private(self.broker_keystore, keystore)
        for role in (*ROLES, *principals):
            if not self.password_file(role).exists():
                _write_private(self.password_file(role), secrets.token_hex(24))

    def _issue(self, name: str) -> None:
        """A certificate ``CN=<name>`` for its names (127.0.0.1/localhost unless given) signed by the CA (servers and
        mTLS clients alike)."""
        csr = self.folder / f"{name}.csr"
        san = self.names.get(name, LOOPBACK_NAMES)
        self._openssl("req", *_new_key(self.key(name)), "-out", csr, "-subj", f"/CN={name}", "-addext", san)
        self._openssl(
            "x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.folder / "ca.key", "-CAcreateserial",
            "-copy_extensions", "copyall", "-days", str(CERT_DAYS), "-out", self.cert(name),
        )  # fmt: skip
        csr.unlink()
        os.chmod(self.key(name), 0o600)

    def _openssl(self, *args: str | Path) -> None:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, cwd=self.folder)


def _new_key(path: Path) -> list[str | Path]:
    """openssl req arguments for a fresh unencrypted P-256 key (PKCS#8, what Kafka's PEM keystore reads)."""
    return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", path]


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)
