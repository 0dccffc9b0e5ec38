"""Options of the megatron engine: config load (engine_kwargs.megatron and verl's actor/ref/critic.megatron keys),
the refusals and the values resolved per device, and the plugin's registration."""

from __future__ import annotations

import subprocess
import sys

import pytest
from verl_megatron.options import MegatronEngineOptions, MegatronOptionError

from verl.config import ConfigError, load_config, role_options
from verl.plugins import get_plugin_manager

A = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
MK = f"{A}.engine_kwargs.megatron"
MEGATRON = [f"{A}.strategy=megatron"]


def _spec():
    return get_plugin_manager().get("training_engine", "megatron")


def _options(overrides: list[str], role: str = "actor") -> MegatronEngineOptions:
    """What the worker hands the megatron factory for ``role`` (core's one rule, the plugin's real spec)."""
    return role_options(load_config(overrides=[*MEGATRON, *overrides]), role, _spec())


def _issue(overrides: list[str]):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[*MEGATRON, *overrides])
    (issue,) = err.value.issues
    return issue


# ----------------------------------------------------------------------------- registration


def test_plugin_is_registered_with_its_options_and_devices():
    from verl_megatron import plugin

    spec = _spec()
    assert spec.options_cls is MegatronEngineOptions
    assert spec.devices == ("cpu", "cuda")
    assert spec.capabilities == frozenset({"data_parallel"})
    assert spec.merge_checkpoint is plugin.merge_checkpoint
    assert spec.available() is True  # megatron-core is installed with the test extra


def test_available_says_how_to_install_megatron_core_when_it_is_missing(monkeypatch):
    import importlib.util

    from verl_megatron import plugin

    def no_megatron(name, *args):
        assert name == "megatron.core"
        raise ModuleNotFoundError("No module named 'megatron'")  # what find_spec raises without the parent package

    monkeypatch.setattr(importlib.util, "find_spec", no_megatron)
    assert plugin.megatron_available() == (
        "megatron-core missing: pip install './plugins/verl-megatron[cpu]' (or [cuda])"
    )
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    assert plugin.megatron_available() == plugin.MISSING


