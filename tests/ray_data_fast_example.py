"""examples/ray_data_emulated.py's ``build`` at a tenth of its measured time, as a ``MODULE:FUNCTION`` target for the
tests that run a Ray Data pipeline end to end through the CLI or the flow: the example's stages and rows, without
its ~20 s replica start (embed's cold start) and ~5 s of OCR per scanned document."""

from __future__ import annotations

from pathlib import Path

from trident_flows.ray_data import load_function

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "ray_data_emulated.py") + ":build"
TARGET = f"{__file__}:build"
TIME_SCALE = 0.1


def build(synth: int = 1000, regimes: str | None = None, seed: int = 0):
    return load_function(EXAMPLE)(synth=synth, regimes=regimes, seed=seed, time_scale=TIME_SCALE)
