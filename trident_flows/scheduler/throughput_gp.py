"""The Gaussian process of an operator's log per-replica rate.

Contract:
- ``fit_gp(inputs, X, y, ages, kernel, ...)`` fits log per-replica rate ``y`` on the encoded windows
  ``X``: a weighted ridge regression (weights ``1 / (1 + age)``; the replica-count slope penalised
  ``REPLICA_PENALTY`` times the others) is the prior mean, and a GaussianProcessRegressor with
  Constant*Matern(2.5, ARD) + WhiteKernel (bounded hyperparameters, normalised target, extra noise
  ``stale_noise * age`` per window) models the residual. With ``iterations`` the hyperparameters are
  tuned by L-BFGS-B on ``optimise_points`` evenly spaced windows, then the GP is conditioned on all.
- ``start_kernel(previous, d)``: the previous fit's kernel when it has ``d`` inputs (warm start).
- ``standardised`` gives the GP's inputs, replica counts clamped to those seen (``ThroughputFit.replicas_seen``);
  ``lognormal`` turns log rates into the median and std of an operator's throughput.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from scipy.optimize import minimize
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Kernel, Matern, WhiteKernel

from trident_flows.core.types import OpConfig
from trident_flows.scheduler.model_inputs import ModelInputs

# The prior mean's ridge penalty on the replica-count input (1 on the others): counts change when workloads do, so a
# slope shared by the two goes to the workload; the GP on the residual still learns the contention the windows show at
# one workload. The price: contention that arrives together with a heavier workload is first taken for the workload.
REPLICA_PENALTY = 100.0


@dataclass(frozen=True)
class ThroughputFit:
    """A fitted throughput model: the inputs' layout and scaling, the prior mean and the GP of its residual."""

    encoder: ModelInputs
    x_mean: np.ndarray
    x_scale: np.ndarray
    coef: np.ndarray
    intercept: float
    gp: GaussianProcessRegressor
    counts_seen: tuple[float, ...] = ()  # every replica count of the training windows, ascending (set once they are chosen)
    count_windows: tuple[int, ...] = ()  # training windows at each of ``counts_seen``

    @property
    def replicas_seen(self) -> tuple[float, float]:
        """Fewest and most replicas of the training windows (predictions clamp to it); no clamp before they are known."""
        return (self.counts_seen[0], self.counts_seen[-1]) if self.counts_seen else (1.0, math.inf)


def start_kernel(previous: Kernel | None, d: int) -> Kernel:
    """The previous fit's kernel when the inputs match (warm start), else a fresh bounded one."""
    if previous is not None and _kernel_dims(previous) == d:
        return previous
    return (ConstantKernel(0.5, (1e-3, 1e2)) * Matern(length_scale=np.full(d, 2.0), length_scale_bounds=(5e-2, 1e3), nu=2.5)
            + WhiteKernel(0.05, (1e-5, 1.0)))


def fit_gp(encoder: ModelInputs, X: np.ndarray, y: np.ndarray, ages: np.ndarray, kernel: Kernel, *, stale_noise: float,
           iterations: int | None, optimise_points: int) -> ThroughputFit:
    """The prior mean and the GP on its residual; ``iterations`` of L-BFGS-B tune ``kernel`` first (None: kept)."""
    x_mean = X.mean(axis=0)
    x_scale = X.std(axis=0)
    x_scale[x_scale < 1e-9] = 1.0
    Z = (X - x_mean) / x_scale
    weights = 1.0 / (1.0 + ages)
    # weighted ridge prior mean (intercept unpenalised)
    wz_mean = np.average(Z, axis=0, weights=weights)
    wy_mean = float(np.average(y, weights=weights))
    Zc, yc = Z - wz_mean, y - wy_mean
    penalty = np.ones(Z.shape[1])
    penalty[encoder.replicas_column] = REPLICA_PENALTY
    A = (Zc * weights[:, None]).T @ Zc + np.diag(penalty)
    coef = np.linalg.solve(A, (Zc * weights[:, None]).T @ yc)
    intercept = wy_mean - float(wz_mean @ coef)
    resid = y - (Z @ coef + intercept)
    alpha = 1e-8 + stale_noise * ages
    if iterations is not None:
        # hyperparameters on an evenly spaced subset (O(n^2 d) per L-BFGS step), then one exact fit on all
        sub = np.unique(np.linspace(0, len(y) - 1, min(len(y), optimise_points)).round().astype(int))
        tuned = GaussianProcessRegressor(kernel=kernel, alpha=alpha[sub], normalize_y=True, optimizer=_lbfgs(iterations))
        kernel = tuned.fit(Z[sub], resid[sub]).kernel_
    gp = GaussianProcessRegressor(kernel=kernel, alpha=alpha, normalize_y=True, optimizer=None)
    gp.fit(Z, resid)
    return ThroughputFit(encoder, x_mean, x_scale, coef, intercept, gp)


def standardised(fit: ThroughputFit, configs: Sequence[OpConfig], replicas: np.ndarray, feats: np.ndarray) -> np.ndarray:
    """The GP's standardised inputs for ``configs`` at ``replicas`` (clamped to the counts seen: the per-replica rate is
    flat beyond them) and per-item features ``feats``."""
    replicas = np.clip(replicas, *fit.replicas_seen)
    return (fit.encoder.encode(configs, replicas, feats) - fit.x_mean) / fit.x_scale


def lognormal(mu: np.ndarray, s: np.ndarray, replicas: Any) -> tuple[np.ndarray, np.ndarray]:
    """Median and std of ``replicas * exp(N(mu, s^2))``."""
    median = np.exp(mu) * replicas
    return median, median * np.sqrt(np.expm1(np.square(s)))


def _lbfgs(maxiter: int) -> Callable[..., tuple[np.ndarray, float]]:
    """L-BFGS-B on the log marginal likelihood with a bounded number of iterations."""
    def optimise(obj_func, initial_theta, bounds):
        result = minimize(obj_func, initial_theta, method="L-BFGS-B", jac=True, bounds=bounds, options={"maxiter": maxiter})
        return result.x, result.fun
    return optimise


def _kernel_dims(kernel: Kernel) -> int:
    for value in kernel.get_params().values():
        if isinstance(value, Matern):
            return np.atleast_1d(value.length_scale).size
    return -1