def test_importing_the_package_options_and_the_hook_imports_neither_torch_nor_megatron():
    code = (
        "import sys, verl_megatron, verl_megatron.options, verl_megatron.plugin as p\n"
        "verl_megatron.MegatronEngineOptions\n"
        "p.verl_training_engines()\n"
        "print(','.join(m for m in ('torch', 'megatron.core') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == ""


# ----------------------------------------------------------------------------- config load


def test_defaults_are_verls_where_they_exist():
    opts = _options([])
    assert opts == MegatronEngineOptions()
    assert opts.parallel_sizes() == {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "etp": None}
    assert (opts.use_distributed_optimizer, opts.seed, opts.use_mbridge) == (True, 42, True)
    assert (opts.param_offload, opts.grad_offload, opts.optimizer_offload) == (False, False, False)
    assert (opts.sequence_parallel, opts.dtype, opts.transformer_impl) == (None, "auto", "auto")
    assert (opts.override_transformer_config, opts.override_ddp_config) == ({}, {})
    assert opts.pad_bshd_to_minibatch_max is False and opts.token_stats_overrides() == {}


def test_engine_kwargs_and_verls_megatron_keys_give_the_same_options():
    ours = _options([f"{MK}.tensor_model_parallel_size=2", f"{MK}.pipeline_model_parallel_size=2"])
    verls = _options([f"{A}.megatron.tensor_model_parallel_size=2", f"{A}.megatron.pipeline_model_parallel_size=2"])
    assert ours == verls
    assert verls.parallel_sizes() == {"tp": 2, "pp": 2, "vpp": None, "cp": 1, "ep": 1, "etp": None}


def test_ref_megatron_lies_over_the_actor_options_and_the_critic_takes_its_own():
    overrides = [
        "algorithm.adv_estimator=gae",
        f"{A}.megatron.tensor_model_parallel_size=2",
        f"{REF}.megatron.param_offload=true",
        "critic.megatron.seed=7",
    ]
    cfg = load_config(overrides=[*MEGATRON, *overrides])
    actor, ref, critic = (role_options(cfg, role, _spec()) for role in ("actor", "ref", "critic"))
    assert (actor.tensor_model_parallel_size, actor.param_offload) == (2, False)
    assert (ref.tensor_model_parallel_size, ref.param_offload) == (2, True)
    assert (critic.tensor_model_parallel_size, critic.seed, actor.seed) == (1, 7, 42)


def test_verls_yaml_values_load():
    # verl/trainer/config/engine/megatron.yaml, the keys these options share with it (sequence_parallel aside: verl
    # writes true with TP 1 and turns it off silently; here true at TP 1 is refused, see below).
    verl_yaml = {
        "param_offload": "false",
        "grad_offload": "false",
        "optimizer_offload": "false",
        "tensor_model_parallel_size": "1",
        "expert_model_parallel_size": "1",
        "expert_tensor_parallel_size": "null",
        "pipeline_model_parallel_size": "1",
        "virtual_pipeline_model_parallel_size": "null",
        "context_parallel_size": "1",
        "use_distributed_optimizer": "true",
        "use_dist_checkpointing": "false",
        "dist_checkpointing_path": "null",
        "dynamic_context_parallel": "false",
        "max_seqlen_per_dp_cp_rank": "null",
        "dist_checkpointing_prefix": "''",
        "dist_ckpt_optim_fully_reshardable": "false",
        "distrib_optim_fully_reshardable_mem_efficient": "false",
        "entropy_from_logits_with_chunking": "false",
        "entropy_from_logits_chunk_size": "2048",
        "seed": "42",
        "override_ddp_config": "{}",
        "override_transformer_config": "{recompute_granularity: null, recompute_modules: [core_attn], "
        "recompute_method: null, recompute_num_layers: null, attention_backend: flash}",
        "override_mcore_model_config": "{}",
        "use_mbridge": "true",
        "vanilla_mbridge": "false",
        "pad_bshd_to_minibatch_max": "true",
        "pad_to_length": "false",
        "pad_to_length_bucket": "512",
        "use_megatron_fsdp": "false",
        "dtype": "bfloat16",
    }
    opts = _options([f"{A}.megatron.{key}={value}" for key, value in verl_yaml.items()])
    assert opts.pad_bshd_to_minibatch_max is True and opts.dist_checkpointing_prefix == ""
    assert opts.override_transformer_config["recompute_modules"] == ["core_attn"]
    assert opts.resolved_dtype("cpu") == "bfloat16"  # an explicit dtype is kept on every device
    assert opts.token_stats_overrides() == {
        "entropy_from_logits_with_chunking": False,
        "entropy_from_logits_chunk_size": 2048,
    }


def test_verls_megatron_keys_with_another_engine_are_refused_naming_it():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"{A}.strategy=fsdp", f"{A}.megatron.tensor_model_parallel_size=2"])
    (issue,) = err.value.issues
    assert issue.key == f"{A}.megatron.tensor_model_parallel_size"
    assert f"{A}.megatron configures Megatron, but the training engine is 'fsdp' ({A}.strategy)" in issue.message
    assert f"set {A}.strategy=megatron" in issue.message


REFUSED = [
    ("tensor_model_parallel_size", "0", "must be an int >= 1, got 0"),
    ("pipeline_model_parallel_size", "-1", "must be an int >= 1, got -1"),
    ("context_parallel_size", "0", "must be an int >= 1, got 0"),
    ("expert_model_parallel_size", "0", "must be an int >= 1, got 0"),
    ("virtual_pipeline_model_parallel_size", "0", "must be an int >= 1 or null, got 0"),
    ("virtual_pipeline_model_parallel_size", "2", "2 needs pipeline_model_parallel_size > 1 (it is 1)"),
    ("expert_tensor_parallel_size", "0", "must be an int >= 1 or null, got 0"),
    ("transformer_impl", "te", "must be one of ['auto', 'local', 'transformer_engine'], got 'te'"),
    ("dtype", "int8", "got 'int8'"),
    ("pad_to_length_bucket", "0", "must be an int >= 1, got 0"),
    ("pad_to_length_bucket", "256", "256 is not accepted: it is the bucket of pad_to_length, which is not built"),
    ("seed", "abc", "expected int, got 'abc' (str)"),
    ("use_dist_checkpointing", "true", "true is not accepted: loading the initial weights from a Megatron dist"),
    ("dist_checkpointing_path", "/ckpt", "'/ckpt' is not accepted: loading the initial weights"),
    ("dist_checkpointing_prefix", "module.", "'module.' is not accepted: loading the initial weights"),
    ("dist_ckpt_optim_fully_reshardable", "true", "true is not accepted: the fully reshardable optimizer"),
    ("distrib_optim_fully_reshardable_mem_efficient", "true", "true is not accepted: it tunes the fully reshardable"),
    ("use_megatron_fsdp", "true", "true is not accepted: Megatron-FSDP (ZeRO-3 parameter sharding) is not built"),
    ("dynamic_context_parallel", "true", "true is not accepted: verl's dynamic context-parallel scheduling"),
    ("max_seqlen_per_dp_cp_rank", "4096", "4096 is not accepted: it is read only by dynamic_context_parallel"),
    ("override_mcore_model_config", "{share_embeddings: false}", "{'share_embeddings': False} is not accepted"),
    ("vanilla_mbridge", "true", "true is not accepted: it makes verl build the model with the deprecated legacy"),
    ("pad_to_length", "true", "true is not accepted: it pads packed (THD) micro-batches"),
]


