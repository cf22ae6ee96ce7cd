"""``bench warm-start``'s summary from its runs (pure): the ratios it reports and what it counts."""

from __future__ import annotations

from typing import Any

from benchmarks.warm_start import summarise


def _run(rate: float | None, lost: int = 0, ooms: int = 0) -> dict[str, Any]:
    return {"items_per_s": rate, "items_lost": lost, "ooms": ooms, "prepositioned": 0, "reactions": []}


def test_a_workload_without_headroom_reports_the_clairvoyant_bound_and_trident_from_a_tuned_start() -> None:
    main = {"static_hindsight": _run(10.0), "oracle": _run(12.0), "static_default": _run(8.0),
            "repeats": [{"cold": _run(11.0), "earlier": _run(9.0), "warm": _run(12.0)}]}
    flat = {"static_hindsight": _run(30.0), "oracle": _run(30.0), "static_default": _run(17.5),
            "s_star_at_first_tick": _run(16.9), "static_tuned": _run(20.0),
            "repeats": [{"cold": _run(17.5), "earlier": _run(15.0), "warm": _run(22.0),
                         "from_tuned": {"cold": _run(20.0), "warm": _run(19.0, lost=2)}}]}
    summary = summarise({"cpu-only": main, "docs-baseline": flat})
    assert summary["sim_cold_t_over_oracle"] == 11.0 / 12.0 and summary["headroom"] == 1.2
    assert summary["docs-baseline.cold_vs_static_hindsight_median"] == 17.5 / 30.0
    assert summary["docs-baseline.bound_vs_static_hindsight"] == 16.9 / 30.0
    assert summary["docs-baseline.from_tuned.cold_vs_static_median"] == 1.0
    assert summary["docs-baseline.from_tuned.warm_vs_static_median"] is None  # its one run lost items: no rate to quote
    assert summary["items_lost"] == 2  # the runs from the tuned start count too
