"""The ``trident-sidecar`` flow: Trident ticks against a pipeline running on the same Ray cluster.

Contract:
- Finds the runner by ``runner_name``; a tick is one ``loop.TickLoop.tick()``. A decision with a plan
  is exactly one task run (``roll-out``) and one event (``trident.plan.applied`` / ``.partial`` /
  ``.refused``) on the tuned flow run; its outcome goes to the policy's ``observe_apply``.
- Runs as ``document-curation``'s subflow (``until_finished=True``, for the pipeline's life) or as a
  scheduled deployment (one tick per flow run; state in a detached Ray actor between runs).
- Keeps the live view (``trident-live-<runner>``) and decisions table (``trident-decisions-<runner>``)
  artifacts up to date on the tuned run (else its own).
- At the pipeline's end returns the policy's ``account_figures`` (``control.launch.end_policy``); with a
  goal and ``items_total`` each tick also takes an ``ElasticScaler`` step (``trident.scale.*`` events).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Optional

import ray
from prefect import flow, get_run_logger
from prefect.context import get_run_context

from trident_flows.blocks import RayClusterBlock, TridentSettingsBlock
from trident_flows.control.account import PolicyFigures
from trident_flows.control.elastic import ElasticScaler
from trident_flows.control.launch import end_policy
from trident_flows.control.loop import RecordKeeper
from trident_flows.core.decision import Decision, Hold, HoldKind
from trident_flows.loop.clock import WallClock
from trident_flows.loop.tick_loop import Recorder, TickLoop
from trident_flows.tasks.decision import Explanation, explain_hold, read_decision, read_outcome, unit_of
from trident_flows.tasks.live_view import render_markdown
from trident_flows.tasks.sidecar import make_policy_for, memory_key, observe, output_note_of, pipeline_spec_of, pull_samples, roll_out
from trident_flows.tasks.sidecar_report import PLAN_APPLIED, Publisher, decision_row, emit_decision, emit_scale, find_curation_run, related_of, scale_row
from trident_flows.tasks.sidecar_state import SidecarMemory, forget_memory, load_memory, save_memory

__all__ = ["PLAN_APPLIED", "policy_options", "trident_sidecar"]

# How often a long-running sidecar looks whether the pipeline finished while it waits for the
# next tick: it ends within this long of the pipeline (one cheap state call each).
END_POLL_S = 0.5


def policy_options(settings: TridentSettingsBlock) -> dict[str, Any]:
    """What the policy is built with besides its name: the CPU/GPU budgets (they cap the cluster it
    plans for) and, for the Trident policy, the block's ``TridentSettings`` options (memory safety
    margin, most operators one plan may change; the baselines take neither: they have no memory
    model and scale every operator)."""
    options: dict[str, Any] = {"cpu_budget": settings.cpu_budget, "gpu_budget": settings.gpu_budget}
    if settings.policy == "trident":
        options.update(settings.trident_options())
    return options


class _Tuner:
    """One sidecar flow run's ticks against one runner (state that lives for the flow run only)."""

    def __init__(self, runner_name: str, namespace: str, settings: TridentSettingsBlock, tuned_flow_run_id: Optional[str],
                 items_total: Optional[int] = None) -> None:
        self.runner_name = runner_name
        self.namespace = namespace
        self.settings = settings
        self.options = policy_options(settings)
        own_run = str(get_run_context().flow_run.id)  # where the artifacts go when no tuned run is known
        self.publisher = Publisher(runner_name, tuned_flow_run_id or own_run, live_every_s=max(settings.tick_interval_s, 5.0))
        self.related = related_of(tuned_flow_run_id) if tuned_flow_run_id else []
        self.clock = WallClock(settings.tick_interval_s)
        self.decisions = 0
        self.applied = 0
        self._last_status = ""
        self._output_note: Optional[str] = None  # read from the runner's pipeline at the first decision
        self.figures: Optional[PolicyFigures] = None  # taken at the pipeline's end for the run's account
        elastic = settings.elastic(time.time())
        self.scaler = ElasticScaler(*elastic, items_total=items_total) if elastic is not None and items_total is not None else None
        if elastic is not None and self.scaler is None:
            get_run_logger().warning("a deadline/budget needs the run's items: only a document-curation run's sidecar asks the "
                                     "autoscaler for nodes; this one does not")

    def _scale(self, state: Any, memory: SidecarMemory) -> SidecarMemory:
        """One scale step. A decision that changes the request is logged, emitted as an event (``trident.scale.add`` /
        ``.give_back``) and added to the decisions table with its reason and predicted effect; returns the memory with its row."""
        if self.scaler is None:
            return memory
        requested = dict(self.scaler.requested)
        try:
            decision = self.scaler.step(state)
        except Exception as exc:  # noqa: BLE001 - a failed scale step keeps the standing request; the run goes on
            get_run_logger().warning("scale step failed, the request to the autoscaler stands: %s: %s", type(exc).__name__, exc)
            return memory
        if decision is None or dict(decision.counts) == requested:
            return memory
        currency = self.scaler.pool.classes.currency
        get_run_logger().info("scale %s: %s (predicted %.3g items/s, last item in %.0f s, %.3g %s)", decision.action,
                              decision.reason, decision.predicted_items_per_s, decision.predicted_finish_s, decision.predicted_cost, currency)
        emit_scale(self.namespace, self.runner_name, state.pipeline, decision, currency, self.related)
        return self.with_decision_row(memory, scale_row(decision, self.scaler.rate_before, self.scaler.pool.startup_s, state.wall_s,
                                              unit_of(state.pipeline)), state.pipeline)

    def with_decision_row(self, memory: SidecarMemory, row: dict[str, Any], pipeline: str) -> SidecarMemory:
        """``memory`` with a decision's row added to the decisions table, and the table published on the tuned run."""
        memory = memory.decided(row)
        if self._output_note is None:
            self._output_note = output_note_of(self.runner_name, self.namespace)
        return replace(memory, decisions_artifact_id=self.publisher.decisions(
            memory.decisions_artifact_id, list(memory.view.decisions),
            f"Trident's decisions for {pipeline} ({self.settings.policy}), newest last"
            + (f". Note: {self._output_note}" if self._output_note else "")))

    def tick(self) -> dict[str, Any]:
        """Observe; one tick of the loop (decide once enough samples came; roll a decision out). Returns what happened.

        The tick's ``LoopState`` and the policy are kept in the sidecar's memory (a detached Ray actor) between ticks;
        the policy is asked once ``min_new_samples`` new samples came. When the runner is gone or finished the memory
        actor is removed."""
        logger = get_run_logger()
        found = observe(self.runner_name, self.namespace)
        if found is None:
            forget_memory(self.runner_name, self.namespace)
            return {"status": "no-pipeline"}
        rid, state = found
        key = memory_key(rid, self.settings.policy, self.options)
        memory = load_memory(self.runner_name, self.namespace)
        if memory is None or memory.key != key:
            memory = SidecarMemory(key)
        seen = _FlowTick(self, state, memory)
        loop = TickLoop(seen, memory.policy(), self.clock, apply=seen.roll_out, recorders=(RecordKeeper(memory.record), seen),
                        min_samples=self.settings.min_new_samples, loop_state=memory.loop,
                        make_policy=lambda st: make_policy_for(self.runner_name, self.namespace, self.settings.policy, self.options, st))
        tick = loop.tick()
        memory = self._scale(state, seen.memory)
        if tick.finished:
            self.figures = self._end(loop.policy, memory, state)
            self._publish(memory, state, "The pipeline finished" + (f": {state.error}" if state.error else ""), force=True)
            forget_memory(self.runner_name, self.namespace)
            return {"status": "finished", "items_written": state.items_written}
        if loop.policy is not None and (tick.decision is not None or tick.error):
            memory = memory.kept(loop.policy)  # as the tick left it: a refused plan is not retried as new
        result: dict[str, Any] = {"status": "unchanged"}
        if tick.error:
            status = explain_hold(Hold(HoldKind.STEP_FAILED))
        elif tick.decision is None:  # fewer new samples than min_new_samples; after the first decision, the last reason still holds
            status = self._last_status if memory.policy_blob and self._last_status else explain_hold(Hold(HoldKind.WAITING_FOR_SAMPLES))
        elif tick.applied is None:
            status = explain_hold(tick.decision.hold, tick.decision.reason)
            logger.debug("no change: %s", tick.decision.reason)
        else:
            outcome = read_outcome(tick.applied.report, tick.applied.error)
            self.decisions += 1
            self.applied += outcome.status == "applied"
            status = f"{seen.explained.sentence} ({outcome.text()})"
            result = {"status": outcome.status, "decision": seen.explained.sentence, "outcome": outcome.to_dict(),
                      "plan": tick.decision.plan.to_dict()}
        if status != self._last_status and result["status"] == "unchanged":  # a new reason to hold, not one per tick
            logger.info("%s", status)
        self._last_status = status
        memory = self._publish(memory, state, status, force=result["status"] != "unchanged")
        save_memory(self.runner_name, self.namespace, memory)
        return {**result, "samples": tick.samples, "throughput": state.throughput, "status_sentence": status}

    def _end(self, policy: Any, memory: SidecarMemory, state: Any) -> PolicyFigures:
        """The policy's end of the finished run (``control.launch.end_policy``: ``finish(state)``, then ``account_figures``;
        Trident writes what this run learned to its memory across runs) and what it can tell about the run (its runner is
        still up: the curation run stops it after this flow)."""
        spec = pipeline_spec_of(self.runner_name, self.namespace)
        samples = pull_samples(self.runner_name, self.namespace, 0).samples
        return end_policy(self.settings.policy, policy, memory.record, samples, spec, state)

    def _publish(self, memory: SidecarMemory, state: Any, status: str, force: bool) -> SidecarMemory:
        unit = unit_of(state.pipeline)
        markdown = render_markdown(memory.view, state, status, unit, f"{state.pipeline}: live view of the pipeline Trident tunes")
        artifact = self.publisher.live(memory.live_artifact_id, markdown, f"{state.pipeline}: {status}"[:500], force=force)
        return replace(memory, live_artifact_id=artifact)

    def wait(self, seconds: float) -> None:
        """Sleep until the next tick, returning early once the pipeline is gone or finished."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(END_POLL_S, left))
            found = observe(self.runner_name, self.namespace)
            if found is None or found[1].finished:
                return


class _FlowTick(Recorder):
    """The runner as one sidecar tick sees it, and what that tick records on the tuned run: the state observed for
    the tick, samples pulled through Ray, a plan rolled out as one ``roll-out`` task run named after its decision;
    each decision's row in the live view and the decisions table, and its event."""

    def __init__(self, tuner: _Tuner, state: Any, memory: SidecarMemory) -> None:
        self.tuner = tuner
        self.observed_state = state
        self.memory = memory
        self.page: Any = None
        self.explained: Optional[Explanation] = None  # the decision being rolled out, in words

    def state(self) -> Any:
        return self.observed_state

    def samples(self, since: int) -> Any:
        self.page = pull_samples(self.tuner.runner_name, self.tuner.namespace, since)
        return self.page

    def roll_out(self, decision: Decision) -> Any:
        self.explained = read_decision(self.observed_state, decision, self.page.samples)
        return roll_out.with_options(task_run_name=_task_run_name(self.explained.sentence))(
            self.tuner.runner_name, self.tuner.namespace, decision.plan, self.explained.sentence)

    def observed(self, state: Any) -> None:
        self.memory = self.memory.observed(state)

    def decided(self, state: Any, decision: Decision, applied: Any, line: dict[str, Any]) -> None:
        tuner, outcome = self.tuner, read_outcome(applied.report, applied.error)
        emit_decision(tuner.namespace, tuner.runner_name, state.pipeline, tuner.settings.policy, self.explained, outcome, decision.plan.to_dict(),
                      tuner.related)
        self.memory = tuner.with_decision_row(self.memory, decision_row(self.explained, outcome, state.wall_s, unit_of(state.pipeline)), state.pipeline)

    def failed(self, line: dict[str, Any]) -> None:
        get_run_logger().warning("the %s policy's tick failed, keeping the configuration: %s", self.tuner.settings.policy, line["error"])


