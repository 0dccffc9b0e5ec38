"""Config fuzzing (issue 6): whatever a user writes -- in a YAML file, as overrides, or through
``verl config show`` -- ``load_config`` either returns a config or raises ``ConfigError`` whose issues each
name a dotted key; never another exception type, never a traceback from deep inside.

Complements ``test_config_properties.py`` (single overrides): here values are arbitrary YAML trees written
into files, several typed-but-extreme values are combined, and the raw override text is random. All tests are
derandomized (same examples every run) and small enough to finish in a few seconds each.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, Literal

import attrs
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl.config import ConfigError, RootConfig, load_config


def _leaves(cls: type, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, annotation) of every key of the schema, sections included."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in attrs.fields(cls):
        path = f"{prefix}.{f.name}" if prefix else f.name
        out.append((path, hints[f.name]))
        if attrs.has(hints[f.name]):
            out += _leaves(hints[f.name], path)
    return out


LEAVES = _leaves(RootConfig)
KEYS = [path for path, _ in LEAVES]
SCALAR_LEAVES = [(path, tp) for path, tp in LEAVES if not attrs.has(tp)]
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _check_error(exc: BaseException, *related: str) -> None:
    """``exc`` is a ConfigError whose issues each name their key; one key relates to ``related``."""
    assert isinstance(exc, ConfigError), f"{type(exc).__name__} escaped: {exc}"
    assert exc.issues and exc.key == exc.issues[0].key
    assert "Traceback" not in str(exc)
    for issue in exc.issues:
        assert issue.key, str(exc)
        # "<file>" / "<override>": the problem is the file or the override text itself, not one key
        assert issue.key in ("<file>", "<override>") or issue.key in issue.message, issue
    if related:
        keys = [issue.key for issue in exc.issues]
        ok = any(k.startswith(r) or r.startswith(k.split("[")[0]) or k in KEYS for k in keys for r in related)
        assert ok, f"no issue about {related}: {keys}"


def _nest(path: str, value: Any) -> dict[str, Any]:
    for part in reversed(path.split(".")):
        value = {part: value}
    return value


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=5), st.integers(-3, 3), st.booleans()), inner, max_size=3),
    ),
    max_leaves=6,
)


@given(path=st.sampled_from(KEYS), value=VALUES)
@FUZZ
def test_any_yaml_value_at_any_key_is_loaded_or_a_config_error(tmp_path_factory, path: str, value: Any) -> None:
    file = tmp_path_factory.mktemp("cfg") / "run.yaml"
    file.write_text(yaml.safe_dump(_nest(path, value)))
    try:
        load_config(file)
    except Exception as exc:  # noqa: BLE001 - the property is the exception type
        _check_error(exc, path)


@given(path=st.sampled_from(KEYS), text=st.text(max_size=12), prefix=st.sampled_from(["", "+", "++", "~"]))
@FUZZ
def test_any_override_text_is_loaded_or_a_config_error(path: str, text: str, prefix: str) -> None:
    try:
        load_config(overrides=[f"{prefix}{path}={text}"])
    except Exception as exc:  # noqa: BLE001
        _check_error(exc)


@given(raw=st.text(max_size=30))
@FUZZ
def test_garbage_override_is_a_config_error(raw: str) -> None:
    try:
        load_config(overrides=[raw])
    except Exception as exc:  # noqa: BLE001
        _check_error(exc)


def _extreme(tp: Any) -> st.SearchStrategy[str]:
    """Override texts of the right type but extreme value (0, negatives, 2**70, nan, inf, blanks)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*[_extreme(a) for a in args])
    if tp is type(None):
        return st.just("null")
    if origin is Literal:
        return st.sampled_from([str(a) for a in args])
    if tp is int:
        return st.sampled_from(["-9223372036854775808", "-5", "-1", "0", "1", "3", "7", "1099511627776", str(2**70)])
    if tp is float:
        return st.sampled_from([".nan", ".inf", "-.inf", "0", "-1.0", "1e308", "1e-320", "0.5", "3"])
    if tp is bool:
        return st.sampled_from(["true", "false"])
    if tp is str:
        return st.sampled_from(["''", "x", "'  '", "null"])
    return st.sampled_from(["null", "[]", "{}"])


@given(data=st.data())
@FUZZ
def test_combined_extreme_values_are_loaded_or_a_config_error(data: st.DataObject) -> None:
    chosen = data.draw(st.lists(st.sampled_from(SCALAR_LEAVES), min_size=1, max_size=6, unique_by=lambda x: x[0]))
    overrides = [f"{key}={data.draw(_extreme(tp))}" for key, tp in chosen]
    try:
        cfg = load_config(overrides=overrides)
    except Exception as exc:  # noqa: BLE001
        _check_error(exc)
    else:
        assert isinstance(cfg, RootConfig)


