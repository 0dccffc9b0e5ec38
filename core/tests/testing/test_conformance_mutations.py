"""The rollout conformance suite catches known engine bugs (K06, K07, K09, weights, seeds, row order).

Each test runs one suite test on the ``hf`` engine with one deliberate bug and expects the suite's
``AssertionError``; the helper checks are also pinned on hand-written batches.
"""

from __future__ import annotations

import pytest
import torch

import verl.engines.reference.rollout as hf_rollout
from verl.engines.reference.postprocess import compute_position_ids
from verl.engines.reference.rollout import HFRolloutEngine
from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
from verl.models import load_tokenizer
from verl.protocol import DataProto
from verl.testing.conformance import (
    CONFORMANCE_PROMPTS,
    RolloutEngineTests,
    check_eos_stops,
    expected_position_ids,
    make_prompt_batch,
    make_rollout_config,
    perturb_weights,
    save_conformance_model,
)

SUITE = RolloutEngineTests()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_conformance_model(tmp_path_factory.mktemp("mutations") / "model")


@pytest.fixture(scope="module")
def tok(model_dir):
    return load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def cfg():
    return make_rollout_config()


@pytest.fixture(scope="module")
def prompts(tok, cfg):
    return make_prompt_batch(tok, CONFORMANCE_PROMPTS, n=cfg.n)


@pytest.fixture(scope="module")
def reference(model_dir):
    return ReferenceTrainingEngine(model_dir, EngineSettings(), device="cpu")


def build(engine_cls, model_dir, tok, cfg):
    return engine_cls(model_dir, tok, cfg, device="cpu")


def with_layout(out, responses=None, response_mask=None, position_ids=None):
    """Rebuild the output batch around modified tensors, keeping every other invariant consistent."""
    b = {k: out.batch[k] for k in out.batch.keys()}
    if responses is not None:
        b["responses"] = responses
    if response_mask is not None:
        b["response_mask"] = response_mask
    p = b["prompts"].shape[1]
    b["input_ids"] = torch.cat([b["prompts"], b["responses"]], 1)
    b["attention_mask"] = torch.cat([out.batch["attention_mask"][:, :p], b["response_mask"]], 1)
    b["position_ids"] = position_ids if position_ids is not None else compute_position_ids(b["attention_mask"])
    return DataProto.from_dict(tensors=b, meta_info=out.meta_info)


# ---------------------------------------------------------------- helper checks on hand-written input


def test_expected_position_ids_k07_example():
    assert expected_position_ids(torch.tensor([[0, 0, 1, 1, 1, 1, 1]])) == [[0, 0, 0, 1, 2, 3, 4]]


def _resp(rows, mask):
    return DataProto.from_dict(tensors={"responses": torch.tensor(rows), "response_mask": torch.tensor(mask)})


def test_check_eos_stops_k06_cases():
    # (b) EOS kept valid, (c) pad id is itself an EOS id: both end at their first EOS.
    ends = check_eos_stops(_resp([[5, 2, 0, 0], [5, 8, 8, 8]], [[1, 1, 0, 0], [1, 1, 0, 0]]), [2, 7, 8])
    assert ends == {2: 1, 8: 1}
    with pytest.raises(AssertionError, match="first EOS must be the last valid token"):
        check_eos_stops(_resp([[5, 8, 8, 8]], [[1, 1, 1, 1]]), [7, 8])  # padding counted as valid
    with pytest.raises(AssertionError, match="no EOS id"):
        check_eos_stops(_resp([[5, 6, 0, 0]], [[1, 1, 0, 0]]), [2])  # stopped early without EOS
    assert check_eos_stops(_resp([[5, 6, 9, 9]], [[1, 1, 1, 1]]), [2]) == {"length": 1}


def test_perturb_weights_keeps_tied_names_consistent(reference):
    perturbed = perturb_weights(reference.iter_weights(), scale=1.0)
    assert perturbed["lm_head.weight"] is perturbed["model.embed_tokens.weight"]
    original = dict(reference.model.state_dict())
    assert not torch.equal(perturbed["lm_head.weight"], original["lm_head.weight"])
    assert torch.equal(perturbed["model.norm.weight"], original["model.norm.weight"])  # 1-D: copied


