"""Benchmark ``faults``: faults injected while a pipeline runs under the trident policy, and what
each one cost (items lost or duplicated, time to recover).

Contract of ``run(quick, cases=CASES) -> BenchResult``: one local Ray cluster (``CPUS`` logical
CPUs, ``GPUS`` logical GPU, emulated devices); every case runs the emulated documents pipeline with
the trident policy in-process into an output directory prepared by ``runtime.resume``, except the
corrupt-input cases, which run the real document and video operators on adversarial files. The
cases (``CASES``: replica, runner and controller kills, an OOM storm, a read-only or full output,
corrupt inputs) and how each one's recovery is timed are listed in ``run``'s docstring.

Each row: items in, written, dead-lettered, lost (in neither table), duplicated (row ids present
more than once), seconds to recover, and the case's notes. Headline: ``items_lost_total`` and
``items_duplicated_total`` (target 0 each) and ``cases_failed`` (a case whose run did not end as
described; target 0).
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import psutil
import pyarrow.parquet as pq
import ray

from benchmarks.report import BenchResult, Target
from trident_flows.control.launch import find_runner, run_pipeline
from trident_flows.core.state import RunnerSettings
from trident_flows.core.types import ClusterSpec, StepKind, Transition, TransitionStep
from trident_flows.pipelines import emulated_docs
from trident_flows.pipelines.emulated import emulated_pipeline
from trident_flows.runtime import resume
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.runtime.spec import ID, SOURCE_ID
from trident_flows.scheduler.policies import make_policy

CPUS, GPUS = 8, 1
# The static placement leaves this many CPUs free, so that a rolling update (one new replica
# started before an old one retires) has room, as on a cluster with headroom.
SPARE_CPUS = 2
NAMESPACE = "trident-faults"
# The emulated documents stream runs this much faster than measured so a case lasts 20-60 s on 2 cores.
TIME_SCALE = 0.25
REPEAT_KILLS, REPEAT_EVERY_S = 5, 3.0
OOM_FACTOR = 6.0  # x memory per item: an embed batch of 32 needs ~2.9 GiB of a 2 GiB device, a batch of 8 fits
OOM_DEVICE_BYTES = 2 * 2**30
BOMB_PIXELS = 12000  # a 12000 x 12000 8-bit image: 144 MB decoded from about 140 kB
BLANK_PAGES = 3000
# A replica of the adversarial-input cases may hold its models (OCR, MiniLM, the video models: 0.5-0.9 GiB
# measured) and one batch; an input decoded in full (the bomb at 4 bytes a pixel: 550 MiB) would pass it.
MEMORY_BOUND_MIB = 1536
REPLICA_TITLE = "ray::Replica"
RUNNER_TITLE = "ray::PipelineRunner"


@dataclass
class FaultRow:
    case: str
    fault: str
    items_in: int = 0
    written: int = 0
    dead_lettered: int = 0
    lost: int = 0
    duplicated: int = 0
    recovery_s: float | None = None
    faults_injected: int = 0
    wall_s: float = 0.0
    ok: bool = False
    notes: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def _ray_procs(title: str) -> list[psutil.Process]:
    """Processes below this driver whose title starts with ``title`` (our own local cluster only)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = proc.cmdline()
            if cmd and cmd[0].startswith(title):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _sigkill(proc: psutil.Process) -> bool:
    try:
        proc.send_signal(signal.SIGKILL)
        return True
    except psutil.Error:
        return False


def _warm_replicas(runner: Any) -> set[str]:
    state = ray.get(runner.state.remote())
    return {r.replica_id for op in state.operators for r in op.replicas if r.warm and not r.draining}


def _replaced(runner: Any, before: set[str]) -> bool:
    """The runner noticed a dead replica and has a warm replacement: a replica not warm before, and as many as before."""
    now = _warm_replicas(runner)
    return bool(now - before) and len(now) >= len(before)


