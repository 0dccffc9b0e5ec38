"""No config key is accepted and then ignored (issue #15): every schema leaf is read outside ``verl/config``.

A key the schema accepts but no code reads is worse than an unknown-key error: the user believes it worked.
This walks every leaf of :func:`verl.config.keys.schema_paths` and looks for a reader in ``core/src/verl``
(minus ``config/``) and ``plugins/*/src`` with the static analysis of ``key_readers.py`` (aliases, call-site
parameters, annotations; a read that does not say which of two schema classes it reads counts for neither).
Deleting the only reader of a key makes this test fail.

Keys deliberately only validated (every value but the built one is refused with the reason) are listed in
``VALIDATED_ONLY`` with that reason; an entry whose key gains a reader, or leaves the schema, fails too.
Keys whose reader is a helper under ``verl/config`` (``rollout_placement``) are in ``READ_IN_CONFIG`` and
checked to be read by that module.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from verl.testing.distributed import load_script

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
KR = load_script(HERE / "key_readers.py", "key_readers")

# Keys that no code reads on purpose: validation refuses every value but the one that is built, so verl's
# scripts still load while a setting that cannot work fails loudly with the alternative.
_CONTENTS = (
    "only model+optimizer+extra is built (exact resume needs all three); other selections are refused by "
    "config/validate_support.py, hf_model pointed at `verl export`"
)
_TOTAL_STEPS = (
    "verl's trainer overwrites it with the run's step count; a value other than -1 is refused by "
    "config/validate_support.py, which names trainer.total_training_steps"
)
VALIDATED_ONLY: dict[str, str] = {
    # verl's agent-loop keys for features not built here: config/validate_agents.py refuses them when set.
    **{
        f"actor_rollout_ref.rollout.{name}": "not built; config/validate_agents.py refuses any value but verl's "
        "default, naming what to use instead"
        for name in (
            "multi_turn.function_tool_path",
            "multi_turn.use_inference_chat_template",
            "multi_turn.num_repeat_rollouts",
            "agent.custom_async_server.path",
            "agent.custom_async_server.name",
        )
    },
    "actor_rollout_ref.rollout.multi_turn.enable": (
        "verl's marker of a multi-turn run (its trainer only copies it into meta_info); config/validate_agents.py "
        "refuses it with mode=sync, where no agent loop would read the multi-turn keys"
    ),
    "async_training.trigger_parameter_sync_step": (
        "a weight sync every step is the only schedule built; config/validate_async.py refuses any other value"
    ),
    "actor_rollout_ref.actor.optim.total_training_steps": _TOTAL_STEPS,
    "critic.optim.total_training_steps": _TOTAL_STEPS,
    "actor_rollout_ref.actor.checkpoint.save_contents": _CONTENTS,
    "actor_rollout_ref.actor.checkpoint.load_contents": _CONTENTS,
    "critic.checkpoint.save_contents": _CONTENTS,
    "critic.checkpoint.load_contents": _CONTENTS,
    # verl's rollout switches for features not built here: validate_rollout.NOT_BUILT refuses any value but
    # verl's default, naming what is missing (and the issue that builds it).
    **{
        f"actor_rollout_ref.rollout.{name}": "only verl's default is built; config/validate_rollout.py NOT_BUILT "
        "refuses other values with the reason"
        for name in (
            "data_parallel_size",
            "expert_parallel_size",
            "pipeline_model_parallel_size",
            "layered_summon",
            "enable_rollout_routing_replay",
        )
    },
    "actor_rollout_ref.rollout.multi_stage_wake_up": (
        "verl reads it nowhere (its workers always resume weights, sync, then resume the KV cache); both values "
        "are accepted and trainer/switching.py always wakes in those stages"
    ),
    # verl keys kept so its scripts load, each refused off the value that does what verl does
    # (config/validate_compat.py, which says why).
    "actor_rollout_ref.actor.grad_clip": (
        "verl's engines clip at optim.clip_grad and read grad_clip nowhere; a value other than optim.clip_grad "
        "is refused"
    ),
    **{
        f"{role}.checkpoint.strict": "verl reads it only for Megatron's hf_model export; false is refused"
        for role in ("actor_rollout_ref.actor", "critic")
    },
    "trainer.use_legacy_worker_impl": "auto/disable = the engine workers, the only ones; enable is refused",
    # verl's LoRA-adjacent keys whose feature is not built: config/validate_lora.py refuses any other value.
    "actor_rollout_ref.model.use_shm": "shared-memory model loading is not built; true is refused",
    "actor_rollout_ref.model.target_parameters": "LoRA on bare nn.Parameters is not built; only null is accepted",
    "critic.model.lora_rank": "critic LoRA is not built; a value other than 0 is refused",
    **{
        f"critic.model.{name}": "read by verl only with critic.model.lora_rank > 0, which is refused"
        for name in ("lora_alpha", "target_modules")
    },
    **{
        f"{role}.ulysses_sequence_parallel_size": "Ulysses sequence parallelism is not built; a value other than "
        "1 (verl's default) is refused by config/validate_compat.py"
        for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
    },
}
# Keys whose behaviour lives in a helper under verl/config that the trainer and workers call: checked to be
# read there (by the same analysis), so deleting that reader still fails.
READ_IN_CONFIG: dict[str, str] = {
    "actor_rollout_ref.rollout.placement": "placement.py",  # rollout_placement(), used to build the worker groups
    "model_engine": "resolve.py",  # default_strategy(): a non-dp engine family is the null strategy's value
    # role_options(): the one reader of the backend options, which the workers hand to every engine factory.
    **{
        f"{section}.engine_kwargs": "engine_options.py"
        for section in (
            "actor_rollout_ref.actor",
            "actor_rollout_ref.ref",
            "critic",
            "actor_rollout_ref.rollout.checkpoint_engine",
        )
    },
}


@functools.cache
def read_keys() -> dict[str, set[str]]:
    roots = [REPO / "core" / "src" / "verl", *sorted((REPO / "plugins").glob("*/src"))]
    # Config itself and the conformance kits (test code that sets keys to build engines) are not readers.
    # verl/tools/schemas.py parses OpenAI tool schemas, whose ``function.strict`` shares a leaf name with
    # checkpoint.strict; it never sees the run's config.
    excluded = [
        REPO / "core" / "src" / "verl" / "config",
        REPO / "core" / "src" / "verl" / "testing",
        REPO / "core" / "src" / "verl" / "tools" / "schemas.py",
    ]
    sources = KR.tree_sources(roots, exclude=excluded, relative_to=REPO)
    return KR.Analysis(sources).read_keys()


def test_every_schema_key_is_read_outside_config():
    exempt = VALIDATED_ONLY.keys() | READ_IN_CONFIG.keys()
    unread = [key for key in KR.LEAVES if key not in read_keys() and key not in exempt]
    assert not unread, (
        "schema keys accepted but read nowhere outside verl/config (make them work as in verl, or refuse a "
        "non-default value with the reason and list the key in VALIDATED_ONLY):\n  " + "\n  ".join(unread)
    )


@pytest.mark.parametrize("key", sorted(VALIDATED_ONLY))
def test_validated_only_entries_are_current(key):
    assert key in KR.LEAVES, f"{key} is no schema key any more: drop it from VALIDATED_ONLY"
    assert key not in read_keys(), f"{key} is read in {sorted(read_keys()[key])}: drop it from VALIDATED_ONLY"


@pytest.mark.parametrize("key", sorted(READ_IN_CONFIG))
def test_keys_read_by_config_helpers_are_read_there(key):
    module = REPO / "core" / "src" / "verl" / "config" / READ_IN_CONFIG[key]
    assert key in KR.Analysis([(module.name, module.read_text())]).read_keys(), f"{module} no longer reads {key}"


def _keys(source: str) -> set[str]:
    return set(KR.Analysis([("m.py", source)]).read_keys())


def test_aliases_and_call_sites_resolve():
    src = (
        "def f(cfg):\n"
        "    arr = cfg.actor_rollout_ref\n"
        "    actor, rollout = arr.actor, arr.rollout\n"
        "    build(arr.rollout)\n"
        "    return actor.ppo_epochs, rollout.val_kwargs.top_k, getattr(cfg.critic, 'cliprange_value')\n"
        "def build(config):\n"
        "    return config.top_p\n"
        "def h(m: 'CriticModelConfig'):\n"
        "    return m.override_config\n"
        "class W:\n"
        "    def a(self, c):\n"
        "        self.c = c.critic\n"
        "    def b(self):\n"
        "        return self.c.model.path\n"
    )
    assert _keys(src) == {
        "actor_rollout_ref.actor.ppo_epochs",
        "actor_rollout_ref.rollout.val_kwargs.top_k",
        "actor_rollout_ref.rollout.top_p",
        "critic.cliprange_value",
        "critic.model.override_config",
        "critic.model.path",
    }


def test_a_read_that_does_not_say_its_section_reads_nothing():
    # model.use_remove_padding exists in ModelConfig and CriticModelConfig: an unknown ``x.model`` reads neither.
    assert _keys("def g(x):\n    return x.model.use_remove_padding\n") == set()
    # top_k is in RolloutConfig and ValKwargs: a bare config parameter nobody calls reads neither.
    assert _keys("def g(config):\n    return config.top_k\n") == set()
    # Deleting the only reader of a key removes it from the read keys.
    assert "critic.cliprange_value" in _keys("def f(c):\n    return c.critic.cliprange_value\n")
    assert "critic.cliprange_value" not in _keys("def f(c):\n    return c.critic.enable\n")
