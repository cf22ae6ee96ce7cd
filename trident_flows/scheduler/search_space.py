"""The config optimiser's search space: skopt's dimensions, the candidate grid, the surrogate.

Contract:
- ``skopt_dimensions(space)``: the ``ConfigSpace`` as skopt dimensions (device, batch size on a log
  scale, knobs; a dimension only where there is a choice) and their keys; ``skopt_point`` is a
  config's point in them.
- ``candidate_grid(space, rng)``: the fixed grid proposals are chosen from: batch sizes 8 per doubling
  (so a frontier optimum is not missed), knob grids of up to 9 values; above 3,000 candidates the knob
  combinations are sampled with ``rng``, the seed's knobs kept.
- ``check_in_space(space, encoder, operator, config)`` raises ``ValueError`` naming what lies outside.
- ``surrogate_optimizer(dimensions, seed, n_initial_points)``: skopt ask/tell with EI and a GP surrogate
  whose fitted noise is bounded to 10% of the target variance.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

import numpy as np
from skopt import Optimizer as SkoptOptimizer
from skopt.learning import GaussianProcessRegressor
from skopt.learning.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel
from skopt.space import Categorical, Integer, Real, Space
from skopt.utils import normalize_dimensions

from trident_flows.core.types import ConfigSpace, KnobValue, OpConfig
from trident_flows.scheduler.constraint import ConfigEncoder

_MAX_CANDIDATES = 3000
_BATCH_STEPS_PER_DOUBLING = 8
_KNOB_GRID = 9


def skopt_dimensions(space: ConfigSpace) -> tuple[list[Any], list[str]]:
    """The skopt dimensions of ``space`` and their keys (device, batch_size, knob names)."""
    dims: list[Any] = []
    keys: list[str] = []
    if len(space.devices) > 1:
        dims.append(Categorical(list(space.devices), name="device"))
        keys.append("device")
    if space.batch_size_max > space.batch_size_min:
        dims.append(Integer(space.batch_size_min, space.batch_size_max, prior="log-uniform", name="batch_size"))
        keys.append("batch_size")
    for knob in space.knobs:
        if knob.kind == "categorical":
            if len(knob.choices) > 1:
                dims.append(Categorical([str(c) for c in knob.choices], name=knob.name))
                keys.append(knob.name)
        elif knob.high > knob.low:
            prior = "log-uniform" if knob.log and knob.low > 0 else "uniform"
            dim = Integer(int(knob.low), int(knob.high), prior=prior) if knob.kind == "int" else Real(float(knob.low), float(knob.high), prior=prior)
            dims.append(dim)
            keys.append(knob.name)
    return dims, keys


def skopt_point(space: ConfigSpace, encoder: ConfigEncoder, keys: Sequence[str], config: OpConfig) -> list[Any]:
    """``config`` as a point in the dimensions of ``keys``."""
    values: dict[str, Any] = {"device": config.device, "batch_size": config.batch_size}
    for knob in space.knobs:
        value = encoder.knob_value(knob, config)
        values[knob.name] = str(value) if knob.kind == "categorical" else value
    return [values[key] for key in keys]


def candidate_grid(space: ConfigSpace, rng: np.random.Generator) -> list[OpConfig]:
    """Every candidate config: devices x knob combinations x batch sizes (module docstring)."""
    batches = _batch_grid(space)
    combos = _knob_grid(space)
    room = max(1, _MAX_CANDIDATES // (len(batches) * len(space.devices)))
    if len(combos) > room:  # keep the seed's knobs, sample the rest
        keep = [0] + sorted(rng.choice(np.arange(1, len(combos)), size=room - 1, replace=False).tolist())
        combos = [combos[i] for i in keep]
    return [space.config(d, b, **knobs) for d in space.devices for knobs in combos for b in batches]


def _knob_grid(space: ConfigSpace) -> list[dict[str, KnobValue]]:
    axes: list[list[tuple[str, KnobValue]]] = []
    for knob in space.knobs:
        if knob.kind == "categorical":
            values: list[KnobValue] = list(knob.choices)
        elif knob.kind == "int" and knob.high - knob.low + 1 <= _KNOB_GRID:
            values = list(range(int(knob.low), int(knob.high) + 1))
        else:
            spaced = (np.geomspace(knob.low, knob.high, _KNOB_GRID) if knob.log and knob.low > 0
                      else np.linspace(knob.low, knob.high, _KNOB_GRID))
            values = sorted({int(round(v)) for v in spaced}) if knob.kind == "int" else [float(v) for v in spaced]
        axes.append([(knob.name, v) for v in values])
    return [dict(combo) for combo in itertools.product(*axes)]


def _batch_grid(space: ConfigSpace) -> list[int]:
    lo, hi = space.batch_size_min, space.batch_size_max
    steps = int(math.ceil(math.log2(hi / lo) * _BATCH_STEPS_PER_DOUBLING)) + 1
    return sorted({int(round(v)) for v in np.geomspace(lo, hi, max(steps, 1))} | {lo, hi})


def check_in_space(space: ConfigSpace, encoder: ConfigEncoder, operator: str, config: OpConfig) -> None:
    """Raise ``ValueError`` when ``config`` lies outside ``space`` (naming the device, batch size or knob)."""
    if config.device not in space.devices:
        raise ValueError(f"operator {operator!r}: config {config.label()} has device {config.device!r}, "
                         f"not one of the space's devices {list(space.devices)}")
    if not space.batch_size_min <= config.batch_size <= space.batch_size_max:
        raise ValueError(f"operator {operator!r}: config {config.label()} has batch_size {config.batch_size}, outside "
                         f"the space's {space.batch_size_min}..{space.batch_size_max}")
    for knob in space.knobs:
        value = encoder.knob_value(knob, config)
        if knob.kind == "categorical":
            if str(value) not in {str(c) for c in knob.choices}:
                raise ValueError(f"operator {operator!r}: config {config.label()} has knob {knob.name}={value!r}, "
                                 f"not one of {list(knob.choices)}")
        elif isinstance(value, (str, bool)) or not knob.low <= value <= knob.high:
            raise ValueError(f"operator {operator!r}: config {config.label()} has knob {knob.name}={value!r}, "
                             f"outside {knob.low}..{knob.high}")



def surrogate_optimizer(dimensions: Sequence[Any], seed: int, n_initial_points: int) -> SkoptOptimizer:
    """The skopt ask/tell optimiser with EI and a GP surrogate like ``gp_minimize``'s (Matern 5/2 with
    per-dimension length scales, normalised targets), except that the fitted noise is bounded to at
    most 10% of the target variance: with skopt's unbounded default a handful of points is often
    explained as pure noise, the surrogate goes flat and expected improvement vanishes everywhere."""
    n_dims = Space(normalize_dimensions(list(dimensions))).transformed_n_dims
    kernel = (ConstantKernel(1.0, (0.1, 10.0)) * Matern(length_scale=np.ones(n_dims), length_scale_bounds=[(0.05, 20.0)] * n_dims, nu=2.5)
              + WhiteKernel(1e-3, (1e-5, 0.1)))
    estimator = GaussianProcessRegressor(kernel=kernel, normalize_y=True, noise="gaussian", n_restarts_optimizer=1, random_state=seed)
    return SkoptOptimizer(list(dimensions), base_estimator=estimator, acq_func="EI", n_initial_points=n_initial_points,
                          acq_optimizer="sampling", acq_optimizer_kwargs={"n_points": 256}, random_state=seed)
