"""CriticWorker (values, update, checkpoint round trip) and RewardModelWorker (scores, chat-template switch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.config import load_config
from verl.controller import ClassWithInitArgs, LocalWorkerGroup
from verl.protocol import DataProto
from verl.testing.tiny import make_tiny_tokenizer, save_tiny_model
from verl.trainer.roles import combine_scores
from verl.workers.critic import CriticWorker
from verl.workers.reward_model import RewardModelWorker

RESP_LEN = 4


def _batch(tok, prompts: list[str], responses: list[str]) -> DataProto:
    """Left-padded chat prompts (width 40) and right-padded responses (width RESP_LEN), as the rollout makes them."""
    bs = len(prompts)
    messages = [[{"role": "user", "content": p}] for p in prompts]
    p_ids = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True) for m in messages]
    p_ids = [list(x["input_ids"]) if hasattr(x, "keys") else list(x) for x in p_ids]  # BatchEncoding or list
    width = 40
    prompt = torch.full((bs, width), tok.pad_token_id)
    pmask = torch.zeros(bs, width, dtype=torch.long)
    resp = torch.full((bs, RESP_LEN), tok.pad_token_id)
    rmask = torch.zeros(bs, RESP_LEN, dtype=torch.long)
    for i in range(bs):
        prompt[i, width - len(p_ids[i]) :] = torch.tensor(p_ids[i])
        pmask[i, width - len(p_ids[i]) :] = 1
        r = tok(responses[i], add_special_tokens=False)["input_ids"][: RESP_LEN - 1] + [tok.eos_token_id]
        r = r if responses[i] else []
        resp[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        rmask[i, : len(r)] = 1
    mask = torch.cat([pmask, rmask], dim=1)
    return DataProto.from_dict(
        tensors={
            "responses": resp,
            "input_ids": torch.cat([prompt, resp], dim=1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": rmask,
        },
        non_tensors={"raw_prompt": np.array(messages + [None], dtype=object)[:-1]},
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "m")


def test_critic_worker_update_metrics_and_checkpoint_round_trip(tiny, tmp_path):
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={tiny}",
            "algorithm.adv_estimator=gae",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "critic.optim.lr=0.01",
            "trainer.device=cpu",
        ]
    )
    wg = LocalWorkerGroup(ClassWithInitArgs(CriticWorker, cfg))
    wg.init_model(3)
    data = _batch(make_tiny_tokenizer(), ["a b", "hello", "x", "yy"], ["12", "ok!", "", "7"])
    before = wg.compute_values(data).batch["values"]
    assert before.shape == (4, RESP_LEN) and before[2].abs().sum() == 0
    data.batch["values"] = before
    data.batch["returns"] = torch.ones(4, RESP_LEN) * data.batch["response_mask"]
    metrics = wg.update_critic(data).meta_info["metrics"]
    for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr"):
        assert key in metrics and all(np.isfinite(metrics[key])), key
    assert len(metrics["critic/grad_norm"]) == 2  # 4 rows, mini-batch 2 prompts x n=1: two optimizer steps
    after = wg.compute_values(data).batch["values"]
    mask = data.batch["response_mask"].bool()
    # Trained towards returns of 1: the values moved up.
    assert float((after - before)[mask].mean()) > 0
    wg.save_checkpoint(str(tmp_path / "critic"))
    fresh = LocalWorkerGroup(ClassWithInitArgs(CriticWorker, cfg))
    fresh.init_model(3)
    assert not torch.equal(fresh.compute_values(data).batch["values"], after)
    fresh.load_checkpoint(str(tmp_path / "critic"))
    assert torch.equal(fresh.compute_values(data).batch["values"], after)
    with pytest.raises(Exception, match="critic checkpoint"):
        fresh.load_checkpoint(str(tmp_path / "nothing"))


def _save_rm(path, tokenizer, seed: int = 3):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForSequenceClassification(cfg).float().eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


def _hf_score(model, ids: list[int]) -> float:
    """HF's own pooling on one unpadded row: the logit at the last token."""
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids])).logits[0, 0])


def _rm_group(tiny, rm_path):
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={tiny}",
            "reward_model.enable=true",
            f"reward_model.model.path={rm_path}",
            "reward_model.micro_batch_size_per_gpu=2",
            "trainer.device=cpu",
        ]
    )
    wg = LocalWorkerGroup(ClassWithInitArgs(RewardModelWorker, cfg))
    return wg, wg.init_model()


def test_rm_with_the_policy_tokenizer_scores_the_token_ids_at_the_last_response_token(tiny, tmp_path):
    tok = make_tiny_tokenizer()
    model = _save_rm(tmp_path / "rm", tok)
    wg, info = _rm_group(tiny, tmp_path / "rm")
    assert info[0]["switch_chat_template"] is False
    data = _batch(tok, ["a b", "hello", "x"], ["12", "ok!", ""])
    rm = wg.compute_rm_score(data).batch["rm_scores"]
    assert rm.shape == (3, RESP_LEN) and rm.dtype == torch.float32
    for i, n in enumerate(data.batch["response_mask"].sum(-1).tolist()):
        if n == 0:
            assert rm[i].abs().sum() == 0  # empty response: no score (verl slices it away)
            continue
        ids = data.batch["input_ids"][i][data.batch["attention_mask"][i].bool()].tolist()
        assert float(rm[i, n - 1]) == pytest.approx(_hf_score(model, ids), abs=1e-5)
        assert rm[i].count_nonzero() == 1


def test_rm_with_its_own_chat_template_re_renders_prompt_and_response(tiny, tmp_path):
    policy = make_tiny_tokenizer()
    rm_tok = make_tiny_tokenizer()
    rm_tok.chat_template = (
        "{% for m in messages %}{{ '[' + m['role'] + '] ' + m['content'] + '\n' }}{% endfor %}"  # a different format
    )
    model = _save_rm(tmp_path / "rm2", rm_tok)
    wg, info = _rm_group(tiny, tmp_path / "rm2")
    assert info[0]["switch_chat_template"] is True
    data = _batch(policy, ["a b", "hello"], ["12", "ok!"])
    rm = wg.compute_rm_score(data).batch["rm_scores"]
    for i, (prompt, response) in enumerate((("a b", "12"), ("hello", "ok!"))):
        text = f"[user] {prompt}\n[assistant] {response}\n"  # the response's EOS is dropped before re-rendering
        expected = _hf_score(model, rm_tok(text, add_special_tokens=False)["input_ids"])
        n = int(data.batch["response_mask"][i].sum())
        assert float(rm[i, n - 1]) == pytest.approx(expected, abs=1e-5)
    del data.non_tensor_batch["raw_prompt"]
    with pytest.raises(Exception, match="return_raw_chat"):
        wg.compute_rm_score(data)


def test_combine_scores_rules():
    rule = torch.tensor([[0.0, 1.0], [0.5, 0.0]])
    rm = torch.tensor([[0.0, -2.0], [3.0, 0.0]])
    assert torch.equal(combine_scores(rule, rm, "replace"), rm)
    assert torch.equal(combine_scores(None, rm, "replace"), rm)
    assert torch.equal(combine_scores(rule, rm, "sum"), torch.tensor([[0.0, -1.0], [3.5, 0.0]]))
    with pytest.raises(ValueError, match="combine"):
        combine_scores(rule, rm, "max")
    with pytest.raises(ValueError, match="rule scores"):
        combine_scores(None, rm, "sum")
    with pytest.raises(ValueError, match="differ in shape"):
        combine_scores(rule, rm[:, :1], "sum")
