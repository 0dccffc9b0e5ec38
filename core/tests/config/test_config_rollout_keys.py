"""verl's first-class rollout engine keys (issue #15): loaded, checked by the selected backend, honoured by hf."""

from __future__ import annotations

import pytest
import torch

from verl.config import ConfigError, load_config
from verl.engines.reference.rollout import build_hf_rollout
from verl.engines.reference.rollout_options import check_hf_rollout_config, generation_chunks
from verl.models import load_tokenizer
from verl.protocol import DataProto
from verl.testing.conformance import make_rollout_config
from verl.testing.tiny import save_tiny_model

R = "actor_rollout_ref.rollout"


@pytest.fixture
def hf_checked(fake_backends):
    """The fake manager's hf spec with the real hf check_config (the fake table has none)."""
    hf = fake_backends.table["rollout_engine"]["hf"]
    hf.check_config = check_hf_rollout_config
    return fake_backends


def _errors(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=overrides)
    return str(err.value)


def test_vllm_style_keys_load_for_vllm() -> None:
    cfg = load_config(
        overrides=[
            f"{R}.name=vllm",
            f"{R}.gpu_memory_utilization=0.6",
            f"{R}.enforce_eager=False",
            f"{R}.enable_chunked_prefill=True",
            f"{R}.max_num_batched_tokens=8192",
            f"{R}.load_format=safetensors",
            f"{R}.free_cache_engine=True",
        ]
    )
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.gpu_memory_utilization, rollout.enforce_eager, rollout.enable_chunked_prefill) == (0.6, False, True)
    assert (rollout.max_num_batched_tokens, rollout.load_format) == (8192, "safetensors")


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("gpu_memory_utilization=0.6", "no memory pool"),
        ("enforce_eager=False", "always runs eagerly"),
        ("enable_chunked_prefill=True", "one forward pass"),
        ("enable_prefix_caching=True", "no KV cache across requests"),
    ],
)
def test_hf_refuses_what_it_cannot_honour_naming_itself(hf_checked, override: str, words: str) -> None:
    message = _errors([f"{R}.name=hf", f"{R}.{override}"])
    key = override.split("=")[0]
    assert f"{R}.{key}" in message and "rollout engine 'hf'" in message and words in message


def test_hf_accepts_the_values_it_honours(hf_checked) -> None:
    cfg = load_config(
        overrides=[
            f"{R}.enforce_eager=True",
            f"{R}.enable_chunked_prefill=False",
            f"{R}.enable_prefix_caching=False",
            f"{R}.max_num_seqs=4",
            f"{R}.max_num_batched_tokens=600",
            f"{R}.max_model_len=2048",
            f"{R}.ignore_eos=True",
            "data.max_prompt_length=512",
        ]
    )
    assert cfg.actor_rollout_ref.rollout.max_num_seqs == 4


def test_hf_budget_must_hold_one_prompt(hf_checked) -> None:
    message = _errors([f"{R}.max_num_batched_tokens=100", "data.max_prompt_length=512"])
    assert f"{R}.max_num_batched_tokens" in message and "rollout.prompt_length=512" in message


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("load_format=dummy", "random weights"),
        ("gpu_memory_utilization=1.5", "must be in (0, 1]"),
        ("max_num_seqs=0", "must be >= 1"),
        ("expert_parallel_size=8", "issue #17"),
        ("data_parallel_size=2", "not built"),
        ("layered_summon=True", "always sends merged weights"),
        ("enable_rollout_routing_replay=True", "issue #17"),
    ],
)
def test_backend_independent_checks(override: str, words: str) -> None:
    message = _errors([f"{R}.name=vllm", f"{R}.{override}"])
    assert f"{R}.{override.split('=')[0]}" in message and words in message


@pytest.mark.parametrize("value", ["True", "False"])
def test_multi_stage_wake_up_takes_both_values(value: str) -> None:
    # verl reads the key nowhere and always wakes in stages, as the hybrid switch here does for every engine.
    cfg = load_config(overrides=[f"{R}.multi_stage_wake_up={value}"])
    assert cfg.actor_rollout_ref.rollout.multi_stage_wake_up is (value == "True")


