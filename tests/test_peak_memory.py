"""The runner's peak memory is its own: what the process held before the reset does not count."""

from __future__ import annotations

import sys

import pytest

from trident_flows.runtime.peak_memory import peak_rss_bytes, reset_peak

MB = 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the high-water mark is reset through Linux's /proc")
def test_reset_forgets_what_the_process_held_before():
    block = bytearray(200 * MB)
    block[:: 4096] = b"x" * len(block[:: 4096])  # touch every page
    held = peak_rss_bytes()
    del block
    assert reset_peak()
    assert peak_rss_bytes() < held - 150 * MB, "a worker's earlier work is not the runner's peak"
    again = bytearray(50 * MB)
    again[:: 4096] = b"y" * len(again[:: 4096])
    assert peak_rss_bytes() >= 50 * MB
