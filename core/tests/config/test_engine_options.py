"""One rule for which options each role's engine gets (``verl.config.engine_options``), checked at config load.

The backends are stand-ins (``FakeOptions`` on fake specs through the config tests' fake plugin manager): the
rule under test is config's, not a backend's. Expected values are written out by hand from the rule: critic its
own, ref the actor's overridden key by key by its own on the actor's engine (its own only on another engine),
rollout and checkpoint their own.
"""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import pytest

from verl.config import ConfigError, load_config, role_options, role_selection, validate_backend_options

A, REF, ROLLOUT = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout"
CKPT = f"{ROLLOUT}.checkpoint_engine"


@attrs.frozen(kw_only=True)
class FakeOptions:
    """Stand-in options class: two flags and a bounded size."""

    offload: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    dtype: str = attrs.field(default="float32", validator=attrs.validators.in_(["float32", "bfloat16"]))
    # in_ (not ge): attrs' in_ names the field in its error, so the converter can name the full key.
    size: int = attrs.field(default=1, validator=attrs.validators.in_(range(1, 100)))


def _spec(name: str, options_cls: type | None = FakeOptions, **extra):
    return SimpleNamespace(
        name=name, options_cls=options_cls, devices=("cpu", "cuda"), capabilities=frozenset(extra.get("caps", ()))
    )


@pytest.fixture
def manager(plugin_kit):
    """The fake table plus stand-in engines of every kind that take :class:`FakeOptions`."""
    table = plugin_kit.default_table()
    table["training_engine"]["faketrain"] = _spec("faketrain")
    table["training_engine"]["othertrain"] = _spec("othertrain")
    table["rollout_engine"]["fakegen"] = _spec("fakegen")
    table["checkpoint_engine"]["fakesync"] = _spec("fakesync")
    return plugin_kit.FakePluginManager(table)


def _load(manager, *overrides: str):
    base = [f"{A}.strategy=faketrain", f"{ROLLOUT}.name=fakegen", f"{CKPT}.backend=fakesync"]
    return load_config(overrides=[*base, *overrides], plugin_manager=manager)


def _opts(cfg, role: str):
    return role_options(cfg, role, _spec(role_selection(cfg, role).name))


def test_each_role_gets_the_rule_s_options(manager) -> None:
    cfg = _load(
        manager,
        "algorithm.adv_estimator=gae",  # critic enabled
        f"{A}.engine_kwargs.faketrain.offload=true",
        f"{A}.engine_kwargs.faketrain.dtype=bfloat16",
        f"{REF}.engine_kwargs.faketrain.offload=false",
        f"{REF}.engine_kwargs.faketrain.size=3",
        "critic.engine_kwargs.faketrain.size=2",
        f"{ROLLOUT}.engine_kwargs.fakegen.size=5",
        f"{CKPT}.engine_kwargs.fakesync.offload=true",
    )
    assert _opts(cfg, "actor") == FakeOptions(offload=True, dtype="bfloat16")
    # ref: the actor's dtype, its own offload and size over the actor's.
    assert _opts(cfg, "ref") == FakeOptions(offload=False, dtype="bfloat16", size=3)
    # critic: its own only; the actor's offload and dtype do not land on the value model.
    assert _opts(cfg, "critic") == FakeOptions(size=2)
    assert _opts(cfg, "rollout") == FakeOptions(size=5)
    assert _opts(cfg, "checkpoint") == FakeOptions(offload=True)
    # Config load checked exactly these, keyed where each role's options are written.
    checked = validate_backend_options(cfg, manager)
    assert checked[f"{A}.engine_kwargs.faketrain"] == _opts(cfg, "actor")
    assert checked[f"{REF}.engine_kwargs.faketrain"] == _opts(cfg, "ref")
    assert checked["critic.engine_kwargs.faketrain"] == _opts(cfg, "critic")
    assert checked[f"{ROLLOUT}.engine_kwargs.fakegen"] == _opts(cfg, "rollout")
    assert checked[f"{CKPT}.engine_kwargs.fakesync"] == _opts(cfg, "checkpoint")


