"""Peak resident memory of this process since the runner started in it.

Ray may start an actor in a worker process that ran other work first: in ``bench dataplane`` on
3 nodes the runner started in a worker that had run Ray Data tasks, whose lifetime peak
(``ru_maxrss``) was 196 MB when the runner took it over, while the runner itself never held more
than 136 MB (psutil sampled every 0.2 s), as on one node. ``reset_peak()`` resets Linux's
high-water mark of this process (writing ``5`` to ``/proc/self/clear_refs``) and says whether it
could; ``peak_rss_bytes()`` reads the mark (``VmHWM`` of ``/proc/self/status``). Where either is
unavailable (not Linux) the process-lifetime ``ru_maxrss`` is the answer, earlier work included.
"""

from __future__ import annotations

import resource
import sys


def reset_peak() -> bool:
    """Reset this process's peak resident memory to what it holds now; False where the system does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def high_water_bytes() -> int | None:
    """The kernel's high-water mark of this process's resident memory (Linux ``VmHWM``), None where it has none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_rss_bytes() -> int:
    """Peak resident memory of this process since the last ``reset_peak()`` (else since it started)."""
    mark = high_water_bytes()
    if mark is not None:
        return mark
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux
