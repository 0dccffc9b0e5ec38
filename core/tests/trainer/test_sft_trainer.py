"""The SFT trainer on a tiny model: loss and gradients against an independent NLL, packed == padded,
exact resume, val/loss, and the output folder loading as the RL actor.

Oracle of the loss: the HF model's own forward on the padded batch, ``log_softmax`` of the logits at
position ``t`` gathered at token ``t + 1``, summed over the loss-mask tokens and divided by their count
(verl ``sft_loss``: token mean over the whole mini-batch).
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from verl.config.sft_loader import load_sft_config
from verl.data.sft_dataset import collate_sft, tokenize_conversation
from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
from verl.testing.tiny import make_tiny_tokenizer, save_tiny_model
from verl.trainer.sft_trainer import SFTTrainer
from verl.workers.losses import make_sft_loss


def _conversation(rng: random.Random, turns: int) -> list[dict]:
    msgs = []
    for _ in range(turns):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        msgs += [{"role": "user", "content": f"{a}+{b}="}, {"role": "assistant", "content": str(a + b)}]
    return msgs


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    model = save_tiny_model(root / "model")
    rng = random.Random(0)
    for name, n in (("train", 12), ("val", 5)):
        rows = [{"messages": _conversation(rng, 1 + i % 3)} for i in range(n)]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root, model


def _independent_loss(model, batch, loss_masks):
    """Token-mean NLL of the loss-mask tokens, straight from the HF forward on the padded batch."""
    ids, attn = batch["input_ids"], batch["attention_mask"]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=batch["position_ids"]).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    mask = loss_masks[:, 1:].float()
    return -(logp * mask).sum() / mask.sum()


@pytest.mark.parametrize(("packed", "micro"), [(False, 5), (True, 2), (False, 1)])
def test_loss_and_grads_match_the_independent_nll(assets, packed, micro):
    root, model_dir = assets
    tok = make_tiny_tokenizer()
    rng = random.Random(1)
    items = []
    for turns in (1, 3, 2, 1, 2):  # ragged lengths: padding and packing both matter
        ids, mask = tokenize_conversation(tok, _conversation(rng, turns))
        items.append({"input_ids": ids, "loss_mask": mask})
    data = collate_sft(items, tok.pad_token_id)
    loss_masks = torch.zeros_like(data.batch["input_ids"])
    for r, it in enumerate(items):
        loss_masks[r, : len(it["loss_mask"])] = torch.tensor(it["loss_mask"])

    settings = EngineSettings(mini_batch_size=5, micro_batch_size=micro, use_remove_padding=packed)
    engine = ReferenceTrainingEngine(
        str(model_dir), settings, optim=load_sft_config(None, ["data.train_files=x"]).optim
    )
    assert engine._packed is packed
    loss_fn = make_sft_loss()
    norm = engine._batch_norm(data)
    assert norm["batch_num_tokens"] == int(loss_masks[:, 1:].sum())
    total = 0.0
    for rows in engine._plan(data, use_dynamic=False, micro=micro, max_tokens=0, packed=packed):
        micro_batch = data[rows]
        loss, metrics = loss_fn(micro_batch, engine.forward_micro_batch(micro_batch.batch, 1.0), norm)
        loss.backward()
        total += metrics["train/loss"]
    grads = {n: p.grad.clone() for n, p in engine.model.named_parameters()}

    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    want = _independent_loss(ref, data.batch, loss_masks)
    want.backward()
    assert total == pytest.approx(float(want.detach()), rel=1e-5)
    for name, p in ref.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)


def _config(root, model, run, *extra):
    return load_sft_config(
        None,
        [
            f"data.train_files={root / 'train.jsonl'}",
            f"data.val_files={root / 'val.jsonl'}",
            f"model.path={model}",
            "model.enable_gradient_checkpointing=false",
            "data.train_batch_size=4",
            "data.micro_batch_size_per_gpu=2",
            "data.max_length=128",
            "data.max_token_len_per_gpu=200",
            "trainer.total_training_steps=5",  # 3 steps per epoch: the run crosses an epoch
            "trainer.save_freq=2",
            "trainer.test_freq=2",
            "trainer.logger=[file]",
            f"trainer.default_local_dir={run}",
            "optim.lr=1e-2",
            "optim.lr_scheduler_type=cosine",
            "optim.lr_warmup_steps=1",
            *extra,
        ],
    )


class _Stop(Exception):
    pass


def _rows(run):
    """metrics.jsonl without the wall-clock timings (the only values two equal runs may differ in)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("timing_s/")} for r in rows]