def test_max_model_len_must_hold_prompt_and_response() -> None:
    message = _errors([f"{R}.max_model_len=1000", "data.max_prompt_length=512", "data.max_response_length=512"])
    assert f"{R}.max_model_len" in message and "1024" in message


def test_image_key_is_a_data_key() -> None:
    assert load_config(overrides=["data.image_key=images"]).data.image_key == "images"


# ---------------------------------------------------------------------- hf engine behaviour


def test_generation_chunks_by_rows_and_prefill_tokens() -> None:
    # prompt lengths 3, 5, 2, 4, 4 (left-padded to 5)
    lengths = [3, 5, 2, 4, 4]
    mask = torch.tensor([[0] * (5 - n) + [1] * n for n in lengths])
    # budget 10: [3,5] -> 2 x 5 = 10 fits; +2 -> 3 x 5 = 15 no; [2,4] -> 8, +4 -> 3 x 4 = 12 no; [4]
    assert generation_chunks(mask, None, 10) == [(0, 2), (2, 4), (4, 5)]
    assert generation_chunks(mask, 2, None) == [(0, 2), (2, 4), (4, 5)]
    assert generation_chunks(mask, None, None) == [(0, 5)]
    assert generation_chunks(mask[:0], 4, 10) == [(0, 0)]
    with pytest.raises(ValueError, match="max_num_batched_tokens=4: prompt row 1 has 5 tokens"):
        generation_chunks(mask, None, 4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return path, load_tokenizer(path)


def _prompts(tok, seeds=True):
    texts = ["What is 2+3?", "hi", "Count: 1 2 3", "a longer prompt with words", "x", "12 + 30 ="]
    enc = tok(texts, padding=True, padding_side="left", return_tensors="pt")
    tensors = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    if seeds:
        tensors["sample_seed"] = torch.arange(100, 100 + len(texts), dtype=torch.int64)
    return DataProto.from_dict(tensors=tensors)


def test_hf_token_budget_chunks_give_the_same_samples(tiny) -> None:
    path, tok = tiny
    prompts = _prompts(tok)
    whole = build_hf_rollout(make_rollout_config(response_length=8), path, tok).generate(prompts)
    budget = int(prompts.batch["attention_mask"].sum(dim=1).max())  # one longest prompt per chunk at most
    assert len(generation_chunks(prompts.batch["attention_mask"], None, budget)) > 1
    chunked = build_hf_rollout(make_rollout_config(response_length=8, max_num_batched_tokens=budget), path, tok)
    out = chunked.generate(prompts)
    assert torch.equal(out.batch["responses"], whole.batch["responses"])
    assert torch.allclose(out.batch["rollout_log_probs"], whole.batch["rollout_log_probs"], atol=1e-5)


def test_hf_ignore_eos_decodes_to_response_length(tiny) -> None:
    path, tok = tiny
    engine = build_hf_rollout(make_rollout_config(response_length=6, do_sample=False), path, tok)
    eos = engine.eos_token_ids[0]

    def eos_only(module, args, output):  # every position predicts EOS: each row ends at its first token
        forced = torch.zeros_like(output)
        forced[..., eos] = 50.0
        return forced

    engine.model.lm_head.register_forward_hook(eos_only)
    stopped = engine.generate(_prompts(tok, seeds=False))
    assert stopped.batch["response_mask"].sum(dim=1).tolist() == [1] * 6
    engine.config.ignore_eos = True
    going = engine.generate(_prompts(tok, seeds=False))
    assert going.batch["response_mask"].sum(dim=1).tolist() == [6] * 6


def test_hf_max_model_len_lowers_the_context_limit(tiny) -> None:
    path, tok = tiny
    prompts = _prompts(tok)
    longest = int(prompts.batch["attention_mask"].sum(dim=1).max())
    engine = build_hf_rollout(make_rollout_config(response_length=8, max_model_len=longest + 7), path, tok)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate(prompts)


def test_hf_load_format_safetensors_loads_the_checkpoint(tiny) -> None:
    path, tok = tiny
    engine = build_hf_rollout(make_rollout_config(load_format="safetensors"), path, tok)
    assert next(engine.model.parameters()).isfinite().all()
    with pytest.raises(ValueError, match="dummy"):
        build_hf_rollout(make_rollout_config(load_format="dummy"), path, tok)
