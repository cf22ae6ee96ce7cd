"""The node catalogue: the node classes a plan may rent, each with its hourly price.

Contract:
- A ``NodeType`` is one rentable node shape (CPUs, GPUs, memory of one GPU), its price per hour
  and the most nodes of it a plan may use. ``Catalogue`` holds them with a currency label and the
  minutes each node is paid for before it works (``startup_minutes``, added to every job's hours).
- ``load_catalogue(path)`` reads TOML (``.toml``) or JSON (any other suffix); the format is
  documented at the top of ``default_catalogue.toml`` (JSON: ``{"currency": ..., "node": [...]}``).
  ``load_catalogue(None)`` is that default catalogue, whose prices are placeholders (it says so).
- ``Catalogue.only(names)`` keeps the named classes; an unknown name is refused listing the known ones.
- ``cluster_spec(counts)`` / ``cluster_string(counts)``: a count per class as the scheduler's
  ``ClusterSpec`` and as the simulator's cluster string (``2x(cpus=16,name=c16)+...``).
- Every bad entry raises ``PlanningError`` naming the file, node and field and saying what to write.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from trident_flows.core.types import ClusterSpec, NodeClass
from trident_flows.core.units import parse_size

DEFAULT_CATALOGUE = Path(__file__).resolve().parent / "default_catalogue.toml"
DEFAULT_MAX_COUNT = 64
DEFAULT_STARTUP_MINUTES = 10.0
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


class PlanningError(ValueError):
    """A planning input the user must change (the message says what to change)."""


@dataclass(frozen=True)
class NodeType:
    """One rentable node shape and its hourly price."""

    name: str
    cpus: float
    price_per_hour: float
    gpus: int = 0
    gpu_memory_bytes: int = 0
    max_count: int = DEFAULT_MAX_COUNT

    def node_class(self, count: int) -> NodeClass:
        return NodeClass(self.name, count, self.cpus, self.gpus, self.gpu_memory_bytes)

    def spec_term(self, count: int) -> str:
        """This class as one term of a simulator cluster string."""
        gpu = f",gpus={self.gpus},gpu_mem={self.gpu_memory_bytes}B" if self.gpus else ""
        return f"{count}x(cpus={self.cpus:g}{gpu},name={self.name})"

    def describe(self) -> str:
        gpu = f", {self.gpus} GPU x {self.gpu_memory_bytes / 2**30:g} GiB" if self.gpus else ""
        return f"{self.cpus:g} CPUs{gpu}"


@dataclass(frozen=True)
class Catalogue:
    """The node classes a plan may use, in the order the file lists them."""

    nodes: tuple[NodeType, ...]
    currency: str = "USD"
    source: str = "default catalogue (placeholder prices)"
    placeholder_prices: bool = False
    startup_minutes: float = DEFAULT_STARTUP_MINUTES

    def node(self, name: str) -> NodeType:
        for n in self.nodes:
            if n.name == name:
                return n
        raise PlanningError(f"unknown node class {name!r}: the catalogue ({self.source}) has {', '.join(self.names)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)

    def only(self, names: list[str]) -> "Catalogue":
        kept = tuple(self.node(name) for name in dict.fromkeys(names))  # refuses an unknown name
        return Catalogue(kept, self.currency, self.source, self.placeholder_prices, self.startup_minutes)

    def hourly_price(self, counts: Mapping[str, int]) -> float:
        return sum(self.node(name).price_per_hour * n for name, n in counts.items())

    def cluster_spec(self, counts: Mapping[str, int]) -> ClusterSpec:
        return ClusterSpec(tuple(self.node(name).node_class(n) for name, n in counts.items() if n > 0))

    def cluster_string(self, counts: Mapping[str, int]) -> str:
        return "+".join(self.node(name).spec_term(n) for name, n in counts.items() if n > 0)


def _node(entry: Mapping[str, Any], where: str) -> NodeType:
    if not isinstance(entry, Mapping):
        raise PlanningError(f"{where}: a node entry must be a table/object with name, cpus, price_per_hour")
    unknown = sorted(set(entry) - {"name", "cpus", "gpus", "gpu_mem", "price_per_hour", "max_count"})
    name = str(entry.get("name", ""))
    label = f"{where}, node {name or '?'}"
    if unknown:
        raise PlanningError(f"{label}: unknown key(s) {unknown}; keys are name, cpus, gpus, gpu_mem, price_per_hour, max_count")
    if not _NAME.match(name):
        raise PlanningError(f"{label}: name must start with a letter and hold only letters, digits, - and _")
    for key in ("cpus", "price_per_hour"):
        if key not in entry:
            raise PlanningError(f"{label}: missing {key}; add e.g. {key} = {16 if key == 'cpus' else 0.8}")
    try:
        cpus, price = float(entry["cpus"]), float(entry["price_per_hour"])
        gpus, max_count = int(entry.get("gpus", 0)), int(entry.get("max_count", DEFAULT_MAX_COUNT))
    except (TypeError, ValueError):
        raise PlanningError(f"{label}: cpus, price_per_hour, gpus and max_count must be numbers") from None
    if not (cpus >= 1 and math.isfinite(cpus)):
        raise PlanningError(f"{label}: cpus={entry['cpus']!r}; give at least 1")
    if not (price > 0 and math.isfinite(price)):
        raise PlanningError(f"{label}: price_per_hour={entry['price_per_hour']!r}; give a price > 0")
    if gpus < 0 or max_count < 1:
        raise PlanningError(f"{label}: needs gpus >= 0 and max_count >= 1")
    memory = 0
    if gpus:
        if "gpu_mem" not in entry:
            raise PlanningError(f"{label}: gpus={gpus} but no gpu_mem; add e.g. gpu_mem = \"80GiB\"")
        try:
            memory = parse_size(str(entry["gpu_mem"]), "gpu_mem")
        except ValueError as exc:
            raise PlanningError(f"{label}: {exc}") from None
    return NodeType(name, cpus, price, gpus, memory, max_count)


def load_catalogue(path: Path | None = None) -> Catalogue:
    """The catalogue at ``path`` (TOML or JSON), or the default one (see the module docstring)."""
    source = path or DEFAULT_CATALOGUE
    if not source.is_file():
        raise PlanningError(f"--catalogue {source}: no such file; give a TOML or JSON catalogue "
                            f"(format: {DEFAULT_CATALOGUE.name} in the package), or leave it out for the default")
    try:
        data = tomllib.loads(source.read_text()) if source.suffix == ".toml" else json.loads(source.read_text())
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlanningError(f"catalogue {source}: not valid {'TOML' if source.suffix == '.toml' else 'JSON'} ({exc})") from None
    entries = data.get("node") if isinstance(data, Mapping) else None
    if not isinstance(entries, list) or not entries:
        raise PlanningError(f"catalogue {source}: no node classes; add at least one [[node]] table (JSON: a \"node\" list)")
    nodes = tuple(_node(e, f"catalogue {source}") for e in entries)
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise PlanningError(f"catalogue {source}: node names must be unique, got {names}")
    try:
        startup = float(data.get("startup_minutes", DEFAULT_STARTUP_MINUTES))
    except (TypeError, ValueError):
        startup = -1.0
    if not (startup >= 0 and math.isfinite(startup)):
        raise PlanningError(f"catalogue {source}: startup_minutes={data.get('startup_minutes')!r}; give minutes >= 0")
    default = path is None
    return Catalogue(nodes, str(data.get("currency", "USD")), "default catalogue (PLACEHOLDER prices)" if default else str(source),
                     placeholder_prices=default, startup_minutes=startup)