@pytest.mark.parametrize(("name", "value", "expected"), REFUSED, ids=[f"{n}={v}" for n, v, _ in REFUSED])
def test_each_refusal_names_the_key(name, value, expected):
    issue = _issue([f"{MK}.{name}={value}"])
    assert issue.key == f"{MK}.{name}"
    assert issue.message.startswith(f"{MK}.{name}: ") and expected in issue.message


def test_a_refusal_of_the_reference_policy_names_its_own_key():
    issue = _issue([f"{REF}.engine_kwargs.megatron.use_megatron_fsdp=true"])
    assert issue.key == f"{REF}.engine_kwargs.megatron.use_megatron_fsdp"


def test_an_off_only_key_refuses_a_falsy_value_of_another_type():
    # 0 == False and None != {}, but neither is the "off" value verl writes (config load's type check says the same
    # first; a direct caller meets the options' own check).
    assert "expected bool (true/false), got 0 (int)" in _issue([f"{MK}.use_megatron_fsdp=0"]).message
    with pytest.raises(MegatronOptionError, match="use_megatron_fsdp: 0 is not accepted"):
        MegatronEngineOptions(use_megatron_fsdp=0)
    with pytest.raises(MegatronOptionError, match="override_mcore_model_config: 0 is not accepted"):
        MegatronEngineOptions(override_mcore_model_config=0)
    assert MegatronEngineOptions(override_mcore_model_config=None).override_mcore_model_config == {}


def test_unknown_key_is_a_config_error():
    assert _issue([f"{A}.megatron.tensor_parallel_size=2"]).key == f"{MK}.tensor_parallel_size"


def test_direct_construction_names_the_actor_key():
    with pytest.raises(MegatronOptionError) as err:
        MegatronEngineOptions(tensor_model_parallel_size=0)
    assert str(err.value) == f"{MK}.tensor_model_parallel_size: must be an int >= 1, got 0"
    assert isinstance(err.value, ValueError)


# ----------------------------------------------------------------------------- values resolved per device


@pytest.mark.parametrize(
    ("tp", "given", "device", "expected"),
    [
        (1, None, "cuda", False),  # verl turns it off at TP 1
        (1, True, "cuda", False),  # verl's YAML default true at TP 1: off with a warning, as verl
        (1, True, "cpu", False),
        (2, None, "cuda", True),  # verl's default true
        (2, None, "cpu", False),  # no sequence-parallel norms in the local spec
        (2, False, "cuda", False),
        (2, True, "cuda", True),
    ],
)
def test_resolved_sequence_parallel(tp, given, device, expected):
    opts = MegatronEngineOptions(tensor_model_parallel_size=tp, sequence_parallel=given)
    assert opts.resolved_sequence_parallel(device) is expected


def test_sequence_parallel_on_cpu_is_refused_naming_the_key_of_the_role():
    opts = MegatronEngineOptions(tensor_model_parallel_size=2, sequence_parallel=True)
    with pytest.raises(ValueError, match=r"^critic\.engine_kwargs\.megatron\.sequence_parallel=true cannot run on cpu"):
        opts.resolved_sequence_parallel("cpu", section="critic.engine_kwargs.megatron")


@pytest.mark.parametrize(
    ("impl", "device", "te", "expected"),
    [
        ("auto", "cuda", True, "transformer_engine"),
        ("auto", "cuda", False, "local"),
        ("auto", "cpu", True, "local"),
        ("local", "cuda", True, "local"),
        ("transformer_engine", "cuda", True, "transformer_engine"),
    ],
)
def test_resolved_transformer_impl(impl, device, te, expected):
    assert MegatronEngineOptions(transformer_impl=impl).resolved_transformer_impl(device, te) == expected