def test_default_model_exercises_k09_and_eos(model_dir, tok, prompts, reference, cfg):
    """The default model makes the checks discriminating: tempered and untempered log-probs differ by far
    more than a bf16 tolerance, and greedy decoding ends a row on a secondary EOS id."""
    out = build(HFRolloutEngine, model_dir, tok, cfg).generate(prompts)
    data = DataProto.from_dict(
        tensors={k: out.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")}
    )
    mask = out.batch["response_mask"].bool()
    tempered = reference.compute_log_prob(DataProto(batch=data.batch, meta_info={"temperature": cfg.temperature}))
    plain = reference.compute_log_prob(DataProto(batch=data.batch, meta_info={"temperature": 1.0}))
    gap = (tempered.batch["old_log_probs"] - plain.batch["old_log_probs"]).abs()[mask].mean()
    assert gap > 0.5
    assert tok.convert_tokens_to_ids("?") in check_eos_stops(
        build(HFRolloutEngine, model_dir, tok, cfg).generate(
            make_prompt_batch(tok, CONFORMANCE_PROMPTS, meta_info={"validate": True})
        ),
        [tok.eos_token_id, *tok.convert_tokens_to_ids(list("?!.\n"))],
    )


# ---------------------------------------------------------------- mutated engines


@pytest.mark.parametrize("atol", [1e-5, 5e-2])
def test_k09_untempered_log_probs_fail(monkeypatch, model_dir, tok, cfg, prompts, reference, atol):
    original = hf_rollout.select_next_tokens

    def untempered(logits, params, generator):
        tokens, _ = original(logits, params, generator)
        return tokens, torch.log_softmax(logits.float(), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    monkeypatch.setattr(hf_rollout, "select_next_tokens", untempered)
    engine = build(HFRolloutEngine, model_dir, tok, cfg)
    with pytest.raises(AssertionError, match="K09"):
        SUITE.test_rollout_log_probs_match_reference_engine(engine, reference, prompts, cfg, atol, "sampled")


def test_k07_arange_position_ids_fail(model_dir, tok, cfg, prompts):
    class ArangePositions(HFRolloutEngine):
        def generate(self, data):
            out = super().generate(data)
            pos = torch.arange(out.batch["input_ids"].shape[1]).expand_as(out.batch["input_ids"]).clone()
            return with_layout(out, position_ids=pos)

    with pytest.raises(AssertionError, match="position_ids row"):
        SUITE.test_output_keys_shapes_and_padding(
            build(ArangePositions, model_dir, tok, cfg), prompts, cfg, tok.pad_token_id, "sampled"
        )


def test_k06_padding_counted_in_response_mask_fails(model_dir, tok, cfg, prompts):
    class MaskAll(HFRolloutEngine):
        def generate(self, data):
            out = super().generate(data)
            return with_layout(out, response_mask=torch.ones_like(out.batch["response_mask"]))

    with pytest.raises(AssertionError, match="K06"):
        SUITE.test_rows_stop_at_any_eos_id(build(MaskAll, model_dir, tok, cfg), prompts, tok, model_dir)


def test_k06_secondary_eos_ids_ignored_fails(model_dir, tok, cfg, prompts):
    engine = build(HFRolloutEngine, model_dir, tok, cfg)
    engine.eos_token_ids = [tok.eos_token_id]  # only the tokenizer's EOS, as a naive engine would
    with pytest.raises(AssertionError, match="K06"):
        SUITE.test_rows_stop_at_any_eos_id(engine, prompts, tok, model_dir)


def test_update_weights_ignored_fails(model_dir, tok, cfg, prompts, reference):
    class NoUpdate(HFRolloutEngine):
        def update_weights(self, weights):
            for _ in weights:
                pass

    with pytest.raises(AssertionError, match="left every greedy response unchanged"):
        SUITE.test_update_weights_changes_and_restores_outputs(
            build(NoUpdate, model_dir, tok, cfg), reference, prompts, cfg, 1e-5
        )


def test_update_weights_with_swapped_names_fails(model_dir, tok, cfg, prompts, reference):
    class SwapGateUp(HFRolloutEngine):
        """A weight loader that maps gate_proj <-> up_proj (same shape): outputs change, but wrongly."""

        def update_weights(self, weights):
            swap = {"gate_proj": "up_proj", "up_proj": "gate_proj"}

            def renamed():
                for name, tensor in weights:
                    for a, b in swap.items():
                        if a in name:
                            name = name.replace(a, b)
                            break
                    yield name, tensor

            super().update_weights(renamed())

    with pytest.raises(AssertionError, match="the reference engine with the same weights"):
        SUITE.test_update_weights_changes_and_restores_outputs(
            build(SwapGateUp, model_dir, tok, cfg), reference, prompts, cfg, 1e-5
        )


def test_rows_returned_sorted_by_prompt_length_fail(model_dir, tok, cfg, prompts):
    class SortedRows(HFRolloutEngine):
        """Batches rows by prompt length and forgets to restore the input order of the responses."""

        def generate(self, data):
            order = torch.argsort(data.batch["attention_mask"].sum(-1), stable=True)
            out = super().generate(data[order])
            fixed = dict(out.batch.items())
            fixed["prompts"] = data.batch["input_ids"]
            fixed["attention_mask"] = torch.cat([data.batch["attention_mask"], out.batch["response_mask"]], 1)
            return with_layout(DataProto.from_dict(tensors=fixed, meta_info=out.meta_info))

    with pytest.raises(AssertionError, match="reversed batch"):
        SUITE.test_greedy_response_depends_only_on_its_prompt(build(SortedRows, model_dir, tok, cfg), prompts)


def test_one_seed_per_request_fails(model_dir, tok, cfg, prompts):
    class SeedPerRequest(HFRolloutEngine):
        def generate(self, data):
            rows = [data[i : i + 1] for i in range(len(data))]
            for row in rows:
                row.meta_info = {**data.meta_info, "seed": 0}
            outs = [super(SeedPerRequest, self).generate(row) for row in rows]
            for out in outs:
                out.meta_info = {}  # per-call timings differ and concat refuses conflicting meta_info
            return DataProto.concat(outs)

    with pytest.raises(AssertionError, match="samples are identical"):
        SUITE.test_n_samples_keep_row_order_and_differ(build(SeedPerRequest, model_dir, tok, cfg), prompts, cfg)


def test_validate_ignored_fails(model_dir, tok, cfg, prompts):
    class AlwaysSample(HFRolloutEngine):
        def generate(self, data):
            meta = {k: v for k, v in data.meta_info.items() if k not in ("validate", "do_sample")}
            return super().generate(DataProto(batch=data.batch, meta_info=meta))

    with pytest.raises(AssertionError, match="two greedy"):
        SUITE.test_greedy_is_deterministic(build(AlwaysSample, model_dir, tok, cfg), prompts)


def test_left_padding_attended_fails(model_dir, tok, cfg):
    class AttendPads(HFRolloutEngine):
        def generate(self, data):
            mask = torch.ones_like(data.batch["attention_mask"])
            return super().generate(
                DataProto.from_dict(
                    tensors={"input_ids": data.batch["input_ids"], "attention_mask": mask}, meta_info=data.meta_info
                )
            )

    with pytest.raises(AssertionError, match="K07"):
        SUITE.test_extra_left_padding_changes_nothing(
            build(AttendPads, model_dir, tok, cfg), tok, CONFORMANCE_PROMPTS, 1e-5
        )


def test_kv_cache_wake_up_that_clobbers_weights_fails(model_dir, tok, cfg, prompts, reference):
    """Dropping weights in sleep is allowed (level 2: the sync refills them); losing the synced weights when
    the KV cache wakes up is not."""

    class ClobberingWake(HFRolloutEngine):
        def wake_up(self, tags=None):
            super().wake_up(tags)
            if tags is not None and "kv_cache" in tags:
                with torch.no_grad():
                    for p in self.model.parameters():
                        p.zero_()

    with pytest.raises(AssertionError, match="sleep"):
        SUITE.test_sleep_wake_up_round_trip(build(ClobberingWake, model_dir, tok, cfg), reference, prompts, True, 1e-5)