def test_ref_on_another_engine_takes_its_own_options_only(manager) -> None:
    cfg = _load(
        manager,
        f"{A}.engine_kwargs.faketrain.offload=true",
        f"{REF}.strategy=othertrain",
        f"{REF}.engine_kwargs.othertrain.size=4",
    )
    selection = role_selection(cfg, "ref")
    assert (selection.name, selection.inherits) == ("othertrain", None)
    assert _opts(cfg, "ref") == FakeOptions(size=4)


def test_ref_without_options_of_its_own_is_the_actor_s(manager) -> None:
    cfg = _load(manager, f"{A}.engine_kwargs.faketrain.size=7")
    assert role_selection(cfg, "ref").inherits == "actor"
    assert _opts(cfg, "ref") == _opts(cfg, "actor") == FakeOptions(size=7)


def test_an_options_instance_in_engine_kwargs_is_taken_as_is(manager) -> None:
    cfg = _load(manager)
    cfg = attrs.evolve(
        cfg,
        critic=attrs.evolve(cfg.critic, engine_kwargs={"faketrain": FakeOptions(size=9)}),
    )
    assert _opts(cfg, "critic") == FakeOptions(size=9)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        (f"{A}.engine_kwargs.faketrain.size=0", f"{A}.engine_kwargs.faketrain.size"),
        (f"{REF}.engine_kwargs.faketrain.dtype=int8", f"{REF}.engine_kwargs.faketrain.dtype"),
        ("critic.engine_kwargs.faketrain.offlaod=true", "critic.engine_kwargs.faketrain.offlaod"),
        (f"{ROLLOUT}.engine_kwargs.fakegen.size=-1", f"{ROLLOUT}.engine_kwargs.fakegen.size"),
        (f"{CKPT}.engine_kwargs.fakesync.dtype=fp8", f"{CKPT}.engine_kwargs.fakesync.dtype"),
    ],
)
def test_a_bad_option_is_named_where_it_was_written(manager, override: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(manager, "algorithm.adv_estimator=gae", override)
    assert [issue.key for issue in info.value.issues] == [key]
    assert f"'{key}'" in str(info.value) or str(info.value).startswith(f"{key}:")


def test_a_bad_value_the_ref_inherits_is_reported_once_at_the_actor_s_key(manager) -> None:
    with pytest.raises(ConfigError) as info:
        # ref has options of its own (so it is checked as a role) but inherits the actor's bad dtype.
        _load(manager, f"{A}.engine_kwargs.faketrain.dtype=int8", f"{REF}.engine_kwargs.faketrain.size=2")
    assert [issue.key for issue in info.value.issues] == [f"{A}.engine_kwargs.faketrain.dtype"]


def test_role_options_names_the_inherited_key_for_a_ref_only_call(manager) -> None:
    cfg = _load(manager)
    arr = cfg.actor_rollout_ref
    bad = attrs.evolve(
        cfg,
        actor_rollout_ref=attrs.evolve(
            arr,
            actor=attrs.evolve(arr.actor, engine_kwargs={"faketrain": {"size": 0}}),
            ref=attrs.evolve(arr.ref, engine_kwargs={"faketrain": {"offload": True}}),
        ),
    )
    with pytest.raises(ConfigError) as info:
        role_options(bad, "ref", _spec("faketrain"))
    assert info.value.key == f"{A}.engine_kwargs.faketrain.size"
    assert f"{REF}.engine_kwargs" not in str(info.value)


def test_a_backend_without_options_class_refuses_options_of_either_role(manager) -> None:
    cfg = _load(manager)
    arr = cfg.actor_rollout_ref
    with_ref = attrs.evolve(
        cfg, actor_rollout_ref=attrs.evolve(arr, ref=attrs.evolve(arr.ref, engine_kwargs={"faketrain": {"x": 1}}))
    )
    assert role_options(cfg, "ref", _spec("faketrain", None)) is None
    with pytest.raises(ConfigError) as info:
        role_options(with_ref, "ref", _spec("faketrain", None))
    assert info.value.key == f"{REF}.engine_kwargs.faketrain.x" and "takes no options" in str(info.value)


def test_unknown_role_is_refused(manager) -> None:
    with pytest.raises(ValueError, match="unknown engine role 'policy'"):
        role_selection(_load(manager), "policy")