def test_transformer_engine_on_cpu_or_without_te_is_refused_naming_the_key():
    opts = MegatronEngineOptions(transformer_impl="transformer_engine")
    with pytest.raises(ValueError, match=rf"^{MK}\.transformer_impl=transformer_engine cannot run on cpu"):
        opts.resolved_transformer_impl("cpu", True)
    with pytest.raises(ValueError, match=rf"^{MK}\.transformer_impl=transformer_engine, but Transformer Engine does"):
        opts.resolved_transformer_impl("cuda", False)


@pytest.mark.parametrize(
    ("given", "device", "expected"),
    [
        ("auto", "cpu", "float32"),
        ("auto", "cuda", "bfloat16"),
        ("bf16", "cpu", "bfloat16"),
        ("fp16", "cuda", "float16"),
        ("fp32", "cuda", "float32"),
        ("float16", "cpu", "float16"),
    ],
)
def test_resolved_dtype(given, device, expected):
    assert MegatronEngineOptions(dtype=given).resolved_dtype(device) == expected


def test_check_device_refuses_what_needs_transformer_engine_on_cpu():
    opts = MegatronEngineOptions(
        tensor_model_parallel_size=2,
        sequence_parallel=True,
        context_parallel_size=2,
        transformer_impl="transformer_engine",
    )
    opts.check_device("cuda")  # all of it can run there
    with pytest.raises(ValueError) as err:
        opts.check_device("cpu")
    text = str(err.value)
    for key in ("sequence_parallel=true", "context_parallel_size=2", "transformer_impl=transformer_engine"):
        assert f"{MK}.{key} cannot run on cpu" in text
    MegatronEngineOptions(tensor_model_parallel_size=2).check_device("cpu")  # auto values resolve to what runs


def test_token_stats_overrides_through_verls_keys():
    opts = _options([f"{A}.megatron.entropy_from_logits_with_chunking=true"])
    assert opts.token_stats_overrides() == {"entropy_from_logits_with_chunking": True}


# ----------------------------------------------------------------------------- override names (imports megatron)


def test_verls_default_overrides_pass_and_attention_backend_becomes_the_enum():
    from megatron.core.transformer.enums import AttnBackend

    overrides = {
        "recompute_granularity": None,
        "recompute_modules": ["core_attn"],
        "recompute_method": None,
        "recompute_num_layers": None,
        "attention_backend": "flash",
    }
    opts = MegatronEngineOptions(
        override_transformer_config=overrides, override_ddp_config={"overlap_grad_reduce": True}
    )
    opts.check_override_names()
    assert opts.transformer_config_overrides() == {**overrides, "attention_backend": AttnBackend.flash}


def test_misspelt_override_names_are_refused_with_the_closest_field():
    opts = MegatronEngineOptions(
        override_transformer_config={"recompute_granularty": "full"}, override_ddp_config={"overlap_grad_reduc": True}
    )
    with pytest.raises(ValueError) as err:
        opts.check_override_names()
    text = str(err.value)
    assert (
        f"{MK}.override_transformer_config.recompute_granularty: TransformerConfig has no field "
        "'recompute_granularty'; did you mean 'recompute_granularity'?"
    ) in text
    assert (
        f"{MK}.override_ddp_config.overlap_grad_reduc: DistributedDataParallelConfig has no field "
        "'overlap_grad_reduc'; did you mean 'overlap_grad_reduce'?"
    ) in text


def test_overrides_of_what_the_options_set_and_bad_attention_backends_are_refused():
    opts = MegatronEngineOptions(
        override_transformer_config={"tensor_model_parallel_size": 2, "attention_backend": "flashy"},
        override_ddp_config={"use_distributed_optimizer": False},
    )
    with pytest.raises(ValueError) as err:
        opts.check_override_names(section="critic.engine_kwargs.megatron")
    text = str(err.value)
    assert (
        "critic.engine_kwargs.megatron.override_transformer_config.tensor_model_parallel_size: set by these options; "
        "write it as critic.engine_kwargs.megatron.tensor_model_parallel_size"
    ) in text
    assert "critic.engine_kwargs.megatron.override_ddp_config.use_distributed_optimizer: set by these options" in text
    assert "override_transformer_config.attention_backend='flashy': must be one of ['flash', 'fused'" in text
