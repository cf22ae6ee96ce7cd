"""A trident tick runs BLAS on one thread (its matrices are small; OpenBLAS's idle threads spin on the
cores, CPU time the simulator charges to the tick) and leaves the thread pools as it found them."""

from __future__ import annotations

from trident_flows.scheduler.blas import _controller
from trident_flows.scheduler.trident_policy import TridentPolicy


def _blas_threads() -> list[int]:
    return [pool["num_threads"] for pool in _controller().info() if pool["user_api"] == "blas"]


def test_a_trident_tick_runs_blas_on_one_thread_and_restores_the_pools(monkeypatch) -> None:
    seen: list[list[int]] = []
    monkeypatch.setattr(TridentPolicy, "_tick_once", lambda self, state, samples: seen.append(_blas_threads()))
    before = _blas_threads()
    TridentPolicy().tick(None, [])
    assert before and seen == [[1] * len(before)]
    assert _blas_threads() == before
