"""cattrs converter for config trees: strict scalar types, no extra keys, errors as dotted keys.

cattrs' default hooks coerce (``int("4")``, ``bool("false") is True``, a string becomes a
tuple of characters). Config values must not change meaning silently, so the hooks here
accept only the YAML type that matches the annotation (an int where a float is expected is
fine; an int where a str is expected becomes its decimal text), and any failure is turned
into :class:`~verl.config.errors.ConfigIssue` records naming the full dotted key, the
expected type and the value received.
"""

from __future__ import annotations

import difflib
import math
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn

from verl.config.errors import ConfigError, ConfigIssue


class ValueTypeError(TypeError):
    """A value does not match the annotated type. ``subpath``: keys/indices below the field; ``hint``: an
    optional sentence shown after the message (a close spelling of a choice)."""

    def __init__(self, expected: str, value: Any, subpath: tuple[str | int, ...] = (), hint: str = "") -> None:
        self.expected = expected
        self.value = value
        self.subpath = subpath
        self.hint = hint
        super().__init__(self.describe())

    def describe(self) -> str:
        """``expected one of 'a', 'b', got 'c' (str)`` plus the hint, if any."""
        text = f"expected {self.expected}, got {describe_value(self.value)}"
        return f"{text}. {self.hint}" if self.hint else text


def describe_value(value: Any) -> str:
    """``'four' (str)``, ``[1, 2] (list)``; long values are shortened."""
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def type_name(tp: Any) -> str:
    """Readable name of an annotation: ``int``, ``int or null``, ``one of 'a', 'b'``, ``list of str``."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        names = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {type_name(args[0])}"
        return f"list of {len(args)} ({', '.join(type_name(a) for a in args)})"
    if origin is dict:
        return "mapping"
    if attrs.has(tp):
        return "mapping (config section)"
    if tp is Any:
        return "any value"
    return getattr(tp, "__name__", str(tp))


def _structure_int(value: Any, _: type) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueTypeError("int", value)


def _structure_float(value: Any, _: type) -> float:
    # NaN/inf are YAML floats (.nan, .inf) but never a meaningful setting: a NaN learning rate or clip
    # ratio would only surface as a NaN loss mid-run (found by tests/config/test_config_fuzz.py).
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            raise ValueTypeError("finite float", value) from None
        if math.isfinite(number):
            return number
        raise ValueTypeError("finite float", value)
    raise ValueTypeError("float", value)


def _structure_str(value: Any, _: type) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # experiment_name: 2024 -> "2024" (lossless)
    raise ValueTypeError("str", value)


def _structure_bool(value: Any, _: type) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueTypeError("bool (true/false)", value)


def _is_literal(tp: Any) -> bool:
    return typing.get_origin(tp) is Literal


def _structure_literal(value: Any, tp: Any) -> Any:
    # Compare type too: True == 1 must not pass as the choice 1.
    choices = typing.get_args(tp)
    for choice in choices:
        if type(value) is type(choice) and value == choice:
            return value
    close = (
        difflib.get_close_matches(value, [c for c in choices if isinstance(c, str)], n=1)
        if isinstance(value, str)
        else []
    )
    raise ValueTypeError(type_name(tp), value, hint=f"Did you mean {close[0]!r}?" if close else "")


def _is_tuple(tp: Any) -> bool:
    return typing.get_origin(tp) is tuple


def _make_tuple_hook(converter: cattrs.Converter):
    def hook(value: Any, tp: Any) -> tuple:
        args = typing.get_args(tp)
        variadic = len(args) == 2 and args[1] is Ellipsis
        if variadic and isinstance(value, str):
            value = [value]  # verl takes `logger: console` or `train_files: a.parquet` as one item
        if not isinstance(value, (list, tuple)):
            single = "str or " if variadic and args[0] is str else ""
            raise ValueTypeError(single + type_name(tp), value)
        if not variadic and len(value) != len(args):
            raise ValueTypeError(type_name(tp), value)
        item_types = [args[0]] * len(value) if variadic else list(args)
        out = []
        for index, (item, item_type) in enumerate(zip(value, item_types, strict=True)):
            try:
                out.append(converter.structure(item, item_type))
            except ValueTypeError as exc:
                raise ValueTypeError(exc.expected, exc.value, (index, *exc.subpath), exc.hint) from None
        return tuple(out)

    return hook


def _is_dict(tp: Any) -> bool:
    return typing.get_origin(tp) is dict or tp is dict


def _make_dict_hook(converter: cattrs.Converter):
    def hook(value: Any, tp: Any) -> dict:
        if not isinstance(value, Mapping):
            raise ValueTypeError("mapping", value)
        args = typing.get_args(tp)
        value_type = args[1] if len(args) == 2 else Any
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueTypeError("str key", key, (str(key),))
            try:
                out[key] = item if value_type is Any else converter.structure(item, value_type)
            except ValueTypeError as exc:
                raise ValueTypeError(exc.expected, exc.value, (key, *exc.subpath), exc.hint) from None
        return out

    return hook


def _make_attrs_hook_factory(converter: cattrs.Converter):
    def factory(cls: type):
        inner = make_dict_structure_fn(cls, converter, _cattrs_forbid_extra_keys=True)

        def hook(value: Any, _: type) -> Any:
            if not isinstance(value, Mapping):
                raise ValueTypeError(f"mapping (section {cls.__name__})", value)
            return inner(value, cls)

        return hook

    return factory


_SCALARS = (int, float, str, bool)


def _is_scalar_union(tp: Any) -> bool:
    """``float | str`` (optionally ``| None``): a union of two or more scalar types, e.g. a threshold given
    as a number or as a ``"lower_upper"`` string; also ``str | tuple[str, ...]`` (LoRA's ``target_modules``:
    ``all-linear`` or a list of names), tried in annotation order."""
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return False
    members = [a for a in typing.get_args(tp) if a is not type(None)]
    return len(members) > 1 and all(a in _SCALARS or a == tuple[str, ...] for a in members)


def _make_scalar_union_hook(converter: cattrs.Converter):
    def hook(value: Any, tp: Any) -> Any:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for member in args:  # in annotation order, each with its strict scalar hook
            if member is type(None):
                continue
            try:
                return converter.structure(value, member)
            except ValueTypeError:
                continue
        raise ValueTypeError(type_name(tp), value)

    return hook


def make_converter() -> cattrs.Converter:
    """A converter that structures plain dicts into frozen config classes, strictly."""
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    converter.register_structure_hook(int, _structure_int)
    converter.register_structure_hook(float, _structure_float)
    converter.register_structure_hook(str, _structure_str)
    converter.register_structure_hook(bool, _structure_bool)
    converter.register_structure_hook_func(_is_literal, _structure_literal)
    converter.register_structure_hook_func(_is_tuple, _make_tuple_hook(converter))
    converter.register_structure_hook_func(_is_dict, _make_dict_hook(converter))
    converter.register_structure_hook_func(_is_scalar_union, _make_scalar_union_hook(converter))
    converter.register_structure_hook_factory(attrs.has, _make_attrs_hook_factory(converter))
    return converter


CONVERTER = make_converter()


def format_path(parts: tuple[str | int, ...]) -> str:
    """('trainer', 'logger', 1) -> 'trainer.logger[1]'."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _flatten(exc: BaseException, path: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], BaseException]]:
    if isinstance(exc, (ClassValidationError, IterableValidationError)):
        with_notes, without = exc.group_exceptions()
        for sub, note in with_notes:
            if isinstance(note, AttributeValidationNote):
                step: tuple[str | int, ...] = (note.name,)
            elif isinstance(note, IterableValidationNote):
                step = (note.index,)
            else:
                step = ()
            yield from _flatten(sub, path + step)
        for sub in without:
            yield from _flatten(sub, path)
    else:
        yield path, exc


