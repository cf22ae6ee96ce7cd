"""``one_blas_thread()``: BLAS runs single-threaded inside the block (then as before).

The scheduler's matrices are small (GP fits and predictions on tens to a few thousand rows): a
multi-threaded BLAS only adds its threads' hand-offs, and an idle OpenBLAS thread spins on a core,
CPU time that is the tick's (the simulator charges a tick its process CPU time). Measured on the
2-core development machine: a memory-model refit took 22-26 ms of CPU with OpenBLAS's default
threads and 9-11 ms with one.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Iterator

from threadpoolctl import ThreadpoolController


@functools.cache
def _controller() -> ThreadpoolController:
    """One controller for every block: building one scans the loaded libraries (about 4 ms). Built at the first
    block, once the scheduler's imports (numpy, scipy, scikit-learn) have loaded their BLAS."""
    return ThreadpoolController()


@contextmanager
def one_blas_thread() -> Iterator[None]:
    with _controller().limit(limits=1, user_api="blas"):
        yield
