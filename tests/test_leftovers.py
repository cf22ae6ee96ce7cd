"""Nothing left running: a command whose Ray worker outlives ``ray.shutdown`` (a non-daemon thread keeps
its process alive, as cosmos-xenna's ``NodeResourceMonitor`` does) leaves no process behind, judged by
the process table below the command before and after it (orphans included)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from test_runtime_support import child_env

from benchmarks.report import BenchResult

_LAUNCHER = """
import sys
import benchmarks as bench
bench.BENCHMARKS["stubborn"] = "test_leftovers"
from trident_flows.cli import app
app(sys.argv[1:], prog_name="trident-flows")
"""


def run(quick: bool = False) -> BenchResult:
    """A benchmark-registry entry: starts a local Ray node and an actor whose process cannot exit by itself."""
    import threading

    import ray

    for attempt in range(5):  # Ray waits a fixed 30 s for its raylet, which a heavily loaded machine can miss
        try:
            ray.init("local", num_cpus=1, num_gpus=0, include_dashboard=False, log_to_driver=False, configure_logging=False)
            break
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for that
            ray.shutdown()
            if "timed out during startup" not in str(exc) or attempt == 4:
                raise

    @ray.remote(num_cpus=0)
    class Stubborn:
        def __init__(self) -> None:
            threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()

        def pid(self) -> int:
            return os.getpid()

    actor = Stubborn.remote()
    pid = ray.get(actor.pid.remote())
    Path(os.environ["STUBBORN_PID_FILE"]).write_text(str(pid))
    return BenchResult("stubborn", {"worker_pid": pid})


# Runs a command as its only child with PR_SET_CHILD_SUBREAPER set, so every process the command
# starts, even one re-parented when its parent exits (a Ray worker whose raylet is gone), stays below
# it; after the command it reports what is still running below it (other jobs' processes on the
# machine are never seen), then stops those.
_WATCH = """
import ctypes, json, subprocess, sys, time
import psutil
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
before = [p.pid for p in psutil.Process().children(recursive=True)]
done = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=600)
time.sleep(2.0)
left = []
for p in psutil.Process().children(recursive=True):
    try:
        if p.status() != psutil.STATUS_ZOMBIE:
            left.append(f"{p.pid} {' '.join(p.cmdline()[:3])}")
            p.kill()
    except psutil.Error:
        pass
json.dump({"before": before, "rc": done.returncode, "output": (done.stdout + done.stderr)[-4000:], "left": left}, sys.stdout)
"""


def _watched(args: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", _WATCH, sys.executable, "-c", _LAUNCHER, *args],
                          capture_output=True, text=True, timeout=900, env=env)
    return json.loads(done.stdout)


def test_a_command_leaves_no_ray_process_running_even_one_that_outlives_ray_shutdown(tmp_path):
    # Ray itself sometimes ends such a worker at shutdown after all (seen once in a full CI run: the
    # worker was gone within the guard's grace, nothing was left and nothing needed stopping); the case
    # under test is the one where it survives, so such a run is tried again, and every run must leave nothing.
    stopped = []
    for attempt in range(3):
        out = tmp_path / str(attempt)
        out.mkdir()
        report = _watched(["bench", "stubborn", "--out", str(out)], child_env(STUBBORN_PID_FILE=str(out / "worker.pid")))
        assert report["rc"] == 0, report["output"]
        assert report["before"] == [] and (out / "worker.pid").exists()
        assert report["left"] == [], f"left running after the command: {report['left']}"
        stopped.append("Ray processes left running" in report["output"])  # the command said what it stopped
        if stopped[-1]:
            break
    assert any(stopped), "the stubborn worker never outlived ray.shutdown in three runs"
