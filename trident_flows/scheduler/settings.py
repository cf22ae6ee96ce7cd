"""Policy settings: how a policy's options become one frozen, validated settings value.

Contract:
- Every registered policy declares ``settings_type``: a frozen dataclass of all its options, each a
  ``setting(default, doc)`` field with a type hint and a one-line doc of its unit and meaning, whose
  ``__post_init__`` refuses a bad value with ``refuse``: "POLICY: FIELD=VALUE is refused: WHAT TO CHANGE".
- A settings type may instead be made of ``section(section_type, doc)`` fields, each a frozen, validated
  dataclass of ``setting`` fields; its options stay flat (``setting(..., option=NAME)``) and no two fields
  of one settings type share an option name (``option_paths``).
- ``settings_from_options(policy, settings_type, options)`` builds one, refusing an unknown option or a
  value of the wrong type with a message that says what to change.
- ``documented(settings_type)`` maps each option to its doc (for forms and help texts).
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


def setting(default: Any, doc: str, *, option: str | None = None) -> Any:
    """A settings field with its default, its one-line doc (unit and meaning) and, in a section, its option name."""
    return dataclasses.field(default=default, metadata=_metadata(doc, option))


def setting_factory(factory: Any, doc: str, *, option: str | None = None) -> Any:
    """A settings field whose default is built by ``factory`` (a frozen value per settings object)."""
    return dataclasses.field(default_factory=factory, metadata=_metadata(doc, option))


def section(section_type: type, doc: str) -> Any:
    """A field holding one section of a settings type (``section_type`` built with its defaults)."""
    return dataclasses.field(default_factory=section_type, metadata={"doc": doc, "section": section_type})


def _metadata(doc: str, option: str | None) -> dict[str, str]:
    return {"doc": doc} if option is None else {"doc": doc, "option": option}


def option_paths(settings_type: type) -> dict[str, tuple[str, str | None]]:
    """Each option of ``settings_type`` and where it lives: ``(field, None)``, or ``(section, field)`` in a section."""
    paths: dict[str, tuple[str, str | None]] = {}
    for f in dataclasses.fields(settings_type):
        section_type = f.metadata.get("section")
        inner = [(g, (f.name, g.name)) for g in dataclasses.fields(section_type)] if section_type else [(f, (f.name, None))]
        for g, path in inner:
            name = g.metadata.get("option", g.name)
            if name in paths:
                raise TypeError(f"{settings_type.__name__}: option {name!r} names two fields: {paths[name]} and {path}")
            paths[name] = path
    return paths


def refuse(policy: str, name: str, value: Any, fix: str, option: str | None = None) -> ValueError:
    """The error for a bad setting: names the policy, the field, the value and what to change (and the
    option that sets the field, where its name differs): "POLICY: SECTION.FIELD=VALUE is refused: WHAT TO
    CHANGE (option NAME)"."""
    return ValueError(f"{policy}: {name}={value!r} is refused: {fix}" + (f" (option {option})" if option is not None else ""))


def option_of(settings_type: type, name: str) -> str | None:
    """The option that sets field ``name`` of ``settings_type`` where it is named otherwise, else None."""
    return next((f.metadata.get("option") for f in dataclasses.fields(settings_type) if f.name == name), None)


def documented(settings_type: type) -> dict[str, str]:
    """Each option of ``settings_type`` and its one-line doc, in declaration order (the Prefect block's field
    descriptions)."""
    fields = {f.name: f for f in dataclasses.fields(settings_type)}
    docs = {}
    for name, (outer, inner) in option_paths(settings_type).items():
        field = fields[outer] if inner is None else next(g for g in dataclasses.fields(fields[outer].metadata["section"]) if g.name == inner)
        docs[name] = field.metadata.get("doc", "")
    return docs


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
    """``settings_type`` built from ``options`` (flat option names; a section field's option is the field's name
    unless its ``option`` names it otherwise). An option that is not one of its options is refused naming the
    closest option and all of them (``unknown_options``); a value whose type does not match the field's hint (a
    string for a number, a float for a count, a NaN) is refused naming the field, the value and the type wanted
    (``check_types``), before the field's own checks run."""
    paths = option_paths(settings_type)
    unknown = [name for name in options if name not in paths]
    if unknown:
        raise unknown_options(policy, unknown, paths)
    fields: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for name, value in options.items():
        outer, inner = paths[name]
        if inner is None:
            fields[outer] = value
        else:
            sections.setdefault(outer, {})[inner] = value
    section_types = {f.name: f.metadata["section"] for f in dataclasses.fields(settings_type) if "section" in f.metadata}
    return settings_type(**fields, **{name: section_types[name](**values) for name, values in sections.items()})


def check_types(policy: str, settings: Any, section: str | None = None) -> None:
    """Refuse a field whose value does not match its type hint (called first by ``__post_init__``); in a
    section, the field is named ``section.field``."""
    hints = typing.get_type_hints(type(settings))
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        wanted = hints[f.name]
        if not _matches(wanted, value):
            raise refuse(policy, f.name if section is None else f"{section}.{f.name}", value, f"give {_describe(wanted)}",
                         f.metadata.get("option"))


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
