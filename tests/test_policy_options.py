"""Policy options: each policy's options are one frozen, validated settings value; a misspelt or foreign
option is refused naming the known ones, a bad value naming the field and the fix; every caller's options are taken."""

from __future__ import annotations

import dataclasses
import math
import re
import typing

import pytest

from trident_flows.core.types import ClusterSpec
from trident_flows.scheduler.policies import POLICIES, StaticPolicy, make_policy, policy_factory
from trident_flows.scheduler.settings import documented
from trident_flows.scheduler.trident_settings import OPTIONS, CanarySettings, GateSettings, TransitionSettings, TridentSettings

CLUSTER = ClusterSpec.single_node(8, 0)


@pytest.mark.parametrize("name, typo, closest", [
    ("trident", "min_sample", "min_samples"),
    ("trident", "memory_safety_marign", "memory_safety_margin"),
    ("ds2", "min_batch", "min_batches"),
    ("threshold", "upp", "up"),
])
def test_a_misspelt_option_is_refused_with_the_closest_and_the_known_ones(name, typo, closest):
    with pytest.raises(ValueError) as err:
        make_policy(name, spec=None, cluster=CLUSTER, **{typo: 1})
    message = str(err.value)
    assert message.startswith(f"{name}: unknown option {typo!r} (did you mean {closest!r}?); known options: ")
    known = message.split("known options: ")[1].split(", ")
    assert closest in known and known == sorted(known)
    assert "spec" not in known and "cluster" not in known  # supplied by the caller, not a user's option


def test_the_known_options_are_the_policies_keyword_parameters():
    message = ""
    try:
        make_policy("ds2", nonsense=True)
    except ValueError as exc:
        message = str(exc)
    assert message == ("ds2: unknown option 'nonsense'; known options: activation_intervals, min_batches, policy_interval_s, source_rate, "
                       "target_rate_ratio, warm_up_intervals")
    with pytest.raises(ValueError, match=re.escape("static: unknown option 'window'; known options: none")):
        make_policy("static", spec=None, cluster=CLUSTER, window=3)
    with pytest.raises(ValueError, match=re.escape("threshold: unknown options 'a', 'b'; known options: down, up")):
        make_policy("threshold", a=1, b=2)


def test_legitimate_options_reach_the_policy_and_keep_their_own_checks():
    trident = make_policy("trident", spec=None, cluster=CLUSTER, min_samples=8, verify_ticks=2, canaries=False)
    assert (trident.settings.gate.min_samples, trident.settings.verify.ticks, trident.settings.canary.enabled) == (8, 2, False)
    assert make_policy("ds2", spec=None, cluster=CLUSTER, source_rate=5.0, min_batches=2).source_rate == 5.0
    assert make_policy("threshold", up=2.0, down=0.25).up == 2.0
    assert isinstance(make_policy("static", spec=None, cluster=CLUSTER), StaticPolicy)
    with pytest.raises(ValueError, match=re.escape("trident: safety.margin=1.5 is refused: give a fraction in [0, 1)")):
        make_policy("trident", memory_safety_margin=1.5)
    with pytest.raises(ValueError, match="unknown policy 'nope'; available policies: ds2, static, threshold, trident"):
        make_policy("nope")


class AcceptsAny:
    """A policy whose factory takes ``**options`` (as the sidecar tests' policies do)."""

    name = "accepts-any"

    def __init__(self, **options):
        self.options = options


def test_a_factory_that_takes_any_option_is_given_them(monkeypatch):
    monkeypatch.setitem(POLICIES, "accepts-any", f"{__name__}:AcceptsAny")
    assert make_policy("accepts-any", spec=None, whatever=1).options == {"spec": None, "whatever": 1}


def test_the_sidecar_gives_every_policy_only_options_it_takes():
    from trident_flows.blocks import TridentSettingsBlock
    from trident_flows.flows.trident_sidecar import policy_options
    from trident_flows.tasks.sidecar import BUDGETS

    for name in sorted(POLICIES):
        settings = TridentSettingsBlock(policy=name, cpu_budget=4, gpu_budget=0, memory_safety_margin=0.2, max_changes=2)
        options = policy_options(settings)
        assert options["cpu_budget"] == 4 and options["gpu_budget"] == 0
        policy = make_policy(name, spec=None, cluster=CLUSTER, **{k: v for k, v in options.items() if k not in BUDGETS})
        if name == "trident":
            assert (policy.settings.safety.margin, policy.settings.transition.max_changes) == (0.2, 2)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_has_a_frozen_settings_type_whose_fields_are_typed_and_documented(name):
    settings_type = policy_factory(name).settings_type
    assert dataclasses.is_dataclass(settings_type) and settings_type.__dataclass_params__.frozen
    hints = typing.get_type_hints(settings_type)
    for f in dataclasses.fields(settings_type):
        assert f.name in hints and f.metadata.get("doc"), f"{name}: {f.name} has no type hint or doc"
    policy = make_policy(name, spec=None, cluster=CLUSTER)
    assert policy.settings == settings_type()  # built with every default


