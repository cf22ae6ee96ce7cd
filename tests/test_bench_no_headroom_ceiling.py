"""``bench no-headroom-ceiling``'s arithmetic (pure): the spliced run's rate and the configurations new to a run."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.no_headroom_ceiling import Progress, new_configs, spliced_rate
from trident_flows.core.types import OpConfig


def _linear(rate: float, first: float, items: int) -> Progress:
    """A run that outputs ``rate`` items/s from ``first`` until all ``items`` are done."""
    t = np.linspace(0.0, first + items / rate, 2001)
    return Progress(t, np.clip((t - first) * rate, 0.0, items), first, first + items / rate)


def test_a_switch_at_the_first_output_runs_as_the_reference_and_a_late_one_as_the_start():
    slow, fast = _linear(10.0, 5.0, 1000), _linear(20.0, 5.0, 1000)
    assert spliced_rate(1000, slow, [fast], 5.0) == pytest.approx(20.0, rel=1e-3)
    assert spliced_rate(1000, slow, [fast], 500.0) == pytest.approx(10.0)  # the start had finished: no switch


def test_a_mid_run_switch_adds_the_start_s_time_to_the_reference_s_rest():
    slow, fast = _linear(10.0, 5.0, 1000), _linear(20.0, 5.0, 1000)
    # 300 items by t=35 at 10/s, then the last 700 at 20/s: 35 s; from the first output at 5 s: 1000 / 65 s
    assert spliced_rate(1000, slow, [fast], 35.0) == pytest.approx(1000 / 65.0, rel=1e-3)


def test_the_faster_reference_from_the_count_at_the_switch_is_the_one_followed():
    slow = _linear(10.0, 5.0, 1000)
    late_but_fast, early_but_slow = _linear(40.0, 20.0, 1000), _linear(15.0, 1.0, 1000)
    assert spliced_rate(1000, slow, [early_but_slow, late_but_fast], 5.0) == pytest.approx(40.0, rel=1e-3)


def test_new_configs_are_the_groups_the_default_does_not_run():
    cpu8, cpu2, gpu16 = OpConfig.make("cpu", batch_size=8), OpConfig.make("cpu", batch_size=2), OpConfig.make("gpu", batch_size=16, gpus=1.0)
    default = (("ocr", ((cpu8, 11),)), ("embed", ((gpu16, 1),)))
    chosen = (("ocr", ((cpu2, 10),)), ("embed", ((gpu16, 2),)))
    assert new_configs(chosen, default) == [("ocr", cpu2)]
