"""The ``trident-flows`` command line: synth, run, simulate, profile, bench.

Each command validates its options and hands over to the module that owns the work
(imported lazily, so ``--help`` is fast and emulated pipelines need no model packages).
A user error (a bad option or setting, ``RuntimeConfigError``) is printed as one line on
stderr saying what to change, with exit status 2 and no traceback; a traceback means a bug.

``bench`` runs the repository's ``benchmarks`` package, which the installed package leaves out:
``load_benchmarks()`` imports it from the checkout this ``trident_flows`` runs from (a checkout, or
an editable install of one), putting the checkout on ``sys.path`` and ``PYTHONPATH`` (so that Ray
workers and the benchmarks' subprocesses import it too), or from wherever Python finds it; where
there is none (an installed wheel) it is a user error saying that benchmarks run from a checkout
of the repository. ``--help`` lists the benchmarks from the registry's source without importing it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trident_flows.core.state import RuntimeConfigError
from trident_flows.pipelines import PIPELINES
from trident_flows.scheduler.policies import DEFAULT_POLICY, available_policies

app = typer.Typer(help="Trident: adaptive scheduling of multimodal data-curation pipelines on Ray.", no_args_is_help=True,
                  pretty_exceptions_show_locals=False)
synth_app = typer.Typer(help="Generate synthetic corpora (deterministic by seed).", no_args_is_help=True)
app.add_typer(synth_app, name="synth")
console = Console()
errors = Console(stderr=True)

USER_ERROR = 2  # the exit status of a user error, as for click's own usage errors


@contextmanager
def user_errors() -> Iterator[None]:
    """Print a ``RuntimeConfigError`` as ``error: ...`` and exit with status 2 (see the module docstring)."""
    try:
        yield
    except RuntimeConfigError as exc:
        errors.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(USER_ERROR) from None


def _check_choice(kind: str, name: str, choices: list[str]) -> None:
    if name not in choices:
        raise RuntimeConfigError(f"unknown {kind} {name!r}: choose one of {', '.join(choices)}")


def _check(validate: Callable[[], object]) -> None:
    """Run a validation whose ``ValueError`` names a bad option, as a ``RuntimeConfigError``."""
    try:
        validate()
    except ValueError as exc:
        raise RuntimeConfigError(str(exc)) from None


@app.callback()
def _stop_leftover_ray_processes(ctx: typer.Context) -> None:
    """Every command ends with no Ray process of its own left running (``runtime.leftovers``); a Ray
    connection the caller already had (the command run in-process, e.g. from a test) is left as it was."""
    from trident_flows.runtime.leftovers import RayProcessGuard

    def connected() -> bool:  # without importing Ray (slow) when nothing has
        ray = sys.modules.get("ray")
        return ray is not None and ray.is_initialized()

    connected_before = connected()
    guard = RayProcessGuard().start()

    def finish() -> None:
        guard.sample()  # before shutdown: a worker that outlives its raylet is re-parented out of reach
        if connected() and not connected_before:
            sys.modules["ray"].shutdown()
        killed = guard.finish()
        if killed:
            console.print(f"stopped {len(killed)} Ray processes left running: {', '.join(killed[:5])}{' ...' if len(killed) > 5 else ''}")
    ctx.call_on_close(finish)


@synth_app.command("documents")
def synth_documents(
    out: Path = typer.Option(..., help="Directory to write the PDFs and manifest.parquet into."),
    n: int = typer.Option(40, min=1, help="Number of documents."),
    regimes: Optional[str] = typer.Option(None, help="Regime schedule, e.g. 'short:20,long:10,scans:10' (default: the pipeline's)."),
    duplicates: float = typer.Option(0.1, min=0.0, max=1.0, help="Share of near-duplicate documents."),
    broken: float = typer.Option(0.05, min=0.0, max=1.0, help="Share of broken files (truncated, not-a-PDF, encrypted)."),
    seed: int = typer.Option(0, help="Random seed."),
) -> None:
    """Real PDF files (born-digital and scanned pages) following a regime schedule."""
    from trident_flows.pipelines.synth_documents import generate, parse_schedule

    with user_errors():
        _check(lambda: parse_schedule(regimes, n))
    manifest = generate(out, n=n, regimes=regimes, duplicates=duplicates, broken=broken, seed=seed)
    console.print(f"wrote {len(manifest)} documents to {out}")


@synth_app.command("video")
def synth_video(
    out: Path = typer.Option(..., help="Directory to write the MP4 files and manifest.parquet into."),
    n: int = typer.Option(8, min=1, help="Number of videos."),
    regimes: Optional[str] = typer.Option(None, help="Regime schedule, e.g. 'small:4,hd:2,long:2'."),
    broken: float = typer.Option(0.1, min=0.0, max=1.0, help="Share of broken files."),
    seed: int = typer.Option(0, help="Random seed."),
) -> None:
    """Real h264 MP4 files with known scene cuts and text overlays."""
    from trident_flows.pipelines.synth_video import generate, plan_videos

    with user_errors():
        _check(lambda: plan_videos(n=n, regimes=regimes, broken=broken, seed=seed))
    manifest = generate(out, n=n, regimes=regimes, broken=broken, seed=seed)
    console.print(f"wrote {len(manifest)} videos to {out}")


@app.command("run")
def run(
    pipeline: str = typer.Argument(..., help=f"Pipeline name: {', '.join(PIPELINES)}; or MODULE:FUNCTION returning a Ray Data "
                                   "Dataset (e.g. examples/ray_data_emulated.py:build), its output in OUT/dataset."),
    out: Path = typer.Option(Path("run-output"), help="Output directory (Parquet parts + dead-letter table)."),
    policy: str = typer.Option(DEFAULT_POLICY, help=f"Scheduling policy: {', '.join(available_policies())}; "
                               "static runs the pipeline as configured, never changing it."),
    input: Optional[str] = typer.Option(None, help="Directory of input files (documents/video pipelines); documents: also a filesystem URL "
                                        "(s3://bucket/prefix, gs://..., any fsspec scheme), credentials from the standard places."),
    synth: Optional[int] = typer.Option(None, min=1, help="Generate this many synthetic inputs instead of reading --input."),
    regimes: Optional[str] = typer.Option(None, help="Regime schedule for --synth."),
    seed: int = typer.Option(0, help="Random seed for --synth."),
    cpus: Optional[float] = typer.Option(None, min=1, help="Logical CPUs of the local Ray node (default: this machine's); the pipeline is sized to fit them."),
    gpus: Optional[float] = typer.Option(None, min=0, help="Logical GPUs of the local Ray node (default: this machine's)."),
    address: Optional[str] = typer.Option(None, help="Address of an existing Ray cluster (default: start a local one)."),
    summary_json: Optional[Path] = typer.Option(None, help="Write the run summary as JSON here."),
    tick_s: float = typer.Option(2.0, min=0.1, help="Controller tick interval in seconds (adaptive policies)."),
    decision_log: Optional[Path] = typer.Option(None, help="Write the controller's decisions as JSON lines here."),
    quality: list[str] = typer.Option([], help="Set a quality knob (changes the output; no policy changes it), e.g. --quality ocr.dpi=200."),
    tune: list[str] = typer.Option([], help="Let policies vary a quality knob within a range, e.g. --tune ocr.dpi=100..300 "
                                            "(outputs then differ by configuration; each row records its values)."),
    restart: bool = typer.Option(False, "--restart", help="Discard what an earlier run committed in --out and start over "
                                                          "(default: resume, skipping committed shards)."),
    memory: Optional[str] = typer.Option(None, help="Trident's memory of earlier runs of this pipeline, read at the start and "
                                         "written at regime ends and at the end: a path or a pyarrow filesystem URI (s3://...); "
                                         "default trident-memory/PIPELINE.json beside --out; 'off' for none."),
    table: Optional[str] = typer.Option(None, help="documents: curate only the --input files that are new or changed since the last run "
                                        "into this table location (directory or URL: Delta Lake tables curated/ and dead_letter/, one "
                                        "commit per run); --out is then the run's staging area."),
    retry_dead_letters: bool = typer.Option(False, "--retry-dead-letters", help="With --table: also retry the files dead-lettered by "
                                            "earlier runs whose bytes did not change (default: a dead letter is retried only when its bytes change)."),
    deadline: Optional[str] = typer.Option(None, help="Finish by then at least cost, asking the --address cluster's autoscaler for the "
                                           "--catalogue nodes that needs and giving them back: seconds from now (5400, 90m, 1.5h) or an "
                                           "ISO 8601 time (2026-12-05T06:00). Needs --policy trident."),
    budget: Optional[float] = typer.Option(None, help="Instead of --deadline: the most the run's nodes may cost (catalogue currency); "
                                           "trident holds the nodes of least cost per item within it."),
    catalogue: Optional[Path] = typer.Option(None, help="With --deadline/--budget: the worker node types the autoscaler may start (TOML or "
                                             "JSON, as `plan --catalogue`; each named as its Ray node type; a class 'head' prices the head)."),
) -> None:
    """Run a pipeline with a scheduling policy and print a summary. Re-running into the same --out resumes."""
    from trident_flows.control.launch import run_command
    from trident_flows.pipelines.quality import check_settings, parse_settings
    from trident_flows.runtime.resume import RunInterrupted

    with user_errors():
        ray_data = ":" in pipeline  # MODULE:FUNCTION returning a Ray Data Dataset
        if not ray_data:
            _check_choice("pipeline", pipeline, sorted(PIPELINES))
        if input is not None and "://" not in input.removeprefix("file://") and not Path(input.removeprefix("file://")).is_dir():
            raise RuntimeConfigError(f"--input {input}: no such directory; give a directory of input files, or --synth N to generate N "
                                     "(documents also read a URL such as s3://bucket/prefix)")
        try:  # refuse bad quality settings before a Ray node starts
            settings = {"quality": parse_settings(quality, "--quality"), "tune": parse_settings(tune, "--tune")}
            if ray_data and (quality or tune):
                raise ValueError(f"--quality/--tune set the knobs of this project's pipelines; {pipeline} is a Ray Data pipeline: "
                                 "set its UDFs' parameters in its own code")
            if not ray_data:
                check_settings(pipeline, settings["quality"], settings["tune"])
        except ValueError as exc:
            raise RuntimeConfigError(str(exc)) from None
        dataset_support = None
        if ray_data:  # the Ray Data integration (above control, which is handed it) reads and publishes the Dataset
            from trident_flows import ray_data as dataset_support
        try:
            run_command(pipeline=pipeline, out=out, policy=policy, input=_input_arg(input), synth=synth, regimes=regimes, seed=seed,
                        cpus=cpus, gpus=gpus, address=address, summary_json=summary_json, tick_s=tick_s, decision_log=decision_log,
                        console=console, quality=settings["quality"], tune=settings["tune"], restart=restart, memory=memory, table=table,
                        retry_dead_letters=retry_dead_letters, dataset_support=dataset_support, deadline=deadline, budget=budget,
                        catalogue=catalogue)
        except RunInterrupted as exc:
            console.print(str(exc), soft_wrap=True)
            raise typer.Exit(130) from None


def _input_arg(input: str | None) -> Path | str | None:
    """``--input`` as a local ``Path``, or the URL as given."""
    if input is None or "://" in input.removeprefix("file://"):
        return input
    return Path(input.removeprefix("file://"))


@app.command("simulate")
def simulate(
    pipeline: str = typer.Argument(..., help="Emulated pipeline: emulated-docs or emulated-video."),
    cluster: str = typer.Option("1x(cpus=16,gpus=2,gpu_mem=8GiB)", help="Nodes, e.g. '8x(cpus=96,gpus=8,gpu_mem=80GiB)'; "
                                "mixed classes joined by '+'."),
    regimes: Optional[str] = typer.Option(None, help="Regime schedule, repeated to the end: counts ('short:600,long:60') or "
                                          "durations ('short:20m,long:5m,scans:30m')."),
    trace: Optional[Path] = typer.Option(None, help="Per-item feature trace (CSV or Parquet) instead of a regime schedule."),
    policy: str = typer.Option("static", help=f"Scheduling policy: {', '.join(available_policies())}."),
    duration: str = typer.Option("1h", help="Simulated time, e.g. 90s, 30m, 4h."),
    tick_s: float = typer.Option(2.0, min=0.1, help="Controller tick interval in simulated seconds."),
    node_loss: Optional[str] = typer.Option(None, help="Nodes lost during the run, 'SECONDS:NODE,...' (e.g. '3600:0')."),
    seed: int = typer.Option(0, help="Random seed of the stream."),
    summary_json: Optional[Path] = typer.Option(None, help="Write the summary (the keys of run --summary-json) here."),
    plot_png: Optional[Path] = typer.Option(Path("simulation.png"), "--plot", help="Plot of throughput, replicas and resources."),
    decision_log: Optional[Path] = typer.Option(None, help="Write the controller's decisions as JSON lines here."),
) -> None:
    """Simulate a pipeline under a policy on a cluster of any size (discrete-event; figures are SIMULATED)."""
    from trident_flows.scheduler.policies import make_policy
    from trident_flows.sim import driver, setup
    from trident_flows.sim.cluster import parse_cluster

    with user_errors():
        try:
            cluster_spec = parse_cluster(cluster)
            seconds = setup.parse_duration(duration)
            losses = [(setup.parse_duration(t), int(n)) for t, _, n in (p.partition(":") for p in (node_loss or "").split(",") if p)]
            spec, stream, config = setup.build(pipeline, cluster_spec, regimes=regimes, seed=seed, trace=trace)
            policy_obj = None if policy == "static" else make_policy(policy, spec=spec, cluster=cluster_spec)
        except ValueError as exc:
            raise RuntimeConfigError(str(exc)) from None
    console.print(f"simulating {pipeline} on {cluster} ({cluster_spec.total_cpus:g} CPUs, {cluster_spec.total_gpus} GPUs), "
                  f"policy {policy}, {seconds:g} simulated s; starting from {config.label()}")
    run = driver.simulate(spec, cluster_spec, policy_obj, duration_s=seconds, tick_s=tick_s, stream=stream, node_loss=losses,
                          record_s=max(tick_s, seconds / 2000), decision_log=decision_log)
    s = run.summary
    table = Table(title=f"SIMULATED {pipeline} ({policy}) on {cluster}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key in ("items_in", "items_written", "items_dead_lettered", "items_in_flight", "items_missing", "wall_s",
                "throughput_items_per_s", "steady_items_per_s", "ooms", "reconfigurations", "rolling_update_dip", "decisions",
                "tick_ms_p95", "sim_wall_s", "events"):
        value = s[key]
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    console.print(table)
    if summary_json:
        summary_json.parent.mkdir(parents=True, exist_ok=True)
        summary_json.write_text(json.dumps(s, indent=2, default=str) + "\n")
        console.print(f"summary: {summary_json}")
    if plot_png:
        console.print(f"plot: {driver.plot(run, plot_png)}")


@app.command("profile")
def profile(
    name: str = typer.Argument(..., help="documents, documents-rapidocr (the ocr operator with RapidOCR) or video."),
    quick: bool = typer.Option(False, help="Fewer repeats and smaller inputs."),
    out: Optional[Path] = typer.Option(None, help="Where to write the profile JSON (default: the packaged profiles folder)."),
) -> None:
    """Measure the real operators and write the cost-model JSON used by the emulated pipeline."""
    modules = {"documents": "trident_flows.pipelines.profile_documents", "video": "trident_flows.pipelines.profile_video",
               "documents-rapidocr": "trident_flows.pipelines.profile_rapidocr"}
    with user_errors():
        _check_choice("profile", name, sorted(modules))
    path = importlib.import_module(modules[name]).main(quick=quick, out=out, console=console)
    console.print(f"wrote {path}")


REPORT = "report"  # ``bench report``: the report document, not a benchmark
NO_BENCHMARKS = ("the benchmarks run from a checkout of the repository (its benchmarks/ folder, which the installed package "
                 "leaves out): clone the repository, install it there with `pip install -e '.[bench]'` and run "
                 "`trident-flows bench` in it")


def _benchmarks_checkout() -> Path | None:
    """The checkout whose ``benchmarks/`` sits beside the ``trident_flows`` running here, or ``None`` (an installed wheel)."""
    import trident_flows

    root = Path(trident_flows.__file__).resolve().parents[1]
    return root if (root / "benchmarks" / "__init__.py").is_file() else None


def load_benchmarks() -> Any:
    """The repository's ``benchmarks`` package, imported on first use (see the module docstring)."""
    root = _benchmarks_checkout()
    if root is not None and str(root) not in sys.path:
        sys.path.insert(0, str(root))
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    try:
        import benchmarks
    except ModuleNotFoundError as exc:
        if exc.name != "benchmarks":
            raise
        raise RuntimeConfigError(NO_BENCHMARKS) from None
    if not isinstance(getattr(benchmarks, "BENCHMARKS", None), dict):
        raise RuntimeConfigError(f"{benchmarks.__file__} is another package named benchmarks; {NO_BENCHMARKS}")
    return benchmarks


