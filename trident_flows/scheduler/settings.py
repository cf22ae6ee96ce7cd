"""Policy settings: how a policy's options become one frozen, validated settings value.

Contract:
- Every registered policy declares ``settings_type``: a frozen dataclass whose fields are all of
  the policy's options, each with a type hint, a default and a one-line ``doc`` of its unit and
  meaning (``setting(default, doc)``), and whose ``__post_init__`` refuses a bad value with
  ``refuse``: "POLICY: FIELD=VALUE is refused: WHAT TO CHANGE".
- ``settings_from_options(policy, settings_type, options)`` builds it: an option that is not a
  field is refused naming the closest field and all of them (``unknown_options``); a value whose
  type does not match the field's hint (a string for a number, a float for a count, a NaN) is
  refused naming the field, the value and the type wanted, before the field's own checks run.
- ``documented(settings_type)`` maps each field to its doc, for forms and help texts that show
  the settings (the Prefect block's field descriptions).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import types
import typing
from typing import Any, Iterable, Mapping, TypeVar

S = TypeVar("S")


def setting(default: Any, doc: str) -> Any:
    """A settings field with its default and its one-line doc (unit and meaning)."""
    return dataclasses.field(default=default, metadata={"doc": doc})


def setting_factory(factory: Any, doc: str) -> Any:
    """A settings field whose default is built by ``factory`` (a frozen value per settings object)."""
    return dataclasses.field(default_factory=factory, metadata={"doc": doc})


def refuse(policy: str, name: str, value: Any, fix: str) -> ValueError:
    """The error for a bad setting: names the policy, the field, the value and what to change."""
    return ValueError(f"{policy}: {name}={value!r} is refused: {fix}")


def documented(settings_type: type) -> dict[str, str]:
    """Each field of ``settings_type`` and its one-line doc, in declaration order."""
    return {f.name: f.metadata.get("doc", "") for f in dataclasses.fields(settings_type)}


def unknown_options(policy: str, unknown: Iterable[str], known: Iterable[str]) -> ValueError:
    """The error for options a policy does not take: each with the closest known one, then all of them."""
    unknown, known = list(unknown), sorted(known)
    named = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        named.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    return ValueError(f"{policy}: unknown option{'s' if len(unknown) > 1 else ''} {', '.join(named)}; "
                      f"known options: {', '.join(known) or 'none'}")


def settings_from_options(policy: str, settings_type: type[S], options: Mapping[str, Any]) -> S:
    """``settings_type`` built from ``options`` (see the module docstring)."""
    fields = {f.name for f in dataclasses.fields(settings_type)}
    unknown = [name for name in options if name not in fields]
    if unknown:
        raise unknown_options(policy, unknown, fields)
    return settings_type(**options)


def check_types(policy: str, settings: Any) -> None:
    """Refuse a field whose value does not match its type hint (called first by ``__post_init__``)."""
    hints = typing.get_type_hints(type(settings))
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        wanted = hints[f.name]
        if not _matches(wanted, value):
            raise refuse(policy, f.name, value, f"give {_describe(wanted)}")


def _matches(hint: Any, value: Any) -> bool:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_matches(arg, value) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:  # numpy integers count; a bool is not a count
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in typing.get_args(hint))
    return {type(None): "None", bool: "True or False", int: "a whole number", float: "a finite number",
            str: "a string"}.get(hint, f"a {getattr(hint, '__name__', hint)}")
