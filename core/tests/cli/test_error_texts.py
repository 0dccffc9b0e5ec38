"""Config error texts a verl user sees from ``verl config show`` (issue #15): one clean line per problem, the
value quoted once, the known names listed once, a did-you-mean where a spelling is close, and the fix named.

These run the real registries and plugin manager (no fakes): the texts are what a user gets.
"""

from __future__ import annotations

import re

import pytest

from verl.algorithms import ADV_ESTIMATOR_REGISTRY, get_adv_estimator_fn
from verl.cli.main import main
from verl.config import ConfigError, load_config
from verl.config.errors import IssueCollector
from verl.config.keys import PLUS_CANNOT_ADD, find_unknown_keys
from verl.config.overrides import parse_override
from verl.plugins import get_plugin_manager


def _show_error(capsys: pytest.CaptureFixture[str], *overrides: str) -> str:
    code = main(["config", "show", *overrides])
    err = capsys.readouterr().err
    assert code == 2, err
    return err


def test_reward_manager_typo_quotes_the_value_once_and_suggests_the_built_one(capsys):
    err = _show_error(capsys, "reward_model.reward_manager=dapoo")
    assert "reward_model.reward_manager='dapoo': no such reward manager; built: ['naive', 'dapo']" in err
    assert "Did you mean 'dapo'?" in err
    assert ": =" not in err  # the stray '=' of 'key: =value'


def test_reward_manager_far_from_any_name_gets_no_suggestion(capsys):
    err = _show_error(capsys, "reward_model.reward_manager=qwertyuiop")
    assert "no such reward manager" in err and "Did you mean" not in err


def test_issue_collector_joins_a_quoted_value_to_its_key():
    report = IssueCollector()
    report.error("a.b", "='x': bad")
    report.error("a.c", "must be >= 1")
    report.warn("a.d", "=3 is odd")
    assert [i.message for i in report.errors] == ["a.b='x': bad", "a.c: must be >= 1"]
    assert report.warnings == ["a.d=3 is odd"]


def test_logger_typo_suggests_the_logger(capsys):
    err = _show_error(capsys, "trainer.logger=[console,wnadb]")
    assert "trainer.logger[1]: expected one of 'console', 'tensorboard'" in err
    assert "got 'wnadb' (str). Did you mean 'wandb'?" in err


def test_literal_without_a_close_choice_gets_no_suggestion(capsys):
    err = _show_error(capsys, "trainer.logger=[zzzzzz]")
    assert "got 'zzzzzz' (str)" in err and "Did you mean" not in err


def test_estimator_typo_lists_the_names_once_with_one_suggestion(capsys):
    err = _show_error(capsys, "algorithm.adv_estimator=grpo_vectorised")
    get_adv_estimator_fn("grpo")  # fills the registry with the built-ins
    known = sorted(set(ADV_ESTIMATOR_REGISTRY) | set(get_plugin_manager().available("advantage_estimator")))
    assert "registered names: " + ", ".join(known) + "." in err
    for name in known:  # each name once in the listing (plus once in the suggestion for the close one)
        listed = len(re.findall(rf"(?<![\w']){re.escape(name)}(?![\w'])", err))
        assert listed == 1, (name, err)
    assert err.count("Did you mean") == 1 and "Did you mean 'grpo_vectorized'?" in err
    assert "Plugin lookup" not in err and "available:" not in err


def test_policy_loss_typo_suggests_the_loss(capsys):
    err = _show_error(capsys, "actor_rollout_ref.actor.policy_loss.loss_mode=vanila")
    assert err.count("Did you mean") == 1 and "Did you mean 'vanilla'?" in err
    assert err.count("gspo") == 1


def test_plus_prefix_is_recorded_on_the_override():
    assert parse_override("+trainer.foo=1").added and parse_override("++trainer.foo=1").added
    assert not parse_override("trainer.foo=1").added


def test_unknown_key_given_with_plus_says_plus_cannot_add_keys_and_where_options_go(capsys):
    err = _show_error(capsys, "+trainer.foo=1")
    assert "unknown config key 'trainer.foo'." in err
    assert "'+' cannot add keys here" in err
    assert "engine_kwargs.<backend>" in err and "custom_reward_function.reward_kwargs" in err
    assert "(from override '+trainer.foo=1')" in err


def test_unknown_key_without_plus_does_not_talk_about_plus(capsys):
    err = _show_error(capsys, "trainer.foo=1")
    assert "unknown config key 'trainer.foo'." in err and "'+'" not in err


def test_plus_hint_reaches_an_unknown_section_above_the_added_key():
    tree = {"trainer": {"foo": {"bar": 1}, "nnodes": 1}}
    issues = find_unknown_keys(tree, added={"trainer.foo.bar"})
    assert [i.key for i in issues] == ["trainer.foo"] and PLUS_CANNOT_ADD in issues[0].message
    assert PLUS_CANNOT_ADD not in find_unknown_keys(tree, added={"trainer.nnodes"})[0].message


def test_plus_on_a_known_key_still_works():
    assert load_config(overrides=["+trainer.nnodes=1", "++data.train_batch_size=512"]).data.train_batch_size == 512


_DYNAMIC = [
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=512",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=1024",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=512",
]
_BUDGETS = (
    ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "actor_rollout_ref.actor.use_dynamic_bsz"),
    ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz"),
    ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", "actor_rollout_ref.ref.log_prob_use_dynamic_bsz"),
)


def test_token_budget_errors_name_both_fixes_and_each_fix_works():
    with pytest.raises(ConfigError) as info:
        load_config(overrides=_DYNAMIC)
    by_key = {issue.key: issue.message for issue in info.value.issues}
    longest = 512 + 1024  # data.max_prompt_length + data.max_response_length
    for budget_key, dynamic_key in _BUDGETS:
        assert f"Set {budget_key}={longest} (or more)" in by_key[budget_key]
        assert f"{dynamic_key}=false" in by_key[budget_key]
    raised = load_config(overrides=[*_DYNAMIC, *(f"{key}={longest}" for key, _ in _BUDGETS)])
    assert raised.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == longest
    switched_off = load_config(overrides=[*_DYNAMIC, *(f"{key}=false" for _, key in _BUDGETS)])
    assert switched_off.actor_rollout_ref.actor.use_dynamic_bsz is False
