"""The built-in ``dapo_trainer`` config against verl's DAPO recipe file, and the recipe's older keys.

The recipe's own ``dapo_trainer.yaml`` (read from the verl-recipe mirror when it is on this machine, else the
pinned copies below) is loaded through the loader as a user's verl YAML file (its Hydra header composes
``ppo_trainer``, its ``reward.*`` keys move onto ours): the result must be the built-in config, key for key.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from verl.config import ConfigError, load_config
from verl.config.base import named_base
from verl.config.dump import to_dict
from verl.config.legacy_keys import GLOBAL_MICRO_BATCH
from verl.config.schema import RootConfig
from verl.rewards.reward_managers import split_reward_kwargs

RECIPE_MIRROR = Path("/work/.mirror/verl-project+verl-recipe/repo")
# verl-recipe 48ea0a7 (2026-08-05), dapo/config/dapo_trainer.yaml: verl's reward section.
PINNED = """hydra:
  searchpath:
    - file://verl/trainer/config

defaults:
  - ppo_trainer
  - _self_

data:
  gen_batch_size: ${data.train_batch_size}

reward:
  reward_manager:
    name: dapo
  reward_kwargs:
    overlong_buffer_cfg:
      enable: False # We try to avoid forgetting to set enable
      len: 0
      penalty_factor: 0.0
      log: False
    max_resp_len: null

algorithm:
  filter_groups:
    _target_: verl.trainer.config.FilterGroupsConfig
    enable: False # We try to avoid forgetting to set enable
    metric: null # acc / score / seq_reward / seq_final_reward / ...
    max_num_gen_batches: 0 # Non-positive values mean no upper limit

trainer:
  project_name: verl-dapo
"""
# verl-recipe 21892b9 (the recipe as migrated out of verl): the older reward_model.overlong_buffer section.
PINNED_OLD = PINNED.replace(
    """reward:
  reward_manager:
    name: dapo
  reward_kwargs:
    overlong_buffer_cfg:
      enable: False # We try to avoid forgetting to set enable
      len: 0
      penalty_factor: 0.0
      log: False
    max_resp_len: null
""",
    """reward_model:
  reward_manager: dapo
  overlong_buffer:
    enable: False # We try to avoid forgetting to set enable
    len: 0
    penalty_factor: 0.0
    log: False
""",
)
DAPO = named_base("dapo_trainer", "test")
OB = "reward_model.overlong_buffer"
CFG = "reward_model.reward_kwargs.overlong_buffer_cfg"


def _recipe_text(commit: str = "HEAD") -> str:
    """The recipe's dapo_trainer.yaml at ``commit`` of the mirror, else the pinned copy."""
    for path in ("dapo/config/dapo_trainer.yaml", "recipe/dapo/config/dapo_trainer.yaml"):
        proc = subprocess.run(
            ["git", "-C", str(RECIPE_MIRROR), "show", f"{commit}:{path}"], capture_output=True, text=True
        )
        if proc.returncode == 0:
            return proc.stdout
    return PINNED if commit == "HEAD" else PINNED_OLD


def _load_recipe_file(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()) -> RootConfig:
    # verl resolves ${data.train_batch_size} when it reads the key; null is this package's "= train_batch_size".
    assert "gen_batch_size: ${data.train_batch_size}" in text
    path = tmp_path / "dapo_trainer.yaml"
    path.write_text(text.replace("${data.train_batch_size}", "null"))
    return load_config(path, list(overrides))


def test_the_builtin_equals_verls_recipe_file_loaded_as_a_verl_yaml(tmp_path: Path) -> None:
    builtin = load_config(None, base=DAPO)
    assert to_dict(_load_recipe_file(tmp_path, _recipe_text())) == to_dict(builtin)
    # The DAPO additions, and nothing else, differ from verl's defaults (ppo_trainer).
    assert builtin.reward_model.reward_manager == "dapo"
    assert builtin.reward_model.reward_kwargs == {
        "overlong_buffer_cfg": {"enable": False, "len": 0, "penalty_factor": 0.0, "log": False}
    }  # the recipe's max_resp_len: null is verl's "unset", so no key
    assert (builtin.algorithm.filter_groups.enable, builtin.algorithm.filter_groups.metric) == (False, None)
    assert builtin.algorithm.filter_groups.max_num_gen_batches == 0 and builtin.trainer.project_name == "verl-dapo"
    assert builtin.data.gen_batch_size is None  # the recipe's ${data.train_batch_size}
    bare, ours = to_dict(load_config(None)), to_dict(builtin)
    changed = {
        f"{section}.{key}"
        for section, values in ours.items()
        if isinstance(values, dict)
        for key in values
        if values[key] != bare[section][key]
    }
    # default_local_dir is verl's checkpoints/${trainer.project_name}/${trainer.experiment_name}.
    assert changed == {"reward_model.reward_manager", "reward_model.reward_kwargs", "trainer.project_name"} | {
        "trainer.default_local_dir"
    }
    assert Path(builtin.trainer.default_local_dir).parts[-2] == "verl-dapo"


