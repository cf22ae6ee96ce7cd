"""Sizes and rates written by people (``80GiB``, ``100Gbps``, ``16GBps``), as bytes and bytes/s.

Contract: ``parse_size(text, what)`` -> bytes (``80GiB``, ``512MiB``, ``1.5TB``; binary and decimal
units); ``parse_rate(text, what)`` -> bytes per second (``100Gbps`` is bits, ``16GBps`` or
``16gbytes/s`` bytes). A text that is not one raises ``ValueError`` naming ``what`` and showing
what to write. Used by cluster strings, the node catalogue and Ray node labels alike.
"""

from __future__ import annotations

import re

_SIZE_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_RATE_UNITS = {"bps": 1 / 8, "kbps": 1e3 / 8, "mbps": 1e6 / 8, "gbps": 1e9 / 8,  # bits per second
               "bytes/s": 1, "kbytes/s": 1e3, "mbytes/s": 1e6, "gbytes/s": 1e9}


def parse_size(text: str, what: str) -> int:
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"{what}={text!r} is not a size; write e.g. 80GiB, 512MiB or 1.5TB")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_rate(text: str, what: str) -> float:
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z/]+)\s*", text)
    unit = m.group(2) if m else ""
    if unit.endswith("Bps"):
        unit = unit[:-3].lower() + "bytes/s"
    if not m or unit.lower() not in _RATE_UNITS:
        raise ValueError(f"{what}={text!r} is not a rate; write e.g. 100Gbps (bits) or 16GBps (bytes)")
    return float(m.group(1)) * _RATE_UNITS[unit.lower()]
