"""Row identities as the emulated operators hash them, carried by the simulator as numbers.

The emulated operators decide which rows a filter drops and how many children a splitter makes
by hashing ``f"{operator}:{id}"`` with CRC-32 (``pipelines.emulated._unit``). The simulator carries
each row's id as (CRC-32 of the id, its length in bytes) and reproduces every hash from them
without building strings (CRC-32 is affine in its start value: ``_shift``).

Contract: ``id_columns(ids)`` gives (crc, length) arrays of strings (``item_id_columns(start,
count)`` those of ``synthetic_rows``' input item names, vectorised); ``Hasher(name).unit(crc,
length)`` equals ``pipelines.emulated._unit(name, id)`` for every row; ``child_ids(crc, length,
k)`` gives the (crc, length) of ``id + "/" + str(k)``.
"""

from __future__ import annotations

import functools
import zlib
from typing import Iterable

import numpy as np


def id_columns(ids: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    """(CRC-32, byte length) of each id, as float columns (both exact in a float64)."""
    encoded = [str(i).encode() for i in ids]
    crc = np.fromiter((zlib.crc32(b) for b in encoded), dtype=np.float64, count=len(encoded))
    length = np.fromiter((len(b) for b in encoded), dtype=np.float64, count=len(encoded))
    return crc, length


_DIGITS = 7  # synthetic_rows names input item k "item-%07d"
_PREFIX = b"item-"


@functools.lru_cache(maxsize=None)
def _digit_tables() -> tuple[int, np.ndarray]:
    """CRC-32 of ``item-0000000`` and, per digit position and digit, what it XORs in (the CRC of
    a fixed-length message is affine in its bytes)."""
    zero = _PREFIX + b"0" * _DIGITS
    base = zlib.crc32(zero)
    tables = np.zeros((_DIGITS, 10), dtype=np.uint32)
    for p in range(_DIGITS):
        for d in range(10):
            message = bytearray(zero)
            message[len(_PREFIX) + p] = ord("0") + d
            tables[p, d] = zlib.crc32(bytes(message)) ^ base
    return base, tables


def item_id_columns(start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``id_columns`` of input items ``start .. start+count-1`` named as ``synthetic_rows`` names them
    (``item-0000042``), vectorised (a stream of hours holds millions of items)."""
    k = np.arange(start, start + count, dtype=np.int64)
    if start + count > 10**_DIGITS:  # longer names than the tables cover: one at a time
        return id_columns(f"item-{j:07d}" for j in k.tolist())
    base, tables = _digit_tables()
    crc = np.full(count, base, dtype=np.uint32)
    for p in range(_DIGITS):
        crc ^= tables[p][(k // 10 ** (_DIGITS - 1 - p)) % 10]
    return crc.astype(np.float64), np.full(count, float(len(_PREFIX) + _DIGITS))


@functools.lru_cache(maxsize=None)
def _shift_tables(n: int) -> np.ndarray:
    """(4, 256) uint32: ``shift(n, b << 8k)`` for each byte value ``b`` at byte position ``k``."""
    zeros = b"\0" * n
    base = zlib.crc32(zeros)
    return np.array([[zlib.crc32(zeros, b << (8 * k)) ^ base for b in range(256)] for k in range(4)], dtype=np.uint32)


def _shift(n: int, x: np.ndarray) -> np.ndarray:
    """``shift(n, x)`` per element, from four 256-entry tables (one per byte of ``x``).

    ``zlib.crc32(data, start)`` is affine in ``start`` for a given length of ``data``:
    ``crc32(data, start) == shift(len(data), start) ^ crc32(data)``, where ``shift(n, .)`` is linear over
    GF(2) (``crc32(b"\\0" * n, start) ^ crc32(b"\\0" * n)``); so the hash of ``operator + ":" + id`` is
    ``shift(len(id), crc32(operator + ":")) ^ crc32(id)``, and the CRC of a child id ``id + "/k"`` is
    ``shift(len("/k"), crc32(id)) ^ crc32("/k")``."""
    t = _shift_tables(n)
    return t[0][x & 0xFF] ^ t[1][(x >> 8) & 0xFF] ^ t[2][(x >> 16) & 0xFF] ^ t[3][x >> 24]


def child_ids(crc: np.ndarray, length: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(CRC-32, length) of the child ids ``id + "/" + str(k)`` (the emulated splitter's names)."""
    suffix = f"/{k}".encode()
    out = _shift(len(suffix), crc.astype(np.uint32)) ^ np.uint32(zlib.crc32(suffix))
    return out.astype(np.float64), length + len(suffix)


class Hasher:
    """``unit(crc, length)``: the emulated operator ``name``'s number in [0, 1) for each row's id."""

    def __init__(self, name: str) -> None:
        self.prefix = zlib.crc32(f"{name}:".encode())
        self._by_length = np.zeros(0, dtype=np.uint32)
        self._starts(32)

    def _starts(self, longest: int) -> np.ndarray:
        """``shift(n, crc32(name + ":"))`` for every id length ``n`` up to ``longest``."""
        if longest >= len(self._by_length):
            self._by_length = np.array([zlib.crc32(b"\0" * n, self.prefix) ^ zlib.crc32(b"\0" * n) for n in range(2 * longest + 1)],
                                       dtype=np.uint32)
        return self._by_length

    def unit(self, crc: np.ndarray, length: np.ndarray) -> np.ndarray:
        lengths = length.astype(np.intp)
        try:
            starts = self._by_length[lengths]
        except IndexError:  # an id longer than any before
            starts = self._starts(int(lengths.max()))[lengths]
        return (crc.astype(np.uint32) ^ starts) * 2.0**-32
