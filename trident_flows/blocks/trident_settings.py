"""``TridentSettingsBlock``: how the Trident sidecar schedules a running pipeline.

Contract: names the scheduling policy (one registered in ``trident_flows.scheduler.policies``),
the sidecar's own settings (tick interval, ``min_new_samples``: the new batch samples a tick needs
before it asks the policy, the CPU/GPU budgets that cap the cluster the policy plans for) and the
Trident policy's options a sidecar user sets (``TRIDENT_FIELDS``: ``memory_safety_margin``,
``max_changes``, ``memory``), under the option names and with the docs of
``scheduler.trident_settings.TridentSettings``, their defaults those of its sidecar preset
(``TridentSettings.sidecar()``). ``trident_options()`` gives those as the policy's options; with
``policy="trident"`` they are checked by ``TridentSettings`` at construction. A run's goal (``deadline`` or ``budget``, with ``node_catalogue``: the worker node
types the autoscaler may start) makes the sidecar of a curation run ask Ray's autoscaler for nodes
(``control.elastic``); ``elastic(now)`` gives its ``(NodePool, RunGoal)`` (a relative deadline
counts from ``now``), None without a goal. Invalid values and unknown fields are refused at
construction with a message naming the field and what to change.
"""

from __future__ import annotations

import difflib
import time
from pathlib import Path
from typing import Any, Optional

from prefect.blocks.core import Block
from pydantic import Field, field_validator, model_validator

from trident_flows.blocks.catalogue import DOCUMENTATION_URL, LOGO_URL
from trident_flows.planning.catalogue import PlanningError, load_catalogue
from trident_flows.planning.scale import NodePool, RunGoal, parse_deadline
from trident_flows.scheduler.policies import DEFAULT_POLICY
from trident_flows.scheduler.settings import documented
from trident_flows.scheduler.trident_settings import TridentSettings

# The block's fields that are Trident policy options (same names): what the sidecar passes to the policy.
TRIDENT_FIELDS = ("memory_safety_margin", "max_changes", "memory")
_DOC = documented(TridentSettings)
_SIDECAR = TridentSettings.sidecar()


class TridentSettingsBlock(Block):
    """Scheduling settings of the Trident sidecar: policy, tick interval, OOM safety margin, budgets."""

    _block_type_name = "Trident Settings"
    _block_type_slug = "trident-settings"
    _description = "Policy, tick interval, memory safety margin and resource budgets of the Trident sidecar."
    _documentation_url = DOCUMENTATION_URL
    _logo_url = LOGO_URL

    policy: str = Field(default=DEFAULT_POLICY, description="Scheduling policy: trident (the adaptive controller, the default) or a "
                                                          "baseline: static (no change: a curation run gets no sidecar), ds2, threshold.")
    tick_interval_s: float = Field(default=5.0, gt=0, le=3600, description="Seconds between two ticks of a long-running sidecar.")
    min_new_samples: int = Field(default=8, ge=1, description="New batch samples a sidecar tick needs before it asks the policy "
                                                             "(not Trident's min_samples: the samples each operator needs before a placement).")
    cpu_budget: Optional[float] = Field(default=None, gt=0, description="Most logical CPUs the pipeline may hold (empty: the whole cluster).")
    gpu_budget: Optional[float] = Field(default=None, ge=0, description="Most GPUs the pipeline may hold (empty: the whole cluster).")
    # Trident's own options, their defaults the sidecar preset's (TridentSettings.sidecar()).
    memory_safety_margin: float = Field(default=_SIDECAR.safety.margin, ge=0.0, lt=0.9,
                                        description=f"Trident: {_DOC['memory_safety_margin']} (0.15 = plan for at most 85%).")
    max_changes: int = Field(default=_SIDECAR.transition.max_changes, ge=0, description=f"Trident: {_DOC['max_changes']}.")
    memory: Optional[str] = Field(default=_SIDECAR.memory.location, description=f"Trident: {_DOC['memory']}.")
    # The run's goal: nodes asked of Ray's autoscaler (control.elastic), the curation run's sidecar only.
    deadline: Optional[str] = Field(default=None, description="Finish by then at least cost, asking Ray's autoscaler for the nodes that "
                                                              "needs: seconds from the run's start (5400, 90m, 1.5h) or an ISO 8601 time.")
    budget: Optional[float] = Field(default=None, gt=0, description="Instead of a deadline: the most the run's nodes may cost "
                                                                    "(node_catalogue currency), at least cost per item.")
    node_catalogue: Optional[str] = Field(default=None, description="With deadline/budget: a catalogue file (TOML/JSON, as `trident-flows "
                                                                    "plan --catalogue`) of the worker node types the autoscaler may start, "
                                                                    "each named as its Ray node type; a class 'head' prices the head.")

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_fields(cls, values: Any) -> Any:
        # Prefect blocks accept any extra field, so a misspelt one would be ignored silently.
        if isinstance(values, dict):
            known = sorted(cls.model_fields)
            for name in values:
                if name not in cls.model_fields and name != "block_type_slug":
                    close = difflib.get_close_matches(name, known, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise ValueError(f"unknown field {name!r}{hint}; known fields: {', '.join(known)}")
        return values

    @field_validator("policy")
    @classmethod
    def _check_policy(cls, value: str) -> str:
        from trident_flows.scheduler.policies import POLICIES, available_policies

        name = value.strip().lower()
        if name not in POLICIES:
            raise ValueError(f"policy={value!r} is not available: choose one of {', '.join(available_policies())}")
        return name

    @model_validator(mode="after")
    def _check_trident_settings(self) -> "TridentSettingsBlock":
        if self.policy == "trident":
            TridentSettings.from_options(**self.trident_options())  # its ValueError names the field, the value and the fix
        if self.deadline is None and self.budget is None:
            if self.node_catalogue is not None:
                raise ValueError("node_catalogue names the nodes trident may request for a goal: set deadline or budget, or clear it")
        elif self.policy != "trident":
            raise ValueError(f"deadline/budget need policy='trident' (it places work on the nodes as they join), not {self.policy!r}")
        elif self.node_catalogue is None:
            raise ValueError("deadline/budget need node_catalogue: a catalogue file of the worker node types the autoscaler may start")
        else:
            self.elastic(time.time())  # a bad deadline, goal or catalogue is refused now, naming the fix
        return self

    def elastic(self, now: float) -> tuple[NodePool, RunGoal] | None:
        """The node pool and goal of a run starting at ``now`` (None without a goal); ``ValueError`` naming the fix."""
        if self.deadline is None and self.budget is None:
            return None
        try:
            goal = RunGoal(deadline_at=parse_deadline(self.deadline, now) if self.deadline is not None else None, budget=self.budget)
            return NodePool.from_catalogue(load_catalogue(Path(self.node_catalogue or ""))), goal
        except PlanningError as exc:
            raise ValueError(str(exc).replace("--deadline", "deadline").replace("--budget", "budget").replace("--catalogue", "node_catalogue")) from None

    def trident_options(self) -> dict[str, Any]:
        """The Trident policy's options this block sets, by their option names (``TridentSettings.from_options``)."""
        return {name: getattr(self, name) for name in TRIDENT_FIELDS}