def issues_from_exception(exc: BaseException, prefix: tuple[str | int, ...] = ()) -> list[ConfigIssue]:
    """Translate a structuring exception into issues with dotted keys (never re-raises cattrs types)."""
    issues = []
    for path, sub in _flatten(exc, prefix):
        if isinstance(sub, ValueTypeError):
            key = format_path(path + sub.subpath)
            issues.append(ConfigIssue(key, f"{key}: {sub.describe()}"))
        elif isinstance(sub, ForbiddenExtraKeysError):
            for extra in sorted(sub.extra_fields):
                key = format_path((*path, extra))
                issues.append(ConfigIssue(key, f"unknown config key '{key}'"))
        else:
            # attrs' own validators (in_, instance_of, ...) pass the failing Attribute in args.
            attribute = next((a for a in getattr(sub, "args", ()) if isinstance(a, attrs.Attribute)), None)
            key = format_path(path + ((attribute.name,) if attribute is not None else ())) or "<root>"
            text = sub.args[0] if attribute is not None and sub.args else f"{type(sub).__name__}: {sub}"
            issues.append(ConfigIssue(key, f"{key}: {text}"))
    return issues


def structure(data: Any, cls: type, prefix: tuple[str | int, ...] = ()) -> Any:
    """Structure ``data`` into ``cls``; raises :class:`ConfigError` naming every bad dotted key."""
    try:
        return CONVERTER.structure(data, cls)
    except ValueTypeError as exc:  # top-level value is not a mapping
        key = format_path(prefix + exc.subpath) or "<root>"
        raise ConfigError(ConfigIssue(key, f"{key}: {exc.describe()}")) from None
    except Exception as exc:  # cattrs groups: translate, never leak a cattrs traceback
        raise ConfigError(issues_from_exception(exc, prefix)) from None
