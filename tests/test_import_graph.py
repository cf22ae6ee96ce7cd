"""The layers import only downwards (docs/architecture.md, "Layers"): ``core`` imports nothing else of
trident_flows, ``scheduler`` and ``runtime`` import only ``core`` (never each other), the glue that
needs both lives above them (``control``), ``corpus`` (storage of a growing corpus) imports nothing else of ours, and only the Prefect layer imports Prefect. Imports are read from the source with ``ast``; nothing
is imported, so a violation is reported even where importing would fail."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trident_flows"

# Which packages of ours each lower layer may import (itself included).
ALLOWED = {
    "core": {"core"},
    "corpus": {"corpus"},
    "scheduler": {"core", "scheduler"},
    "runtime": {"core", "runtime"},
}
# Third-party packages a layer must not import: the scheduler and the core are pure Python, the
# runtime runs on Ray but never touches Prefect.
FORBIDDEN_LIBS = {
    "core": {"ray", "prefect"},
    "corpus": {"ray", "prefect"},
    "scheduler": {"ray", "prefect"},
    "runtime": {"prefect"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, at any depth (function-level too)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.append((node.lineno, source))
            # ``from trident_flows import scheduler`` imports the subpackage itself.
            if source == "trident_flows":
                found.extend((node.lineno, f"trident_flows.{alias.name}") for alias in node.names)
    return found


def violations(path: Path, layer: str) -> list[str]:
    out = []
    for line, name in imports_of(path):
        parts = name.split(".")
        if parts[0] == "trident_flows" and len(parts) > 1 and parts[1] not in ALLOWED[layer]:
            out.append(f"{_module_name(path)}:{line} imports {name} (trident_flows.{layer} may import only "
                       f"{sorted('trident_flows.' + p for p in ALLOWED[layer])})")
        if parts[0] in FORBIDDEN_LIBS[layer]:
            out.append(f"{_module_name(path)}:{line} imports {name} (trident_flows.{layer} must not import {parts[0]})")
    return out


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_downwards(layer: str) -> None:
    files = sorted((PACKAGE / layer).rglob("*.py"))
    assert files, f"no modules under {PACKAGE / layer}"
    found = [v for path in files for v in violations(path, layer)]
    assert not found, "imports that cross the layers:\n" + "\n".join(found)


# The Prefect layer: the only code that imports Prefect (first part of the module name under trident_flows).
PREFECT_LAYER = {"blocks", "flows", "tasks", "prefect_server", "demo"}


def test_only_the_prefect_layer_imports_prefect() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = _module_name(path).split(".")
        layer = parts[1] if len(parts) > 1 else ""
        if layer in PREFECT_LAYER:
            continue
        found += [f"{_module_name(path)}:{line} imports {name} (only {sorted(PREFECT_LAYER)} may import Prefect)"
                  for line, name in imports_of(path) if name.split(".")[0] == "prefect"]
    assert not found, "Prefect imported outside the Prefect layer:\n" + "\n".join(found)


def test_checker_names_the_offending_module_and_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself catches a scheduler -> runtime import, relative and function-level ones included."""
    fake = tmp_path / "trident_flows"
    (fake / "scheduler").mkdir(parents=True)
    bad = fake / "scheduler" / "bad.py"
    bad.write_text("from trident_flows.core.types import Plan\n\n"
                   "def f():\n    from ..runtime.state import RunnerState\n    import ray\n")
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    assert violations(bad, "scheduler") == [
        "trident_flows.scheduler.bad:4 imports trident_flows.runtime.state (trident_flows.scheduler may import only "
        "['trident_flows.core', 'trident_flows.scheduler'])",
        "trident_flows.scheduler.bad:5 imports ray (trident_flows.scheduler must not import ray)",
    ]
