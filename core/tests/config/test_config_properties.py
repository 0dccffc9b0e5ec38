"""Property tests: mistyped keys, wrong-typed values and random batch sizes always give a ConfigError
naming the key, never another exception type; consistent batch sizes always load."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl.config import ConfigError, RootConfig, load_config


def _leaves(cls: type, prefix: str = "") -> list[tuple[str, Any, tuple[str, ...]]]:
    """(dotted key, annotation, sibling names) of every key of the schema, written out from attrs."""
    hints = typing.get_type_hints(cls)
    names = tuple(f.name for f in attrs.fields(cls))
    out = []
    for name in names:
        path = f"{prefix}.{name}" if prefix else name
        out.append((path, hints[name], names))
        if attrs.has(hints[name]):
            out += _leaves(hints[name], path)
    return out


LEAVES = _leaves(RootConfig)
KEY_CHARS = "abcdefghijklmnopqrstuvwxyz_0123456789"
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _raise(exc_info: BaseException, key: str) -> None:
    assert isinstance(exc_info, ConfigError), f"{type(exc_info).__name__}: {exc_info}"
    assert key in str(exc_info), f"{key!r} not in {exc_info}"


@st.composite
def mistyped_key(draw: st.DrawFn) -> str:
    path, _, siblings = draw(st.sampled_from(LEAVES))
    parent, _, name = path.rpartition(".")
    op = draw(st.sampled_from(["insert", "delete", "replace", "swap"]))
    i = draw(st.integers(0, len(name) - 1))
    c = draw(st.sampled_from(KEY_CHARS))
    if op == "insert":
        new = name[:i] + c + name[i:]
    elif op == "delete":
        new = name[:i] + name[i + 1 :]
    elif op == "replace":
        new = name[:i] + c + name[i + 1 :]
    else:
        new = name[:i] + name[i + 1 : i + 2] + name[i] + name[i + 2 :]
    new = new or "x"
    if new in siblings:
        new = new + "_zz"
    return f"{parent}.{new}" if parent else new


@given(key=mistyped_key(), value=st.sampled_from(["1", "0.5", "true", "abc", "[1,2]", "null"]), plus=st.booleans())
@SETTINGS
def test_mistyped_key_is_a_config_error_naming_it(key: str, value: str, plus: bool) -> None:
    try:
        load_config(overrides=[("+" if plus else "") + f"{key}={value}"])
    except Exception as exc:  # noqa: BLE001 - the property is about the exception type
        _raise(exc, key)
    else:
        raise AssertionError(f"{key} accepted")


@st.composite
def misplaced_key(draw: st.DrawFn) -> str:
    """A real key name put into a section that does not have it (e.g. rollout.temperature under actor)."""
    path, _, _ = draw(st.sampled_from(LEAVES))
    name = path.rpartition(".")[2]
    sections = [p for p, tp, _ in LEAVES if attrs.has(tp) and name not in {f.name for f in attrs.fields(tp)}]
    return f"{draw(st.sampled_from(sections))}.{name}"


@given(key=misplaced_key())
@SETTINGS
def test_misplaced_key_is_a_config_error_naming_it(key: str) -> None:
    try:
        load_config(overrides=[f"{key}=1"])
    except Exception as exc:  # noqa: BLE001
        _raise(exc, key)
    else:
        raise AssertionError(f"{key} accepted")


def _invalid_values(tp: Any) -> list[str]:
    """Override texts that can never structure into ``tp`` (as typed by YAML 1.2)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _invalid_values(inner[0]) if len(inner) == 1 else ["{a: 1}"]
    if attrs.has(tp):
        return ["5", "abc", "[1, 2]", "true"]
    if origin is dict:
        return ["5", "abc", "[1, 2]", "true"]
    if origin is tuple:
        return ["{a: 1}", "5", "[[a]]", "[{a: 1}]"] if args[-1] is Ellipsis else ["{a: 1}", "5", "[0.9]"]
    if origin is Literal:
        return ["zz_not_a_choice", "[a]", "{a: 1}", "3.5"]
    return {
        int: ["abc", "1.5", "true", "[1]", "{a: 1}"],
        float: ["abc", "true", "[1.0]", "{a: 1}"],
        bool: ["abc", "1", "0.5", "[true]", "{a: 1}"],
        str: ["[a, b]", "{a: 1}", "true", "1.5"],
    }[tp]


TYPED = [(path, tp, _invalid_values(tp)) for path, tp, _ in LEAVES]


@st.composite
def wrong_type(draw: st.DrawFn) -> tuple[str, str]:
    path, _, values = draw(st.sampled_from(TYPED))
    return path, draw(st.sampled_from(values))


@given(case=wrong_type())
@SETTINGS
def test_wrong_type_is_a_config_error_naming_the_key(case: tuple[str, str]) -> None:
    key, value = case
    try:
        load_config(overrides=[f"{key}={value}"])
    except Exception as exc:  # noqa: BLE001
        _raise(exc, key)
    else:
        raise AssertionError(f"{key}={value} accepted")


BATCH_KEYS = (
    "data.train_batch_size",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.n",
    "trainer.n_gpus_per_node",
)


@given(
    train=st.integers(-1, 24),
    mini=st.integers(-1, 24),
    micro=st.integers(-1, 9),
    n=st.integers(0, 5),
    gpus=st.integers(0, 4),
)
@SETTINGS
def test_batch_sizes_load_exactly_when_consistent(train: int, mini: int, micro: int, n: int, gpus: int) -> None:
    overrides = [
        "trainer.controller=ray",
        "actor_rollout_ref.actor.strategy=fsdp",
        "algorithm.adv_estimator=rloo",
        f"data.train_batch_size={train}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.n={n}",
        f"trainer.n_gpus_per_node={gpus}",
    ]
    # Oracle written from verl's rules (anatomy §5.3 / §9.1), independent of the implementation.
    consistent = (
        min(train, mini, micro, n, gpus) >= 1
        and mini <= train
        and train % mini == 0
        and (train * n) % gpus == 0
        and (mini * n) % gpus == 0
        and (mini * n // gpus) >= micro
        and (mini * n // gpus) % micro == 0
    )
    try:
        load_config(overrides=overrides)
    except Exception as exc:  # noqa: BLE001
        assert isinstance(exc, ConfigError), f"{type(exc).__name__}: {exc}"
        assert not consistent, str(exc)
        assert any(key in str(exc) for key in BATCH_KEYS), str(exc)
        for issue in exc.issues:
            assert issue.message.startswith(issue.key)
    else:
        assert consistent, overrides
