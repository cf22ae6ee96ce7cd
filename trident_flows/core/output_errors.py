"""Errors from writing a run's outputs: every write under the run's output (shards, the dead-letter table, the timeline,
the summary JSON, the decision log) fails as ``OutputWriteError`` naming the path and what to do.

Contract: ``with naming_the_path(path): ...`` re-raises an ``OSError`` raised inside as ``OutputWriteError`` (an
``OSError`` with the same errno) whose message names the error's own file name, or ``path`` where the error names none
(``ENOSPC`` from a buffered write names no file), and says to free space or make the filesystem writable, then re-run.
An ``OutputWriteError`` passes through unchanged.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator


class OutputWriteError(OSError):
    """The output filesystem refused a write (full, read-only, ...); the message names the path and the fix."""


@contextlib.contextmanager
def naming_the_path(default: Path | str) -> Iterator[None]:
    """Re-raise an ``OSError`` as ``OutputWriteError`` naming the path and what to do."""
    try:
        yield
    except OutputWriteError:
        raise
    except OSError as exc:
        path = exc.filename or default
        raise OutputWriteError(exc.errno, f"cannot write {path}: {exc.strerror or exc}; free space on that filesystem or make "
                                          "it writable, then run the same command again to resume") from exc