@st.composite
def _typo_in_file(draw: st.DrawFn) -> tuple[str, str]:
    """A real key with one edit (insert/delete/replace/swap), written nested in a YAML file."""
    path = draw(st.sampled_from([p for p, _ in SCALAR_LEAVES]))
    parent, _, name = path.rpartition(".")
    siblings = {p.rpartition(".")[2] for p in KEYS if p.rpartition(".")[0] == parent}
    i = draw(st.integers(0, len(name) - 1))
    c = draw(st.sampled_from("abcdefghijklmnopqrstuvwxyz_"))
    op = draw(st.sampled_from(["insert", "delete", "replace", "swap"]))
    new = {
        "insert": name[:i] + c + name[i:],
        "delete": name[:i] + name[i + 1 :],
        "replace": name[:i] + c + name[i + 1 :],
        "swap": name[:i] + name[i + 1 : i + 2] + name[i] + name[i + 2 :],
    }[op] or "x"
    if new in siblings:
        new += "_zz"
    return path, f"{parent}.{new}" if parent else new


@given(case=_typo_in_file())
@FUZZ
def test_mistyped_key_in_a_yaml_file_names_the_full_dotted_key(tmp_path_factory, case: tuple[str, str]) -> None:
    real, typo = case
    file = tmp_path_factory.mktemp("cfg") / "run.yaml"
    file.write_text(yaml.safe_dump(_nest(typo, 1)))
    with pytest.raises(ConfigError) as err:
        load_config(file)
    assert typo in str(err.value) and "from file" in str(err.value)
    _check_error(err.value, typo)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["data.train_files=[]"], "data.train_files"),
        (["data.val_files=[a.parquet,'']"], "data.val_files[1]"),
        (["actor_rollout_ref.model.path=' '"], "actor_rollout_ref.model.path"),
        (["actor_rollout_ref.actor.optim.lr=.nan"], "actor_rollout_ref.actor.optim.lr"),
        (["algorithm.kl_ctrl.kl_coef=-.inf"], "algorithm.kl_ctrl.kl_coef"),
        (["actor_rollout_ref.actor.clip_ratio=1e400"], "actor_rollout_ref.actor.clip_ratio"),
    ],
)
def test_fuzz_findings_are_named_errors(overrides: list[str], key: str) -> None:
    """Found by the fuzz: blank paths, empty file lists and NaN/inf floats used to pass validation (and fail
    later, or turn the loss into NaN)."""
    with pytest.raises(ConfigError) as err:
        load_config(overrides=overrides)
    assert err.value.key == key and str(err.value).startswith(key)


@pytest.mark.parametrize(
    "content",
    ["data: [1, 2]", "- a\n- b", "data:\n  train_batch_size: {a: 1}", "trainer:\n  logger: 5", "{bad", "42"],
)
def test_bad_yaml_files_are_config_errors(tmp_path: Path, content: str) -> None:
    file = tmp_path / "run.yaml"
    file.write_text(content)
    with pytest.raises(ConfigError):
        load_config(file)


def test_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.yaml")


CLI_CASES = [
    ["algorithm.kl_ctrl.kl_coeff=0.5"],
    ["data.train_batch_size=abc"],
    ["data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=2"],
    ["actor_rollout_ref.rollout.temperature=.nan"],
    ["actor_rollout_ref.actor.optim.lr=.inf"],
    ["novalue"],
    ["data.train_files=[]"],
]


@pytest.mark.parametrize("overrides", CLI_CASES, ids=[o[0] for o in CLI_CASES])
def test_verl_config_show_exits_2_without_traceback(overrides: list[str], capsys: pytest.CaptureFixture) -> None:
    from verl.cli.main import main

    assert main(["config", "show", "--schema-defaults", *overrides]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and "Traceback" not in captured.err
    assert captured.out == ""


@given(path=st.sampled_from(KEYS), value=VALUES)
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_verl_config_show_never_tracebacks_on_a_fuzzed_file(tmp_path_factory, capsys, path: str, value: Any) -> None:
    from verl.cli.main import main

    file = tmp_path_factory.mktemp("cli") / "run.yaml"
    file.write_text(yaml.safe_dump(_nest(path, value)))
    code = main(["config", "show", str(file)])
    err = capsys.readouterr().err
    assert code in (0, 2) and "Traceback" not in err
    if code == 2:
        assert err.startswith("error: ")
