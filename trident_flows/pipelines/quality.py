"""Quality knobs: the settings that decide *what* a pipeline outputs, set by the user and held fixed.

A scheduler changes how fast data is curated, never what: execution knobs (``EXECUTION_KNOBS`` and
every ``OpConfig`` field) change only speed and policies tune them; quality knobs
(``QUALITY_KNOBS``) change the rows written and reach the operator as constructor params.

Contract:
- ``QualityKnob`` declares a knob and its values; ``check`` coerces and validates (``ValueError``
  naming operator, knob, value and what to change).
- ``quality_settings(operator, cls, config, params)``: each knob's value from ``params`` or its
  default; from ``config`` only when listed in ``params["tunable"]`` (else the config is refused).
- ``apply_quality(pipeline, specs, quality=, tune=)``: specs with the user's settings, a ``tune``d
  knob in the search space with exactly its range; ``check_settings`` / ``refuse_quality`` validate
  by pipeline name. ``audit_column`` / ``stamp``: every row records its quality configuration;
  ``tunable_quality`` and ``output_note`` report tunable knobs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from trident_flows.core.types import KnobRole, KnobSpace, KnobValue, OpConfig
from trident_flows.runtime.spec import OperatorSpec, PipelineSpec

TUNABLE = "tunable"  # constructor param: names of the quality knobs a config may set
AUDIT_PREFIX = "cfg_"


@dataclass(frozen=True)
class QualityKnob:
    """One quality knob of an operator: default value, what it changes, and the values it may take
    (numbers in ``low..high``, or one of ``choices``; neither: any value of the default's type)."""

    name: str
    default: KnobValue
    changes: str
    low: float | None = None
    high: float | None = None
    choices: tuple[KnobValue, ...] = ()
    fixed_reason: str = ""  # non-empty: why this knob cannot be made tunable

    @property
    def kind(self) -> str:
        """The ``KnobSpace.kind`` this knob takes when tunable."""
        if self.choices or isinstance(self.default, (str, bool)):
            return "categorical"
        return "int" if isinstance(self.default, int) else "float"

    def domain(self) -> str:
        if self.choices:
            return "one of " + "|".join(str(c) for c in self.choices)
        if self.low is not None and self.high is not None:
            return f"{self.low:g}..{self.high:g}"
        return f"any {type(self.default).__name__}"

    def check(self, operator: str, value: Any) -> KnobValue:
        """``value`` coerced to the default's type and validated (see the module docstring)."""
        where = f"operator {operator!r}: quality knob {self.name}={value!r}"
        try:
            if isinstance(self.default, bool):
                coerced: KnobValue = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
            elif isinstance(self.default, int):
                number = float(value)
                if number != int(number):
                    raise ValueError
                coerced = int(number)
            elif isinstance(self.default, float):
                coerced = float(value)
                if not math.isfinite(coerced):
                    raise ValueError
            else:
                coerced = str(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where} must be a {type(self.default).__name__} ({self.domain()})") from None
        if self.choices and coerced not in self.choices:
            raise ValueError(f"{where} is not allowed: choose {self.domain()}")
        if self.low is not None and self.high is not None and not self.low <= coerced <= self.high:  # type: ignore[operator]
            raise ValueError(f"{where} lies outside {self.domain()}: choose a value in that range")
        if isinstance(coerced, str) and not coerced.strip():
            raise ValueError(f"{where} is empty: give a value")
        return coerced


def declared(cls: type) -> tuple[tuple[QualityKnob, ...], tuple[str, ...]]:
    """An operator class's (quality knobs, execution knob names); classes without declarations have none."""
    return tuple(getattr(cls, "QUALITY_KNOBS", ())), tuple(getattr(cls, "EXECUTION_KNOBS", ()))


def quality_settings(operator: str, cls: type, config: OpConfig, params: Mapping[str, Any]) -> dict[str, KnobValue]:
    """The quality knob values one replica runs with (see the module docstring)."""
    knobs, execution = declared(cls)
    names = {k.name for k in knobs}
    tunable = set(params.get(TUNABLE, ()))
    unknown = [n for n in config.knob_dict if n not in names and n not in execution]
    if unknown:
        raise ValueError(f"operator {operator!r}: config {config.label()} sets knobs {unknown} that this operator does not have; "
                         f"its execution knobs are {list(execution)}, its quality knobs {sorted(names)}")
    values: dict[str, KnobValue] = {}
    for knob in knobs:
        if knob.name in config.knob_dict:
            if knob.name not in tunable:
                raise ValueError(f"operator {operator!r}: config {config.label()} sets quality knob {knob.name}, which changes the "
                                 f"output and is not marked tunable; set it in the pipeline's quality settings "
                                 f"(quality={{'{operator}.{knob.name}': ...}}), or mark it tunable with a range")
            values[knob.name] = knob.check(operator, config.knob(knob.name))
        else:
            values[knob.name] = knob.check(operator, params.get(knob.name, knob.default))
    return values


def _split_key(pipeline: str, specs: Sequence[OperatorSpec], key: str, option: str) -> tuple[OperatorSpec, QualityKnob]:
    operator, dot, name = str(key).partition(".")
    by_name = {s.name: s for s in specs}
    if not dot or operator not in by_name:
        raise ValueError(f"{option} {key!r}: write OPERATOR.KNOB with an operator of pipeline {pipeline!r} "
                         f"({', '.join(by_name)}), e.g. {option} {_example(specs)}")
    spec = by_name[operator]
    knobs, execution = declared(spec.cls)
    for knob in knobs:
        if knob.name == name:
            return spec, knob
    if name in execution or name in ("batch_size", "device", "cpus", "gpus", "replicas"):
        raise ValueError(f"{option} {key!r}: {name} is an execution knob (it changes only speed, the scheduler tunes it); "
                         f"{operator}'s quality knobs are {[k.name for k in knobs] or 'none'}")
    raise ValueError(f"{option} {key!r}: operator {operator!r} has no quality knob {name!r}; "
                     f"its quality knobs are {[k.name for k in knobs] or 'none'}")


def _example(specs: Sequence[OperatorSpec]) -> str:
    for spec in specs:
        knobs, _ = declared(spec.cls)
        if knobs:
            return f"{spec.name}.{knobs[0].name}={knobs[0].default}"
    return "OPERATOR.KNOB=VALUE (this pipeline has no quality knobs)"


def _tuned_space(operator: str, knob: QualityKnob, bounds: Any) -> KnobSpace:
    """The search-space entry of a quality knob the user marked tunable with ``bounds``."""
    key = f"{operator}.{knob.name}"
    if bounds is None or (isinstance(bounds, str) and not bounds.strip()) or (not isinstance(bounds, str) and not list(bounds)):
        example = "|".join(str(c) for c in knob.choices[:2]) if knob.kind == "categorical" else (
            f"{knob.low:g}..{knob.high:g}" if knob.low is not None and knob.high is not None else "LOW..HIGH")
        raise ValueError(f"quality knob {key} is marked tunable without a range: a quality knob changes the output, so the "
                         f"scheduler may only vary it within a range you give; write --tune {key}={example} "
                         f"(allowed: {knob.domain()}), or drop it from tune to keep it fixed")
    if knob.kind == "categorical":
        values = bounds.split("|") if isinstance(bounds, str) else list(bounds)
        choices = tuple(dict.fromkeys(knob.check(operator, v) for v in values))
        return KnobSpace(knob.name, "categorical", choices=choices, role=KnobRole.QUALITY)
    if isinstance(bounds, str):
        low_text, sep, high_text = bounds.partition("..")
        if not sep:
            raise ValueError(f"quality knob {key}: range {bounds!r} must be written LOW..HIGH, e.g. {knob.domain()}")
        bounds = (low_text, high_text)
    low, high = (knob.check(operator, b) for b in bounds)
    if low > high:  # type: ignore[operator]
        raise ValueError(f"quality knob {key}: range {low}..{high} has low > high; write LOW..HIGH")
    return KnobSpace(knob.name, knob.kind, low, high, role=KnobRole.QUALITY)


def _start_value(space: KnobSpace, value: KnobValue) -> KnobValue:
    """``value`` moved into the tunable range (the nearest bound, or the first choice)."""
    if space.kind == "categorical":
        return value if value in space.choices else space.choices[0]
    low, high = space.low, space.high
    moved = min(max(value, low), high)  # type: ignore[type-var]
    return int(moved) if space.kind == "int" else float(moved)


def apply_quality(pipeline: str, specs: Sequence[OperatorSpec], quality: Mapping[str, Any] | None = None,
                  tune: Mapping[str, Any] | None = None) -> tuple[OperatorSpec, ...]:
    """The operator specs with the user's quality settings and tunable ranges (see the module docstring)."""
    params: dict[str, dict[str, Any]] = {s.name: dict(s.params) for s in specs}
    spaces = {s.name: s.space for s in specs}
    configs = {s.name: s.config for s in specs}
    for key, value in (quality or {}).items():
        spec, knob = _split_key(pipeline, specs, key, "--quality")
        params[spec.name][knob.name] = knob.check(spec.name, value)
    for key, bounds in (tune or {}).items():
        spec, knob = _split_key(pipeline, specs, key, "--tune")
        if knob.fixed_reason:
            raise ValueError(f"--tune {key}: this quality knob cannot be tunable ({knob.fixed_reason}); set one value with "
                             f"--quality {key}=VALUE")
        knob_space = _tuned_space(spec.name, knob, bounds)
        start = _start_value(knob_space, params[spec.name].get(knob.name, knob.default))
        others = tuple(k for k in spaces[spec.name].knobs if k.name != knob.name)
        spaces[spec.name] = dataclasses.replace(spaces[spec.name], knobs=others + (knob_space,))
        configs[spec.name] = configs[spec.name].with_changes(**{knob.name: start})
        params[spec.name][TUNABLE] = tuple(sorted({*params[spec.name].get(TUNABLE, ()), knob.name}))
    return tuple(dataclasses.replace(s, params=params[s.name], space=spaces[s.name], config=configs[s.name]) for s in specs)


def check_settings(pipeline: str, quality: Mapping[str, Any] | None, tune: Mapping[str, Any] | None) -> None:
    """Validate quality settings for the pipeline called ``pipeline`` (raises ``ValueError`` saying what to change)."""
    import importlib

    from trident_flows.pipelines import PIPELINES

    module = importlib.import_module(PIPELINES[pipeline])
    if hasattr(module, "operator_specs"):
        apply_quality(pipeline, module.operator_specs(), quality, tune)
    else:
        refuse_quality(pipeline, quality, tune)


def refuse_quality(pipeline: str, quality: Mapping[str, Any] | None, tune: Mapping[str, Any] | None) -> None:
    """Refuse quality settings for a pipeline whose operators have no quality knobs."""
    given = [*(quality or {}), *(tune or {})]
    if given:
        raise ValueError(f"pipeline {pipeline!r} has no quality knobs (its operators are emulated from cost models, their output "
                         f"is fixed); drop --quality/--tune {', '.join(given)}")


def parse_settings(items: Iterable[str], option: str) -> dict[str, str]:
    """``["ocr.dpi=200"]`` -> ``{"ocr.dpi": "200"}`` (CLI ``--quality`` / ``--tune`` values)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{option} {item!r}: write OPERATOR.KNOB=VALUE, e.g. {option} ocr.dpi=" + ("100..300" if option == "--tune" else "200"))
        out[key.strip()] = value.strip()
    return out


def audit_column(operator: str, knob: str) -> str:
    return f"{AUDIT_PREFIX}{operator}_{knob}"


def stamp(batch: dict[str, np.ndarray], operator: str, values: Mapping[str, Any], rows: Iterable[int]) -> None:
    """Add one ``cfg_<operator>_<knob>`` column per value: the value on ``rows``, None on the others."""
    n = len(batch["id"])
    chosen = set(rows)
    for knob, value in values.items():
        column = np.empty(n, dtype=object)
        column[:] = [value if i in chosen else None for i in range(n)]
        batch[audit_column(operator, knob)] = column


def tunable_quality(spec: PipelineSpec) -> list[str]:
    """``operator.knob`` of every quality knob a policy may vary in ``spec`` (marked tunable by the user)."""
    return [f"{op.name}.{name}" for op in spec.operators for name in op.space.quality_knobs]


def output_note(spec: PipelineSpec) -> str:
    """One line for run summaries and plan artifacts: "" unless some quality knob is tunable."""
    knobs = tunable_quality(spec)
    if not knobs:
        return ""
    columns = ", ".join(audit_column(*k.split(".", 1)) for k in knobs)
    return (f"outputs can differ by configuration: quality knobs {', '.join(knobs)} are marked tunable, so the scheduler may "
            f"change them during the run; each row records the values it was produced with ({columns})")