def _benchmark_names() -> list[str]:
    """The names of ``benchmarks.BENCHMARKS`` (a literal dict), read from its source without importing the package;
    empty where there are no benchmarks."""
    root = _benchmarks_checkout()
    if root is not None:
        init = root / "benchmarks" / "__init__.py"
    else:
        spec = importlib.util.find_spec("benchmarks")
        if spec is None or not spec.origin:
            return []
        init = Path(spec.origin)
    try:
        tree = ast.parse(init.read_text())
    except (OSError, SyntaxError):
        return []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "BENCHMARKS" for t in targets) and node.value is not None:
            try:
                return list(ast.literal_eval(node.value))
            except ValueError:
                return []
    return []


_BENCHMARK_NAMES = _benchmark_names()


@app.command("bench")
def bench(
    name: str = typer.Argument(..., help=(f"Benchmark name: {', '.join(_BENCHMARK_NAMES)}" if _BENCHMARK_NAMES else
                                          "Benchmark name (benchmarks run from a checkout of the repository)")
                               + f"; or {REPORT!r}: write docs/benchmarks.md from every NAME.json in --out (subfolders too) "
                               "and the results block of README.md."),
    quick: bool = typer.Option(False, help="Same code on smaller sizes (about a minute on 2 cores)."),
    out: Path = typer.Option(Path("bench-results"), help="Directory for NAME.json and NAME.png (report: the results to read)."),
    systems: Optional[str] = typer.Option(None, help="closed-loop, closed-loop-video, closed-loop-suite, closed-loop-sim: run only these systems, comma-separated "
                                          "(e.g. 'static-avg,trident'; closed-loop-sim: static-default, trident); the others' figures are then n/a."),
    repeats: Optional[int] = typer.Option(None, min=1, help="closed-loop, closed-loop-video, closed-loop-suite: interleaved repeats "
                                          "(default 2; 1 with --quick)."),
    workloads: Optional[str] = typer.Option(None, help="closed-loop-suite: run only these workloads, comma-separated "
                                            "(e.g. 'cpu-only,docs-baseline'); closed-loop-sim: pipeline-nodes pairs (e.g. 'documents10-8,video-64')."),
    hours: Optional[float] = typer.Option(None, min=0.001, help="closed-loop-sim: simulated hours of every stream (default by nodes: 2 on 1 and 8, 1 on 64 and 256)."),
    jobs: Optional[int] = typer.Option(None, min=1, help="closed-loop-sim, closed-loop-suite --sim: worker processes (default 1)."),
    sim: bool = typer.Option(False, help="closed-loop-suite: the suite's simulated section (every workload x every system that "
                             "can be simulated), kept beside the live section of OUT/NAME.json."),
    live: bool = typer.Option(False, help="warm-start: after the simulated part, the live part on Ray (S*, trident cold, an "
                              "earlier run and trident warm on the suite's cpu-only stream, 2 repeats: about 2 hours; "
                              "with --quick a few minutes on its quick stream, a smoke test). corpus-trident: its live "
                              "section instead of the simulated one (S* and trident once each per corpus workload on one "
                              "node, beside the simulator on the same streams: about 35 minutes; with --quick about 3), "
                              "kept beside the simulated section of OUT/NAME.json."),
    subset: Optional[str] = typer.Option(None, help="closed-loop-suite: a named live run of part of the suite instead of --workloads/"
                                         "--systems/--repeats: 'confirm' (cpu-only static-hindsight once and trident twice, "
                                         "docs-baseline static-hindsight and trident once, about 45 minutes), 'ray-data' (Ray Data "
                                         "autoscaling once on cpu-only, about 16 minutes). Runs of other systems in OUT/NAME.json's "
                                         "live section on the same streams and suite code are kept."),
    resume: bool = typer.Option(False, help="closed-loop-sim: take the runs a stopped run of the same code and streams finished "
                                "(kept in OUT/.NAME.runs.jsonl, .NAME-quick.runs.jsonl with --quick) instead of running them again."),
    doc: Optional[Path] = typer.Option(None, help=f"{REPORT}: the report document to write or check (default docs/benchmarks.md)."),
    readme: Optional[Path] = typer.Option(None, help=f"{REPORT}: the README whose results block (between <!-- results:start --> "
                                          "and <!-- results:end -->) to rewrite or check (default README.md)."),
    check: bool = typer.Option(False, help=f"{REPORT}: write nothing; exit 1 with the reason and a diff when --doc or the "
                               "README's results block differs from what the results give."),
) -> None:
    """Run a benchmark, print its headline figures and write NAME.json + NAME.png; or ``bench report [--check]``."""
    with user_errors():
        registry = load_benchmarks().BENCHMARKS
    from benchmarks.provenance import ProvenanceRecorder, describe
    from benchmarks.report import figures, write_report

    if name == REPORT:
        with user_errors():
            given = [f"--{option}" for option, value in (("quick", quick), ("systems", systems), ("repeats", repeats),
                                                         ("workloads", workloads), ("hours", hours), ("jobs", jobs),
                                                         ("resume", resume), ("sim", sim), ("live", live), ("subset", subset))
                     if value not in (None, False)]
            if given:
                raise RuntimeConfigError(f"bench {REPORT} takes only --out, --doc, --readme and --check; drop {', '.join(given)}")
            _bench_report(out, doc if doc is not None else Path("docs/benchmarks.md"), readme if readme is not None else Path("README.md"),
                          check)
        return
    with user_errors():
        _check_choice("benchmark", name, list(registry))
        for option, value in (("doc", doc), ("readme", readme), ("check", check)):
            if value not in (None, False):
                raise RuntimeConfigError(f"--{option} belongs to bench {REPORT}; drop it to run benchmark {name!r}")
        module = importlib.import_module(registry[name])
        options = _bench_options(name, module, systems, repeats, workloads, hours, jobs)
        if "journal" in inspect.signature(module.run).parameters:
            options["journal"] = out / f".{name}{'-quick' if quick else ''}.runs.jsonl"
            options["resume"] = resume
        elif resume:
            _bench_takes(name, module, "resume")
        if sim:
            _bench_takes(name, module, "sim")
            options["sim"] = True
        if live:
            _bench_takes(name, module, "live")
            options["live"] = True
        if subset is not None:
            _bench_takes(name, module, "subset")
            _check_choice("subset", subset, list(getattr(module, "SUBSETS", {})))
            given = [f"--{o}" for o, v in (("quick", quick), ("sim", sim), ("systems", systems), ("repeats", repeats),
                                            ("workloads", workloads)) if v not in (None, False)]
            if given:
                raise RuntimeConfigError(f"--subset fixes the workloads, systems and repeats of a live run; drop {', '.join(given)}")
            options["subset"] = subset
        if "previous" in inspect.signature(module.run).parameters:
            options["previous"] = out / f"{name}.json"  # the sections of the report this run does not write are kept
        try:
            recorder = ProvenanceRecorder.start()
        except ValueError as exc:
            raise RuntimeConfigError(str(exc)) from None
    try:
        result = module.run(quick=quick, **options)
    finally:
        provenance = recorder.finish()
    json_path, png_path = write_report(result, out, quick=quick, provenance=provenance)
    table = Table(title=f"bench {name}{' (quick)' if quick else ''}")
    for column in ("figure", "measured", "target", "met"):
        table.add_column(column)
    for key, value in figures(result.summary):
        target = result.targets.get(key)
        shown = json.dumps(value) if not isinstance(value, float) else f"{value:.4g}"
        table.add_row(key, shown, f"{target.op} {target.value}" if target else "", ("yes" if target.met(value) else "NO") if target else "")
    console.print(table)
    console.print(f"provenance: {describe(provenance.to_dict())}", highlight=False, soft_wrap=True)
    console.print(f"report: {json_path}" + (f", plot: {png_path}" if png_path else ""))


