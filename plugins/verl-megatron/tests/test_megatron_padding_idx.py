"""The pad token's embedding row: HF (the reference engine) never updates it from lookups (``padding_idx``);
the megatron engine must not either, or a response that samples the pad id trains differently (found by the
main-job comparison: grad norm 1.2123 vs 1.1462)."""

from __future__ import annotations

import pytest
import torch

from verl.testing.conformance.build import build_training_engine, load_kit_config, plugin_spec
from verl.testing.conformance.inputs import make_training_batch, save_conformance_model
from verl.testing.conformance.training import training_overrides
from verl.workers.losses import make_ppo_loss

PAD = 3  # the tiny model's pad_token_id


pytestmark = pytest.mark.usefixtures("megatron_world_of_one")


def test_pad_token_in_responses_trains_like_the_reference(tmp_path):
    path = save_conformance_model(tmp_path / "model")
    data = make_training_batch()
    responses, mask = data.batch["responses"], data.batch["response_mask"].bool()
    resp_len = responses.shape[1]
    hits = torch.zeros_like(mask)
    hits[:, 1] = mask[:, 1]  # the second response token of every row that has one becomes the pad id
    assert int(hits.sum()) >= 4
    responses[hits] = PAD
    data.batch["input_ids"][:, -resp_len:][hits] = PAD
    engines = {}
    for strategy in ("reference", "megatron"):
        cfg = load_kit_config(training_overrides(path, strategy))
        engines[strategy] = build_training_engine(plugin_spec("training_engine", strategy), cfg, model=path)
    loss = make_ppo_loss(load_kit_config(training_overrides(path, "reference")).actor_rollout_ref.actor)
    before = dict(engines["reference"].iter_weights())["model.embed_tokens.weight"][PAD].clone()
    for _ in range(2):  # the first update runs at the warm-up's lr 0
        metrics = {k: e.train_batch(data, loss) for k, e in engines.items()}
        assert metrics["megatron"]["actor/grad_norm"][0] == pytest.approx(
            metrics["reference"]["actor/grad_norm"][0], rel=1e-4
        )
    got = dict(engines["megatron"].iter_weights())
    want = dict(engines["reference"].iter_weights())
    torch.testing.assert_close(got["model.embed_tokens.weight"], want["model.embed_tokens.weight"], atol=1e-5, rtol=0)
    # The tied head still trains the row (as in HF): it moved, through the LM head only.
    assert float((want["model.embed_tokens.weight"][PAD] - before).abs().max()) > 1e-6
