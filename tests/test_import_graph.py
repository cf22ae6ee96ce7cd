"""The packages of trident_flows import only downwards (docs/architecture.md, "Layers").

``LAYERS`` writes the order once, lowest first: a module may import its own package and the packages
of lower layers, never one of its own layer or above. So ``core`` and ``corpus`` import nothing else
of trident_flows, ``scheduler`` and ``runtime`` import only ``core`` (never each other), and the glue
that needs both lives above them (``control``). Every package and top-level module of trident_flows
has a layer, there is no import cycle between packages, only the Prefect layer imports Prefect, and
nothing imports the repository's ``benchmarks`` but the CLI's ``bench`` command, inside the command.
Imports are read from the source with ``ast`` (function-level ones too); nothing is imported, so a
violation is reported even where importing would fail."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trident_flows"

# The layers, lowest first: the packages (and top-level modules) of trident_flows in each.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "core", "corpus"),  # the package's own __init__; plain values and pure helpers; a growing corpus's storage
    ("scheduler", "runtime"),  # the policies (pure Python) and the Ray runtime: both speak core, never each other
    ("pipelines", "loop"),  # operators, cost models and emulated operators (on the runtime's PipelineSpec); the one tick loop (on the scheduler)
    ("sim",),  # the runner's interface on a simulated clock, with the emulated operators
    ("planning",),  # node counts for a corpus: the placement MILP, checked in the simulator
    ("control",),  # a policy against a runner: the control loops and `trident-flows run`
    ("ray_data", "blocks", "tasks", "prefect_server"),  # front ends on control: Ray Data, the Prefect blocks and tasks, a local Prefect server
    ("flows", "cli"),  # the Prefect flows and the command line
    ("demo",),  # `make demo`: everything above, end to end
)
LAYER_OF = {name: level for level, names in enumerate(LAYERS) for name in names}

# Third-party packages a layer must not import: the scheduler, the core and the corpus are pure
# Python, the runtime and the operators run on Ray but never touch Prefect.
FORBIDDEN_LIBS = {
    "core": {"ray", "prefect"},
    "corpus": {"ray", "prefect"},
    "scheduler": {"ray", "prefect"},
    "loop": {"ray", "prefect"},
    "runtime": {"prefect"},
    "pipelines": {"prefect"},
}
# The Prefect layer: the only code that imports Prefect.
PREFECT_LAYER = {"blocks", "flows", "tasks", "prefect_server", "demo"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(path: Path) -> str:
    """The package of trident_flows that ``path`` belongs to (a top-level module is its own; the package's
    own ``__init__.py`` is ``__init__``)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def imports_of(path: Path, *, module_level: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, at any depth (function-level too), or with
    ``module_level`` only those that run when the module is imported (not inside a function)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    todo: list[ast.AST] = [ast.parse(path.read_text(), filename=str(path))]
    while todo:
        node = todo.pop()
        if module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        todo.extend(ast.iter_child_nodes(node))
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
    return sorted(found)


def _ours(name: str) -> str | None:
    """The package of trident_flows that the import ``name`` reaches (None for another library or the bare package)."""
    parts = name.split(".")
    return parts[1] if parts[0] == "trident_flows" and len(parts) > 1 else None


def violations(path: Path) -> list[tuple[str, str, str]]:
    """(importing module, imported module, why) for each import of ``path`` that crosses the layers."""
    module, own = _module_name(path), package_of(path)
    out = []
    for line, name in imports_of(path):
        target = _ours(name)
        if target is not None and target != own:
            if target not in LAYER_OF:
                out.append((module, name, f"{module}:{line} imports {name}: trident_flows.{target} has no layer in LAYERS"))
            elif LAYER_OF[target] >= LAYER_OF[own]:
                below = sorted(p for p in LAYER_OF if LAYER_OF[p] < LAYER_OF[own] and p != "__init__")
                out.append((module, name, f"{module}:{line} imports {name} (trident_flows.{own} may import only its own package "
                                          f"and the layers below it: {below})"))
        if name.split(".")[0] in FORBIDDEN_LIBS.get(own, ()):
            out.append((module, name, f"{module}:{line} imports {name} (trident_flows.{own} must not import {name.split('.')[0]})"))
    return out


def test_every_package_and_top_level_module_has_a_layer() -> None:
    names = {p.name if p.is_dir() else p.stem for p in PACKAGE.iterdir()
             if (p.is_dir() and (p / "__init__.py").is_file()) or p.suffix == ".py"}
    assert names - set(LAYER_OF) == set(), f"add these to a layer of LAYERS: {sorted(names - set(LAYER_OF))}"
    assert set(LAYER_OF) - names == set(), f"LAYERS names what trident_flows lacks: {sorted(set(LAYER_OF) - names)}"
    assert sum(map(len, LAYERS)) == len(LAYER_OF), "a name appears in two layers"


def test_every_package_imports_only_downwards() -> None:
    found = [why for path in _modules() for _, _, why in violations(path)]
    assert not found, "imports that cross the layers:\n" + "\n".join(found)


def package_graph() -> dict[str, set[str]]:
    """Which packages of trident_flows each one imports (itself left out)."""
    graph: dict[str, set[str]] = {}
    for path in _modules():
        own = package_of(path)
        for _, name in imports_of(path):
            target = _ours(name)
            if target is not None and target != own:
                graph.setdefault(own, set()).add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted: every import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(set(graph) | {n for targets in graph.values() for n in targets}):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_packages() -> None:
    graph = package_graph()
    assert not cycles(graph), "packages that import each other, directly or around a loop: " + "; ".join(
        " <-> ".join(c) for c in cycles(graph))


def test_the_cycle_check_finds_a_loop() -> None:
    assert cycles({"control": {"planning"}, "planning": {"sim"}, "sim": {"control", "core"}, "core": set()}) == [
        ["control", "planning", "sim"]]
    assert cycles({"a": {"b"}, "b": {"c"}}) == []


def test_only_the_prefect_layer_imports_prefect() -> None:
    found = []
    for path in _modules():
        if package_of(path) in PREFECT_LAYER:
            continue
        found += [f"{_module_name(path)}:{line} imports {name} (only {sorted(PREFECT_LAYER)} may import Prefect)"
                  for line, name in imports_of(path) if name.split(".")[0] == "prefect"]
    assert not found, "Prefect imported outside the Prefect layer:\n" + "\n".join(found)


def test_only_the_cli_imports_the_benchmarks_and_only_inside_the_bench_command() -> None:
    """The wheel leaves ``benchmarks`` out: importing ``trident_flows`` (the CLI included) must not need it."""
    found = []
    for path in _modules():
        module = _module_name(path)
        every = [(line, name) for line, name in imports_of(path) if name.split(".")[0] == "benchmarks"]
        at_import = [(line, name) for line, name in imports_of(path, module_level=True) if name.split(".")[0] == "benchmarks"]
        found += [f"{module}:{line} imports {name} (only trident_flows.cli may, inside its bench command)"
                  for line, name in (every if module != "trident_flows.cli" else at_import)]
    assert not found, "\n".join(found)


def test_checker_names_the_offending_module_and_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself catches a scheduler -> runtime import and an upward import, relative and function-level
    ones included, and an import of a package that has no layer."""
    fake = tmp_path / "trident_flows"
    (fake / "scheduler").mkdir(parents=True)
    (fake / "sim").mkdir()
    bad = fake / "scheduler" / "bad.py"
    bad.write_text("from trident_flows.core.types import Plan\n\n"
                   "def f():\n    from ..runtime.state import RunnerState\n    import ray\n")
    up = fake / "sim" / "up.py"
    up.write_text("from trident_flows.planning import advice\nfrom trident_flows.bench import x\nimport trident_flows.pipelines\n")
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    assert [why for _, _, why in violations(bad)] == [
        "trident_flows.scheduler.bad:4 imports trident_flows.runtime.state (trident_flows.scheduler may import only its own "
        "package and the layers below it: ['core', 'corpus'])",
        "trident_flows.scheduler.bad:5 imports ray (trident_flows.scheduler must not import ray)",
    ]
    assert [why for _, _, why in violations(up)] == [
        "trident_flows.sim.up:1 imports trident_flows.planning (trident_flows.sim may import only its own package and the "
        "layers below it: ['core', 'corpus', 'loop', 'pipelines', 'runtime', 'scheduler'])",
        "trident_flows.sim.up:2 imports trident_flows.bench: trident_flows.bench has no layer in LAYERS",
    ]