def test_resume_is_exact_and_the_output_loads_as_the_rl_actor(assets, tmp_path):
    root, model = assets
    whole = SFTTrainer(_config(root, model, tmp_path / "a"))
    whole.fit()
    rows = _rows(tmp_path / "a")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [("val/loss" in r) for r in rows] == [False, True, False, True, True]  # test_freq=2 and the last step
    for key in ("train/loss", "train/grad_norm", "train/lr", "train/global_tokens"):
        assert all(key in r for r in rows), key
    assert rows[0]["train/lr"] == 0.0 and rows[1]["train/lr"] == pytest.approx(1e-2)  # warmup 1, then cosine
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]

    def stop_at_2(step, metrics):
        if step == 2:
            raise _Stop

    with pytest.raises(_Stop):
        SFTTrainer(_config(root, model, tmp_path / "b")).fit(on_step=stop_at_2)
    resumed = SFTTrainer(_config(root, model, tmp_path / "b"))
    resumed.fit()
    assert _rows(tmp_path / "b") == rows  # same batches, same losses, lr, grad norms and val/loss
    for (name, a), (_, b) in zip(
        whole.engine.model.state_dict().items(), resumed.engine.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name

    # val/loss of the last step, recomputed from the written folder: mean over val batches of the token mean.
    from transformers import AutoModelForCausalLM

    final = tmp_path / "a" / "final_hf"
    hf = AutoModelForCausalLM.from_pretrained(str(final), dtype=torch.float32)
    val = whole.val_dataset
    per_batch = []
    with torch.no_grad():
        for start in range(0, len(val), 4):
            items = [val[i] for i in range(start, min(start + 4, len(val)))]
            batch = collate_sft(items, whole.pad_id).batch
            masks = torch.zeros_like(batch["input_ids"])
            for r, it in enumerate(items):
                masks[r, : len(it["loss_mask"])] = torch.tensor(it["loss_mask"])
            per_batch.append(float(_independent_loss(hf, batch, masks)))
    assert rows[-1]["val/loss"] == pytest.approx(sum(per_batch) / len(per_batch), rel=1e-5)

    # `verl export` reads an SFT checkpoint as an RL one: the last checkpoint's weights are final_hf's.
    from safetensors.torch import load_file

    from verl.cli.main import main as verl_main

    assert verl_main(["export", str(tmp_path / "a" / "global_step_5"), str(tmp_path / "exported")]) == 0
    exported = load_file(str(tmp_path / "exported" / "model.safetensors"))
    for name, tensor in load_file(str(final / "model.safetensors")).items():
        assert torch.equal(exported[name], tensor), name

    # The folder is an RL run's actor model: config accepts it, the actor engine loads the trained weights.
    from verl.config import load_config
    from verl.engines.reference.builders import build_reference_training_engine
    from verl.models.tokenizer import load_tokenizer

    rl = load_config(overrides=[f"actor_rollout_ref.model.path={final}"])
    actor = build_reference_training_engine(rl, role="actor", model=rl.actor_rollout_ref.model.path, options=None)
    for name, tensor in whole.engine.model.state_dict().items():
        assert torch.equal(actor.model.state_dict()[name], tensor), name
    assert load_tokenizer(final, require_chat_template=True).chat_template == make_tiny_tokenizer().chat_template

    # A fresh run in the same folder keeps the earlier run's files: renamed aside, nothing overwritten.
    earlier = (tmp_path / "a" / "metrics.jsonl").read_text()
    fresh = ("trainer.resume_mode=disable", "trainer.total_training_steps=1")
    SFTTrainer(_config(root, model, tmp_path / "a", *fresh)).fit()
    aside = list((tmp_path / "a").glob("metrics.*.jsonl"))
    assert len(aside) == 1 and aside[0].read_text() == earlier
    assert [r["step"] for r in _rows(tmp_path / "a")] == [1]
    assert len(list((tmp_path / "a").glob("final_hf.*"))) == 1
    assert len(list((tmp_path / "a").glob("global_step_4.*"))) == 1  # the earlier checkpoints, not rotated out
