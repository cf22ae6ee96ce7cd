"""Check the RayCluster manifests of a markdown file against a KubeRay RayCluster CRD, refusing unknown fields.

Usage: ``python scripts/check_kuberay_manifest.py docs/kuberay.md ray.io_rayclusters.yaml`` (the CRD from the KubeRay
release you run: ``ray-operator/config/crd/bases/ray.io_rayclusters.yaml``). Every ```yaml block of ``kind: RayCluster``
is validated against the CRD's ``v1`` ``openAPIV3Schema``; an object with listed properties and no
``x-kubernetes-preserve-unknown-fields`` refuses any other field (what a typo would otherwise lose: the API server
prunes unknown fields silently). ``metadata`` is left to the API server. Prints one line per error and per manifest;
exits 1 on any error.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import jsonschema
import yaml


def strict(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that lists its properties and keeps no unknown field."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if (out.get("type") == "object" and "properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def manifests(markdown: str) -> list[dict[str, Any]]:
    """The RayCluster manifests of ```yaml blocks in ``markdown``."""
    blocks = re.findall(r"```yaml\n(.*?)```", markdown, re.S)
    return [m for m in (yaml.safe_load(b) for b in blocks) if isinstance(m, dict) and m.get("kind") == "RayCluster"]


def errors(manifest: dict[str, Any], crd: dict[str, Any]) -> list[str]:
    """Where ``manifest`` breaks the CRD's v1 schema (strict), as ``path: message`` lines."""
    version = next((v for v in crd["spec"]["versions"] if v["name"] == "v1"), None)
    if version is None:
        raise SystemExit("the CRD has no v1 version: give the RayCluster CRD of KubeRay >= 1.0")
    schema = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    found = sorted(jsonschema.Draft7Validator(schema).iter_errors(manifest), key=lambda e: list(map(str, e.path)))
    return [f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in found]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    markdown, crd = Path(argv[0]).read_text(), yaml.safe_load(Path(argv[1]).read_text())
    found = manifests(markdown)
    if not found:
        print(f"{argv[0]}: no RayCluster manifest in a ```yaml block", file=sys.stderr)
        return 1
    bad = 0
    for m in found:
        problems = errors(m, crd)
        bad += len(problems)
        for p in problems:
            print(f"ERROR {m['metadata']['name']}: {p}")
        print(f"{m['metadata']['name']}: {len(problems)} error(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
