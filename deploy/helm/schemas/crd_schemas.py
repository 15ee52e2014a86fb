"""Write the JSON schemas the chart's tests check custom resources against, from their operators' published CRDs.

KEDA's CRDs ship in its Go module (config/crd/bases), so the Go module proxy serves them at a pinned version:
``python deploy/helm/schemas/crd_schemas.py`` downloads the module (``go mod download -json``, into the same cache as
helm, ~/.cache/llmq/go) and rewrites ``<group>/<kind>-<version>.json`` here. Each schema is the CRD's
openAPIV3Schema made strict like kubernetes-validate's ``-strict`` schemas: an object that lists its properties and does
not preserve unknown fields accepts no others, so a misspelt field fails the test instead of being pruned by the API
server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
GO_CACHE = Path.home() / ".cache" / "llmq" / "go"
# (module, version, CRD file in the module): every custom resource kind the chart renders
SOURCES = [("github.com/kedacore/keda/v2", "v2.21.0", "config/crd/bases/keda.sh_scaledobjects.yaml")]


def strict(node: object) -> object:
    """``node`` (an OpenAPI v3 structural schema) as JSON Schema: closed objects, int-or-string, nullable."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items() if not key.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def crd_schemas(crd: dict, origin: str) -> dict[str, dict]:
    """File name -> JSON schema of each served version of ``crd``."""
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    schemas = {}
    for version in crd["spec"]["versions"]:
        if version.get("served"):
            schema = strict(version["schema"]["openAPIV3Schema"])
            schemas[f"{group}/{kind.lower()}-{version['name']}.json"] = {"$comment": origin, **schema}
    return schemas


def module_dir(module: str, version: str) -> tuple[Path, str]:
    env = {**os.environ, "GOMODCACHE": str(GO_CACHE / "mod"), "GOFLAGS": "-modcacherw"}
    info = json.loads(
        subprocess.run(
            ["go", "mod", "download", "-json", f"{module}@{version}"], env=env, check=True, capture_output=True
        ).stdout
    )
    return Path(info["Dir"]), info["Sum"]


def main() -> None:
    for module, version, path in SOURCES:
        directory, checksum = module_dir(module, version)
        crd = yaml.safe_load((directory / path).read_text())
        origin = f"{module}@{version} {path} ({checksum}), made strict by deploy/helm/schemas/crd_schemas.py"
        for name, schema in crd_schemas(crd, origin).items():
            (HERE / name).parent.mkdir(exist_ok=True)
            (HERE / name).write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
            print(f"wrote {name} from {origin}", file=sys.stderr)


if __name__ == "__main__":
    main()