def _wait_for(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.1) -> float | None:
    """Seconds until ``predicate()`` holds, or None after ``timeout_s``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            if predicate():
                return time.monotonic() - t0
        except (ray.exceptions.RayError, ValueError, LookupError):
            pass
        time.sleep(poll_s)
    return None


def _spec(n: int, *, name: str = "faults-docs", memory_spikes: tuple[tuple[int, int, float], ...] = ()) -> Any:
    profile = PipelineProfile.load("documents")
    layout = emulated_docs.LAYOUT
    regimes = layout.default_regimes(profile, n)
    stages = layout.default_stages(profile, regimes, n, CPUS - SPARE_CPUS, GPUS)
    return emulated_pipeline(profile, stages, name=name, items=n, regimes=regimes, seed=7, time_scale=TIME_SCALE,
                             memory_spikes=memory_spikes)


class CaseRun:
    """One pipeline run in a background thread, into ``out`` prepared for resuming."""

    def __init__(self, spec: Any, out: Path, *, settings: RunnerSettings | None = None, policy: bool = True) -> None:
        self.spec, self.out, self.settings = spec, out, settings
        self.rows = list(spec.source())
        self.shards = resume.plan_shards(self.rows, resume.default_shard_size(len(self.rows)))
        self.name = f"faults-{uuid.uuid4().hex[:8]}"
        self.use_policy = policy
        self.summary: Any = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "CaseRun":
        plan = resume.open_run(self.out, self.spec.name, self.shards)
        policy = make_policy("trident", spec=self.spec, cluster=ClusterSpec.single_node(CPUS, GPUS)) if self.use_policy else None
        self.summary, self.error = None, None

        def body() -> None:
            try:
                self.summary = run_pipeline(self.spec, self.out, settings=self.settings, policy=policy, tick_s=1.0,
                                            name=self.name, namespace=NAMESPACE, resume=plan)
            except BaseException as exc:  # noqa: BLE001 - the case inspects how the run ended
                self.error = exc
        self._thread = threading.Thread(target=body, name=f"case-{self.name}", daemon=True)
        self._thread.start()
        return self

    def runner(self) -> Any:
        return find_runner(self.name, NAMESPACE)

    def wait_started(self, timeout_s: float = 300.0) -> bool:
        return _wait_for(lambda: ray.get(self.runner().state.remote()).items_in > 0, timeout_s) is not None

    def wait_first_commit(self, before: set[str] | None = None, timeout_s: float = 300.0) -> float | None:
        before = set(before or ())
        return _wait_for(lambda: bool(resume.committed_shards(self.out) - before) or not self.alive(), timeout_s)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout_s: float = 900.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)


def _output_items(out: Path, table: str) -> list[tuple[str, str]]:
    """``(row id, input item id)`` of every committed row of ``table`` ('data' or 'dead_letter'); a
    row split from an input (a video's clip) names its input in ``source_id``."""
    pairs = []
    for path in sorted((out / table).glob("*.parquet")):
        names = pq.read_schema(path).names
        part = pq.read_table(path, columns=[c for c in (ID, SOURCE_ID) if c in names])
        ids = [str(i) for i in part.column(ID).to_pylist()]
        sources = part.column(SOURCE_ID).to_pylist() if SOURCE_ID in part.column_names else [None] * len(ids)
        pairs.extend((i, str(s) if s else i) for i, s in zip(ids, sources))
    return pairs


def _count(row: FaultRow, run: CaseRun) -> FaultRow:
    """Fill the item counts of ``row`` from what ``run`` committed (input items; duplicated: row ids present twice)."""
    data, dead = _output_items(run.out, "data"), _output_items(run.out, "dead_letter")
    inputs = {str(r["id"]) for r in run.rows}
    written = {item for _, item in data}
    dead_items = {item for _, item in dead} - written
    ids = [i for i, _ in data + dead]
    row.items_in = len(inputs)
    row.written = len(written)
    row.dead_lettered = len(dead_items)
    row.lost = len(inputs - written - dead_items)
    row.duplicated = len(ids) - len(set(ids))
    return row


def _finish(row: FaultRow, run: CaseRun, t0: float, expect_error: bool = False) -> FaultRow:
    run.join()
    row.wall_s = round(time.monotonic() - t0, 2)
    _count(row, run)
    summary_error = run.summary.error if run.summary is not None else ""
    failed = run.error is not None or bool(summary_error)
    if failed and not expect_error:
        row.notes = (row.notes + "; " if row.notes else "") + f"run failed: {run.error or summary_error}"[:400]
    row.ok = (not failed or expect_error) and row.lost == 0 and row.duplicated == 0
    if run.summary is not None:
        row.details.update(ooms=run.summary.ooms, reconfigurations=run.summary.reconfigurations)
    return row


# ---------------------------------------------------------------------------- cases
def case_replica_kill(work: Path, n: int, kills: int, rng: random.Random) -> FaultRow:
    row = FaultRow("replica-kill-repeated" if kills > 1 else "replica-kill-once",
                   f"SIGKILL a random replica {'every %.0f s, %d times' % (REPEAT_EVERY_S, kills) if kills > 1 else 'once'}")
    run = CaseRun(_spec(n), work / row.case).start()
    t0 = time.monotonic()
    run.wait_started()
    recoveries = []
    for k in range(kills):
        time.sleep(REPEAT_EVERY_S if k else 2.0)
        if not run.alive():
            break
        runner = run.runner()
        before = _warm_replicas(runner)
        victims = _ray_procs(REPLICA_TITLE)
        if not victims or not _sigkill(rng.choice(victims)):
            continue
        row.faults_injected += 1
        # the run's end first: once it has ended its runner is gone and asking it raises, which would wait out the timeout
        took = _wait_for(lambda runner=runner, before=before: not run.alive() or _replaced(runner, before), 120.0)
        if took is not None and run.alive():
            recoveries.append(took)
    row.recovery_s = round(max(recoveries), 2) if recoveries else None
    return _finish(row, run, t0)


def _ocr_rollout(runner: Any) -> Transition:
    state = ray.get(runner.state.remote())
    ocr = next(op for op in state.operators if op.name == "ocr")
    old = ocr.replicas[0].config
    new = dataclasses.replace(old, batch_size=max(1, old.batch_size // 2))
    count = len([r for r in ocr.replicas if not r.draining and r.config == old])
    steps = [step for _ in range(count) for step in (TransitionStep(StepKind.START, "ocr", new, 1), TransitionStep(StepKind.RETIRE, "ocr", old, 1))]
    return Transition(tuple(steps), reason="fault benchmark: rolling update of ocr, one replica at a time")


def case_replica_kill_rolling(work: Path, n: int, rng: random.Random) -> FaultRow:
    row = FaultRow("replica-kill-rolling", "SIGKILL one new and one old replica during a rolling update of ocr")
    run = CaseRun(_spec(n), work / row.case).start()
    t0 = time.monotonic()
    run.wait_started()
    runner = run.runner()
    before_procs = {p.pid for p in _ray_procs(REPLICA_TITLE)}
    before = _warm_replicas(runner)
    apply_ref = runner.apply.remote(_ocr_rollout(runner))
    _wait_for(lambda: bool({p.pid for p in _ray_procs(REPLICA_TITLE)} - before_procs), 60.0, 0.05)
    new = [p for p in _ray_procs(REPLICA_TITLE) if p.pid not in before_procs]
    old = [p for p in _ray_procs(REPLICA_TITLE) if p.pid in before_procs]
    for group in (new, old):
        if group and _sigkill(rng.choice(group)):
            row.faults_injected += 1
    t_kill = time.monotonic()
    try:
        report = ray.get(apply_ref, timeout=300)
        row.details["rollout"] = {"ok": report.ok, "error": report.error, "seconds": round(report.seconds, 2)}
    except (ray.exceptions.RayError, TimeoutError) as exc:
        row.details["rollout"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    took = _wait_for(lambda: len(_warm_replicas(runner)) >= len(before) or not run.alive(), 120.0)
    row.recovery_s = round(time.monotonic() - t_kill, 2) if took is not None else None
    return _finish(row, run, t0)


def case_runner_kill(work: Path, n: int) -> FaultRow:
    row = FaultRow("runner-kill", "SIGKILL the runner actor after its first commit; re-run resumes")
    spec = _spec(n)
    run = CaseRun(spec, work / row.case).start()
    t0 = time.monotonic()
    run.wait_first_commit()
    victims = _ray_procs(RUNNER_TITLE)
    if victims and _sigkill(victims[0]):
        row.faults_injected = 1
    t_kill = time.monotonic()
    run.join()
    row.details["first_run_error"] = f"{type(run.error).__name__}" if run.error else (run.summary.error if run.summary else "")
    committed = resume.committed_shards(run.out)
    row.details["shards_committed_before_rerun"] = len(committed)
    rerun = CaseRun(spec, run.out).start()
    took = rerun.wait_first_commit(before=committed)
    row.recovery_s = round(time.monotonic() - t_kill, 2) if took is not None else None
    row.details["runner_died"] = run.error is not None
    return _finish(row, rerun, t0)


_CONTROLLER = """
import sys, time
import ray
from trident_flows.control.launch import find_runner
from trident_flows.control.loop import ControlLoop
from trident_flows.scheduler.policies import make_policy
from trident_flows.core.types import ClusterSpec
from benchmarks.faults import _ocr_rollout
address, name, namespace, mode = sys.argv[1:5]
ray.init(address=address, log_to_driver=False, configure_logging=False)
runner = find_runner(name, namespace)
if mode == "rollout":
    print("rollout", flush=True)
    ray.get(runner.apply.remote(_ocr_rollout(runner)))
    print("rollout done", flush=True)
else:
    spec = ray.get(runner.pipeline_spec.remote())
    loop = ControlLoop(runner, make_policy("trident", spec=spec, cluster=ClusterSpec.single_node({cpus}, {gpus})), tick_s=1.0)
    while not ray.get(runner.state.remote()).finished:
        loop.tick()
        print("tick", flush=True)
        time.sleep(1.0)
"""


def _controller(address: str, name: str, mode: str) -> subprocess.Popen:
    script = _CONTROLLER.format(cpus=CPUS, gpus=GPUS)
    return subprocess.Popen([sys.executable, "-c", script, address, name, NAMESPACE, mode], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)


def case_controller_kill(work: Path, n: int) -> FaultRow:
    row = FaultRow("controller-kill", "SIGKILL the controller process mid-rollout, start a new one")
    run = CaseRun(_spec(n), work / row.case, policy=False).start()
    t0 = time.monotonic()
    run.wait_started()
    runner = run.runner()
    address = ray.get_runtime_context().gcs_address
    before_procs = {p.pid for p in _ray_procs(REPLICA_TITLE)}
    first = _controller(address, run.name, "rollout")
    started = _wait_for(lambda: bool({p.pid for p in _ray_procs(REPLICA_TITLE)} - before_procs) or first.poll() is not None, 120.0, 0.05)
    row.details["rollout_started"] = started is not None and first.poll() is None
    if first.poll() is None:
        os.killpg(first.pid, signal.SIGKILL)
        row.faults_injected = 1
    first.wait()
    t_kill = time.monotonic()
    second = _controller(address, run.name, "loop")
    ticked = any(line.startswith("tick") for line in second.stdout) if second.stdout else False  # (the solver prints a banner first)
    row.recovery_s = round(time.monotonic() - t_kill, 2) if ticked else None
    run.join()
    try:
        second.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(second.pid, signal.SIGKILL)
        second.wait()
    if run.summary is not None:
        row.details["reports"] = [{"ok": r["ok"], "error": r["error"][:200]} for r in run.summary.apply_reports]
    del runner
    return _finish(row, run, t0)


def case_oom_storm(work: Path, n: int) -> FaultRow:
    row = FaultRow("oom-storm", f"half the stream at {OOM_FACTOR:g}x memory per item on {OOM_DEVICE_BYTES / 2**30:g} GiB devices")
    spec = _spec(n, memory_spikes=((n // 4, n // 2, OOM_FACTOR),))
    run = CaseRun(spec, work / row.case, settings=RunnerSettings(device_memory_bytes=OOM_DEVICE_BYTES)).start()
    t0 = time.monotonic()
    oom_times: list[float] = []

    def ooms() -> int:
        return ray.get(run.runner().state.remote()).ooms
    seen = 0
    while run.alive():
        try:
            now = ooms()
        except (ray.exceptions.RayError, LookupError):
            now = seen
        if now > seen:
            oom_times.append(time.monotonic())
            seen = now
        time.sleep(0.2)
    row.faults_injected = run.summary.ooms if run.summary is not None else seen
    row.recovery_s = round(oom_times[-1] - oom_times[0], 2) if len(oom_times) > 1 else (0.0 if oom_times else None)
    return _finish(row, run, t0)


def _mount_tmpfs(path: Path, size: str) -> str:
    """Mount a tmpfs at ``path``; '' when done, else why not (the case is then skipped)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return "needs root to mount a tmpfs"
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
    return "" if proc.returncode == 0 else f"mount failed: {proc.stderr.strip()}"


def _whole_parquet_only(out: Path) -> tuple[bool, str]:
    """Every file where readers look is a whole Parquet file, and no temporary file is left."""
    for sub in ("data", "dead_letter"):
        folder = out / sub
        for p in sorted(folder.iterdir()) if folder.exists() else []:
            if not p.name.endswith(".parquet"):
                return False, f"stray file {p}"
            try:
                pq.read_table(p)
            except Exception as exc:  # noqa: BLE001 - a corrupt file is the finding
                return False, f"unreadable {p}: {exc}"
    return True, ""


def case_output_fs(work: Path, n: int, mode: str) -> FaultRow:
    case = f"output-{mode}"
    row = FaultRow(case, "output filesystem remounted read-only after the first commit" if mode == "read-only"
                   else "output filesystem filled up after the first commit")
    out = work / case
    why = _mount_tmpfs(out, "512m")
    if why:
        row.notes = f"skipped: {why}"
        return row
    filler = out / "filler.bin"
    try:
        spec = _spec(n)
        run = CaseRun(spec, out).start()
        t0 = time.monotonic()
        run.wait_first_commit()
        if mode == "read-only":
            # a remount is refused (busy) while a file is open for writing: retry between writes
            if _wait_for(lambda: subprocess.run(["mount", "-o", "remount,ro", str(out)], capture_output=True).returncode == 0,
                         60.0, 0.02) is None:
                raise RuntimeError(f"could not remount {out} read-only within 60 s (busy)")
        else:
            with open(filler, "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 2**20)
                except OSError:
                    pass
        row.faults_injected = 1
        run.join()
        error = str(run.error) if run.error else (run.summary.error if run.summary else "")
        row.details["error"] = error[:400]
        whole, problem = _whole_parquet_only(out)
        row.details["only_whole_parquet"] = whole
        named = str(out) in error
        if mode == "read-only":
            subprocess.run(["mount", "-o", "remount,rw", str(out)], check=True)
        else:
            filler.unlink()
        t_fix = time.monotonic()
        committed = resume.committed_shards(out)
        rerun = CaseRun(spec, out).start()
        took = rerun.wait_first_commit(before=committed)
        row.recovery_s = round(time.monotonic() - t_fix, 2) if took is not None else None
        _finish(row, rerun, t0)
        row.ok = row.ok and bool(error) and named and whole
        row.notes = f"error: {error[:160]}" + ("" if whole else f"; {problem}")
        return row
    finally:
        subprocess.run(["umount", "-l", str(out)], capture_output=True)


CASES = ("replica-kill-once", "replica-kill-repeated", "replica-kill-rolling", "runner-kill", "controller-kill", "oom-storm",
         "output-read-only", "output-full", "corrupt-inputs", "corrupt-video")


def run_case(name: str, work: Path, n: int, rng: random.Random) -> FaultRow:
    """One case by name (``CASES``); the cluster must be up (see ``run``)."""
    if name == "replica-kill-once":
        return case_replica_kill(work, n, 1, rng)
    if name == "replica-kill-repeated":
        return case_replica_kill(work, n, REPEAT_KILLS, rng)
    if name == "replica-kill-rolling":
        return case_replica_kill_rolling(work, n, rng)
    if name == "runner-kill":
        return case_runner_kill(work, n)
    if name == "controller-kill":
        return case_controller_kill(work, n)
    if name == "oom-storm":
        return case_oom_storm(work, n)
    if name in ("output-read-only", "output-full"):
        return case_output_fs(work, n, name.removeprefix("output-"))
    if name == "corrupt-inputs":
        from benchmarks.faults_inputs import case_corrupt_inputs

        return case_corrupt_inputs(work)
    if name == "corrupt-video":
        from benchmarks.faults_inputs import case_corrupt_video

        return case_corrupt_video(work)
    raise ValueError(f"unknown fault case {name!r}; choose one of {CASES}")


def start_cluster() -> bool:
    """Start the benchmark's local Ray cluster unless one is up; True when started here."""
    if ray.is_initialized():
        return False
    for attempt in range(5):
        try:
            ray.init("local", num_cpus=CPUS, num_gpus=GPUS, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
            return True
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception when its raylet misses a fixed 30 s start-up wait
            if "timed out during startup" not in str(exc) or attempt == 4:
                raise
            ray.shutdown()
    return True


def run(quick: bool = False, *, cases: tuple[str, ...] = CASES, log: Any = print) -> BenchResult:
    """Run ``cases``, each with its recovery measured as follows.

    - ``replica-kill-once`` / ``replica-kill-repeated``: SIGKILL a random replica process once / every
      ``REPEAT_EVERY_S`` seconds ``REPEAT_KILLS`` times; recovery: from the kill until the runner has noticed (a batch
      sent to the dead replica fails) and has as many warm replicas as before (the longest of the kills).
    - ``replica-kill-rolling``: a rolling update of ``ocr`` (half the batch size, one replica at a time; the placement
      leaves ``SPARE_CPUS`` free for it), one new and one old replica SIGKILLed while it runs; recovery: until the
      rollout has ended and the runner has as many warm replicas as before.
    - ``runner-kill``: SIGKILL the runner's process after the first commit; the run is re-opened
      (``resume.open_run``) as ``trident-flows run`` does when re-run; recovery: to the resumed run's first commit.
    - ``controller-kill``: a separate controller process starts a rolling update, is SIGKILLed mid-rollout, and a new
      one is started; recovery: to the new controller's first tick.
    - ``oom-storm``: half the stream carries ``OOM_FACTOR`` x memory per item on 2 GiB emulated GPUs; recovery: from
      the first OOM to the last.
    - ``output-read-only`` / ``output-full``: the output tmpfs (root only; skipped otherwise) remounted read-only /
      filled after the first commit: the run must stop with an error naming the path, leave only whole Parquet
      files, and finish without loss when re-run after the fix; recovery: from the fix to the first commit.
    - ``corrupt-inputs`` / ``corrupt-video`` (real operators): zero-byte, truncated, encrypted, not-a-PDF, a
      decompression bomb (``BOMB_PIXELS``), ``BLANK_PAGES`` blank pages; a damaged and a truncated video: each
      dead-lettered once with its reason, ``peak_rss_mib`` within ``MEMORY_BOUND_MIB``."""
    n = 200 if quick else 400
    rng = random.Random(18)
    started = start_cluster()
    work = Path(tempfile.mkdtemp(prefix="trident-faults-"))
    rows: list[FaultRow] = []
    try:
        for name in cases:
            t0 = time.monotonic()
            try:
                row = run_case(name, work, n, rng)
            except Exception as exc:  # noqa: BLE001 - a case that breaks is a failed row, the others still run
                row = FaultRow(name, "", notes=f"case broke: {type(exc).__name__}: {exc}"[:400])
            rows.append(row)
            log(f"{row.case}: in {row.items_in} written {row.written} dead {row.dead_lettered} lost {row.lost} dup {row.duplicated} "
                f"recover {row.recovery_s} s ok={row.ok} ({time.monotonic() - t0:.0f} s) {row.notes[:120]}")
    finally:
        if started:
            ray.shutdown()
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    ran = [r for r in rows if not r.notes.startswith("skipped")]
    summary = {
        "items_lost_total": sum(r.lost for r in ran),
        "items_duplicated_total": sum(r.duplicated for r in ran),
        "cases_failed": sum(1 for r in ran if not r.ok),
        "cases_skipped": len(rows) - len(ran),
        "cases": len(rows),
    }
    targets = {"items_lost_total": Target("==", 0), "items_duplicated_total": Target("==", 0), "cases_failed": Target("==", 0)}
    return BenchResult("faults", summary, targets, raw={"rows": [asdict(r) for r in rows], "items": n, "time_scale": TIME_SCALE},
                       figure=_figure(rows), notes=table_markdown(rows))


def table_markdown(rows: list[FaultRow]) -> str:
    lines = ["| case | fault | items in | written | dead-lettered | lost | duplicated | recovery (s) | ok |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rec = "" if r.recovery_s is None else f"{r.recovery_s:g}"
        lines.append(f"| {r.case} | {r.fault} | {r.items_in} | {r.written} | {r.dead_lettered} | {r.lost} | {r.duplicated} | {rec} | "
                     f"{'yes' if r.ok else ('skipped' if r.notes.startswith('skipped') else 'NO')} |")
    return "\n".join(lines)


def _figure(rows: list[FaultRow]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
    ax.axis("off")
    cells = [[r.case, r.items_in, r.written, r.dead_lettered, r.lost, r.duplicated, "" if r.recovery_s is None else f"{r.recovery_s:g}",
              "yes" if r.ok else ("skipped" if r.notes.startswith("skipped") else "NO")] for r in rows]
    table = ax.table(cellText=cells, colLabels=["case", "in", "written", "dead", "lost", "dup", "recover s", "ok"], loc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    ax.set_title("faults injected under the trident policy")
    return fig