@pytest.mark.parametrize("options, message", [
    ({"min_samples": "8"}, "trident: gate.min_samples='8' is refused: give a whole number"),
    ({"min_samples": 8.5}, "trident: gate.min_samples=8.5 is refused: give a whole number"),
    ({"canaries": "no"}, "trident: canary.enabled='no' is refused: give True or False (option canaries)"),
    ({"min_gain": math.nan}, "trident: transition.min_gain=nan is refused: give a finite number"),
    ({"max_changes": "4"}, "trident: transition.max_changes='4' is refused: give a whole number or None"),
    ({"verify_ticks": 0}, "trident: verify.ticks=0 is refused: give a count of ticks >= 1 (option verify_ticks)"),
    ({"solver": "gurobi"}, "trident: placement.solver='gurobi' is refused: choose one of highs, cbc"),
    ({"stale_ratio": 0.5}, "trident: models.stale_ratio=0.5 is refused: give a ratio >= 1"),
    ({"memory": " "}, "trident: memory.location=' ' is refused: give a path or URI, or None for no memory across runs (option memory)"),
])
def test_a_bad_trident_setting_is_refused_naming_the_section_the_field_the_value_and_the_fix(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make_policy("trident", spec=None, cluster=CLUSTER, **options)


def test_trident_settings_are_frozen_sections_and_reach_the_policy():
    settings = TridentSettings.from_options(min_samples=8, max_changes=2, canaries=False)
    assert settings == TridentSettings(gate=GateSettings(min_samples=8), transition=TransitionSettings(max_changes=2),
                                       canary=CanarySettings(enabled=False))
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.gate.min_samples = 9  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.gate = GateSettings()  # type: ignore[misc]
    policy = make_policy("trident", spec=None, cluster=CLUSTER, min_samples=8, max_changes=2, canaries=False)
    assert policy.settings == settings
    with pytest.raises(TypeError, match="settings must be a TridentSettings"):
        policy_factory("trident")(None, CLUSTER, {"min_samples": 8})
    with pytest.raises(ValueError, match=re.escape("trident: gate={'min_samples': 8} is refused: give a GateSettings")):
        TridentSettings(gate={"min_samples": 8})  # type: ignore[arg-type]


def test_every_trident_option_names_one_field_of_one_section_typed_and_documented():
    sections = {f.name: f.metadata["section"] for f in dataclasses.fields(TridentSettings)}
    assert set(OPTIONS.values()) == {(name, f.name) for name, section in sections.items() for f in dataclasses.fields(section)}
    for name, section in sections.items():
        assert dataclasses.is_dataclass(section) and section.__dataclass_params__.frozen
        hints = typing.get_type_hints(section)
        for f in dataclasses.fields(section):
            assert f.name in hints and f.metadata.get("doc"), f"trident: {name}.{f.name} has no type hint or doc"
    assert documented(TridentSettings)["canary_timeout_s"] == "seconds a canary may go without a batch before it is abandoned"
    settings = TridentSettings.from_options(**{option: getattr(getattr(TridentSettings(), outer), inner)
                                               for option, (outer, inner) in OPTIONS.items()})
    assert settings == TridentSettings()  # every option reaches its own field


def test_the_sidecar_preset_differs_from_the_defaults_only_in_its_margin_and_change_cap():
    sidecar, defaults = TridentSettings.sidecar(), TridentSettings()
    assert (sidecar.safety.margin, sidecar.transition.max_changes) == (0.15, 4)
    assert dataclasses.replace(sidecar, safety=defaults.safety, transition=defaults.transition) == defaults
    assert sidecar.transition.min_gain == defaults.transition.min_gain


def test_the_prefect_block_carries_trident_settings_under_their_option_names():
    from pydantic import ValidationError

    from trident_flows.blocks import TridentSettingsBlock
    from trident_flows.blocks.trident_settings import TRIDENT_FIELDS

    assert set(TRIDENT_FIELDS) <= set(OPTIONS) and set(TRIDENT_FIELDS) <= set(TridentSettingsBlock.model_fields)
    block = TridentSettingsBlock(memory_safety_margin=0.3, max_changes=1)
    assert TridentSettings.from_options(**block.trident_options()) == TridentSettings.from_options(memory_safety_margin=0.3, max_changes=1)
    with pytest.raises(ValidationError, match=re.escape("unknown field 'max_change' (did you mean 'max_changes'?); known fields: ")):
        TridentSettingsBlock(max_change=1)