def _task_run_name(sentence: str) -> str:
    return sentence if len(sentence) <= 120 else sentence[:117] + "..."


@flow(name="trident-sidecar", description="Trident tunes a running pipeline: observes it, decides, rolls changes out, "
                                          "and reports each decision on the tuned flow run.")
def trident_sidecar(cluster: Optional[RayClusterBlock] = None, trident: Optional[TridentSettingsBlock] = None,
                    runner_name: str = "trident-runner", until_finished: bool = False, max_ticks: Optional[int] = None,
                    tuned_flow_run_id: Optional[str] = None, items_total: Optional[int] = None) -> dict[str, Any]:
    """Tick once (scheduled mode) or until the pipeline finishes (``until_finished``, a tick every ``tick_interval_s``);
    ``items_total``: the run's items (a goal needs them)."""
    logger = get_run_logger()
    settings = trident or TridentSettingsBlock()
    connection = (cluster or RayClusterBlock()).connect()
    tuned = tuned_flow_run_id or find_curation_run(runner_name)
    tuner = _Tuner(runner_name, connection.namespace, settings, tuned, items_total)
    ticks = 0
    try:
        while True:
            result = tuner.tick()
            if result["status"] in ("no-pipeline", "finished"):
                logger.info("pipeline runner %r in namespace %r: %s", runner_name, connection.namespace,
                            "not running" if result["status"] == "no-pipeline" else "finished")
                break
            ticks += 1
            if not until_finished or (max_ticks is not None and ticks >= max_ticks):
                break
            tuner.wait(settings.tick_interval_s)
    finally:
        if tuner.scaler is not None:
            tuner.scaler.release()
        if connection.started_by_us:
            ray.shutdown()
    return {"status": result["status"], "ticks": ticks, "decisions": tuner.decisions, "plans_applied": tuner.applied,
            "tuned_flow_run_id": tuned, "last": result, "account_figures": tuner.figures,
            "elastic": tuner.scaler.summary() if tuner.scaler is not None else {}}