def _bench_report(results: Path, doc: Path, readme: Path, check: bool) -> None:
    """``bench report``: write ``doc`` and ``readme``'s results block from the results, or with ``check`` compare them
    (exit 1 where they differ)."""
    from benchmarks import report_doc

    if not check:
        doc_path, readme_path = report_doc.write(results, doc, readme=readme)
        console.print(f"wrote {doc_path} and the results block of {readme_path}", highlight=False, soft_wrap=True)
        return
    outcome = report_doc.check(results, doc, readme=readme)
    if outcome.ok:
        console.print(outcome.reason, highlight=False, soft_wrap=True)
        return
    errors.print(f"[red]error:[/red] {escape(outcome.reason)}", highlight=False, soft_wrap=True)
    shown = outcome.diff[:DIFF_LINES]
    for line in shown:
        errors.print(escape(line), highlight=False, soft_wrap=True)
    if len(outcome.diff) > len(shown):
        errors.print(f"... {len(outcome.diff) - len(shown)} more diff lines", highlight=False)
    raise typer.Exit(1)


DIFF_LINES = 40  # the diff ``bench report --check`` prints at most


def _bench_options(name: str, module: Any, systems: str | None, repeats: int | None, workloads: str | None = None,
                   hours: float | None = None, jobs: int | None = None) -> dict[str, Any]:
    """``--systems`` / ``--repeats`` / ``--workloads`` / ``--hours`` / ``--jobs`` as keyword arguments of the benchmark's
    ``run``, refused where it has none."""
    options: dict[str, Any] = {}
    for option, value in (("hours", hours), ("jobs", jobs)):
        if value is not None:
            _bench_takes(name, module, option)
            options[option] = value
    if workloads is not None:
        options["workloads"] = _bench_choices(name, module, "workloads", "WORKLOADS", "workload", workloads)
    if systems is not None:
        chosen = _bench_choices(name, module, "systems", "SYSTEMS", "system", systems)
        options["systems"] = chosen
        if "spike_systems" in inspect.signature(module.run).parameters:
            options["spike_systems"] = tuple(s for s in getattr(module, "SPIKE_SYSTEMS", ()) if s in chosen)
    if repeats is not None:
        _bench_takes(name, module, "repeats")
        options["repeats"] = repeats
    return options