def test_the_older_recipe_file_with_overlong_buffer_loads_as_main_dapo_ran_it(tmp_path: Path) -> None:
    """The recipe before verl's reward section: main_dapo passed max_resp_len=data.max_response_length."""
    old = _load_recipe_file(tmp_path, _recipe_text("21892b9"), ("data.max_response_length=300",))
    builtin = load_config(None, ["data.max_response_length=300"], base=DAPO)
    assert old.reward_model.reward_kwargs == {**builtin.reward_model.reward_kwargs, "max_resp_len": 300}
    assert to_dict(old)["reward_model"] | {"reward_kwargs": None} == to_dict(builtin)["reward_model"] | {
        "reward_kwargs": None
    }


def test_overlong_buffer_keys_move_and_the_penalty_follows_verls_formula() -> None:
    cfg = load_config(
        None,
        [
            f"{OB}.enable=true",
            f"{OB}.len=4",
            f"{OB}.penalty_factor=1.0",
            f"{OB}.log=true",
            "data.max_response_length=16",
        ],
        base=DAPO,
    )
    kwargs = cfg.reward_model.reward_kwargs
    assert kwargs == {
        "overlong_buffer_cfg": {"enable": True, "len": 4, "penalty_factor": 1.0, "log": True},
        "max_resp_len": 16,
    }
    buffer, rest = split_reward_kwargs(cfg.reward_model.reward_manager, kwargs)
    assert rest == {}
    # verl's dapo manager: exceed = L - (max_resp_len - len); penalty = min(-exceed / len * factor, 0).
    assert [buffer.penalty(n) for n in (10, 12, 13, 14, 16)] == [0.0, 0.0, -0.25, -0.5, -1.0]
    # A leaf not given keeps the base's value (dapo_trainer's penalty_factor 0.0), as the recipe's section merged.
    partial = load_config(None, [f"{OB}.enable=true", f"{OB}.len=4", "data.max_response_length=16"], base=DAPO)
    assert partial.reward_model.reward_kwargs["overlong_buffer_cfg"]["penalty_factor"] == 0.0


def test_the_same_value_both_ways_loads_and_a_different_one_names_both_keys() -> None:
    same = load_config(None, [f"{OB}.len=4", "+reward.reward_kwargs.overlong_buffer_cfg.len=4"], base=DAPO)
    assert same.reward_model.reward_kwargs["overlong_buffer_cfg"]["len"] == 4
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"{OB}.len=4", f"{CFG}.len=8"], base=DAPO)
    (issue,) = info.value.issues
    assert issue.key == f"{OB}.len" and issue.message.startswith(
        f"{OB}.len=4 conflicts with {CFG}.len=8 (from override"
    )
    assert issue.message.endswith("keep one of them")
    with pytest.raises(ConfigError, match=r"reward\.reward_kwargs\.overlong_buffer_cfg\.enable"):
        load_config(None, [f"{OB}.enable=true", "+reward.reward_kwargs.overlong_buffer_cfg.enable=false"], base=DAPO)
    # A whole overlong_buffer_cfg mapping given as an override counts as setting each leaf.
    with pytest.raises(ConfigError, match=f"{CFG}"):
        load_config(None, [f"{OB}.len=4", f"{CFG}={{enable: false, len: 2}}"], base=DAPO)
    with pytest.raises(ConfigError) as info:
        load_config(
            None, [f"{OB}.len=4", "reward_model.reward_kwargs.max_resp_len=9", "data.max_response_length=16"], base=DAPO
        )
    assert "reward_model.reward_kwargs.max_resp_len=9" in str(info.value) and "data.max_response_length=16" in str(
        info.value
    )


def test_overlong_buffer_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=rf"unknown config key '{OB}\.lenght'.*enable, len, penalty_factor, log"):
        load_config(None, [f"+{OB}.lenght=4"], base=DAPO)
    # The moved values meet the dapo manager's rules: len above max_resp_len (= data.max_response_length).
    with pytest.raises(ConfigError, match=rf"{CFG}\.len.*=32 must be > 0 and <= max_resp_len=16"):
        load_config(None, [f"{OB}.enable=true", f"{OB}.len=32", "data.max_response_length=16"], base=DAPO)
    with pytest.raises(ConfigError, match="set reward_model.reward_manager=dapo"):
        load_config(None, [f"{OB}.enable=false"])  # ppo_trainer's naive manager takes no overlong buffer


@pytest.mark.parametrize("key", sorted(GLOBAL_MICRO_BATCH))
def test_global_micro_batch_keys_load_at_null_only(key: str) -> None:
    per_gpu = GLOBAL_MICRO_BATCH[key]
    assert to_dict(load_config(None, [f"{key}=null"])) == to_dict(load_config(None))
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"{key}=16", "trainer.n_gpus_per_node=8"])
    message = str(info.value)
    assert info.value.key == key and f"{key}=16" in message
    assert f"set {per_gpu}=2 (= 16 / world size 8" in message and "null, verl's default, is accepted" in message
    with pytest.raises(ConfigError, match=rf"set {per_gpu} \(verl divides"):
        load_config(None, [f"{key}=12", "trainer.n_gpus_per_node=8"])  # 12 / 8: no per-GPU value to name