def _bench_takes(name: str, module: Any, option: str, registered: bool = True) -> None:
    """Refuse ``--OPTION`` for a benchmark whose ``run`` has no such keyword (or no registry of its choices)."""
    if not registered or option not in inspect.signature(module.run).parameters:
        raise RuntimeConfigError(f"benchmark {name!r} has no --{option} option; drop it")


def _bench_choices(name: str, module: Any, option: str, registry: str, kind: str, given: str) -> tuple[str, ...]:
    """``--OPTION a,b`` checked against the benchmark's ``REGISTRY`` list; refused where its ``run`` has no such option."""
    known = getattr(module, registry, None)
    _bench_takes(name, module, option, known is not None)
    chosen = tuple(c.strip() for c in given.split(",") if c.strip())
    for c in chosen:
        _check_choice(kind, c, list(known))
    return chosen


# ---------------------------------------------------------------- plan (capacity planning: trident_flows/planning)

@app.command("plan")
def plan(
    regimes: Optional[str] = typer.Option(None, help="The corpus as a regime mix, e.g. 'short:500,scans:500' (the profile's regimes)."),
    sample: Optional[Path] = typer.Option(None, help="A directory holding a sample of the corpus (PDFs or videos), measured by the "
                                          "pipeline's parse/probe step; instead of --regimes."),
    pipeline: str = typer.Option("documents", help="documents or video (with --regimes; --sample finds it from the files)."),
    items: int = typer.Option(..., help="Input items the job must process."),
    deadline_h: Optional[float] = typer.Option(None, help="Goal: the least cost that finishes within this many hours."),
    budget: Optional[float] = typer.Option(None, help="Goal: the most items per unit cost, at most this much in all."),
    catalogue: Optional[Path] = typer.Option(None, help="Node catalogue (TOML or JSON; format in trident_flows/planning/"
                                             "default_catalogue.toml). Default: generic shapes with PLACEHOLDER prices."),
    only: list[str] = typer.Option([], help="Use only these node classes of the catalogue (repeatable)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the recommendation as JSON here."),
    plot_png: Optional[Path] = typer.Option(Path("plan-pareto.png"), "--plot", help="Pareto plot of cost against duration."),
    simulate_top: int = typer.Option(3, min=0, help="Check this many of the top options in the simulator."),
) -> None:
    """Which cluster to rent: node counts per class for a corpus and a goal, checked in the simulator."""
    from trident_flows.planning.catalogue import PlanningError, load_catalogue
    from trident_flows.planning.planner import Goal, plan_cluster
    from trident_flows.planning.report import pareto_png, plan_json, plan_lines, plan_table
    from trident_flows.planning.workload import from_regimes, from_sample

    with user_errors():
        try:
            if (regimes is None) == (sample is None):
                raise PlanningError("describe the corpus with one of --regimes (e.g. short:500,scans:500) or --sample DIR")
            goal = Goal(items, deadline_h=deadline_h, budget=budget)
            nodes = load_catalogue(catalogue)
            nodes = nodes.only(only) if only else nodes
            workload = from_regimes(pipeline, regimes) if regimes is not None else from_sample(sample)  # type: ignore[arg-type]
            result = plan_cluster(workload, nodes, goal, simulate_top=simulate_top)
        except PlanningError as exc:
            raise RuntimeConfigError(str(exc)) from None
    console.print(plan_table(result))
    for line in plan_lines(result):
        console.print(escape(line), soft_wrap=True, highlight=False)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(plan_json(result), indent=2, default=str) + "\n")
        console.print(f"json: {json_path}")
    if plot_png:
        console.print(f"plot: {pareto_png(result, plot_png)}")


if __name__ == "__main__":
    app()
