"""The training and weight-sync kits catch deliberate engine bugs (each test: one bug, the kit's AssertionError).

The buggy engines are core's reference engine / colocated sync engine with one method patched (labelled
stand-ins for a plugin with that bug); the kit's test methods are called directly with their fixtures.
"""

from __future__ import annotations

import pytest
import torch

from verl.algorithms.loss_agg import compute_global_batch_info
from verl.testing.conformance import (
    CheckpointEngineTests,
    TrainingEngineTests,
    make_training_batch,
    reference_config,
    save_conformance_model,
)
from verl.testing.conformance.build import build_rollout_engine, build_training_engine, plugin_spec
from verl.workers.losses import make_ppo_loss

TRAIN = TrainingEngineTests()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_conformance_model(tmp_path_factory.mktemp("kit_mutations") / "model")


def reference_maker(model, patch=None):
    spec = plugin_spec("training_engine", "reference")

    def make(overrides=(), extra_kwargs=None):
        engine = build_training_engine(spec, reference_config(model, overrides), model=model, total_training_steps=4)
        if patch is not None:
            patch(engine)
        return engine

    return make


@pytest.fixture(scope="module")
def loss_fn(model):
    return make_ppo_loss(reference_config(model).actor_rollout_ref.actor)


def test_per_micro_batch_token_mean_is_caught(model, loss_fn):
    """Stand-in bug: each micro-batch normalised by its own token count instead of the mini-batch's."""

    def per_micro(engine):
        original = engine.train_batch

        def train_batch(data, fn):
            def local(micro, outputs, norm):
                return fn(micro, outputs, compute_global_batch_info(micro.batch["response_mask"], dp_size=1))

            return original(data, local)

        engine.train_batch = train_batch

    with pytest.raises(AssertionError, match="token mean"):
        TRAIN.test_token_mean_across_unequal_micro_batches(
            reference_maker(model, per_micro),
            reference_maker(model),
            model,
            make_training_batch(),
            torch.device("cpu"),
            loss_fn,
            1e-4,
        )


def test_state_dict_without_optimizer_is_caught(model, loss_fn):
    """Stand-in bug: state_dict forgets the optimizer and the LR schedule (a resume restarts AdamW)."""

    def no_optimizer(engine):
        original = engine.state_dict
        engine.state_dict = lambda: {k: v for k, v in original().items() if k not in ("optimizer", "lr_scheduler")}

    with pytest.raises(AssertionError, match="after load_state_dict"):
        TRAIN.test_state_dict_round_trip(reference_maker(model, no_optimizer), make_training_batch(), loss_fn)


def test_prefixed_iter_weights_names_are_caught(model):
    """Stand-in bug: weights yielded under a wrapper's names (``module.``), which no rollout can load."""

    def prefixed(engine):
        original = engine.iter_weights
        engine.iter_weights = lambda layout=None, **kw: ((f"module.{n}", t) for n, t in original(layout, **kw))

    with pytest.raises(AssertionError, match="names differ"):
        TRAIN.test_iter_weights_are_full_hf_tensors(
            reference_maker(model, prefixed), reference_maker(model), model, 1e-5
        )


def test_micro_batch_dependent_update_is_caught(model, loss_fn):
    """Stand-in bug: micro-batch losses summed without normalisation (the update grows with the micro count)."""

    def unnormalised(engine):
        original = engine.train_batch

        def train_batch(data, fn):
            def summed(micro, outputs, norm):
                loss, metrics = fn(micro, outputs, norm)
                return loss * len(micro), metrics

            return original(data, summed)

        engine.train_batch = train_batch

    with pytest.raises(AssertionError, match="grad_norm"):
        TRAIN.test_gradient_accumulation_micro_batch_1_equals_full(
            reference_maker(model, unnormalised), make_training_batch(), loss_fn, 1e-5, 1e-4
        )


class _SyncKit(CheckpointEngineTests):
    backend = "colocated"


def _sync_fixtures(model, tmp_path):
    from verl.models import load_tokenizer
    from verl.testing.conformance import engine_overrides, load_kit_config
    from verl.testing.conformance.checkpoint import checkpoint_overrides

    def make_config(extra_kwargs=None, overrides=()):
        return load_kit_config(
            [
                *checkpoint_overrides(model, "colocated"),
                *engine_overrides("checkpoint_engine", "colocated", extra_kwargs),
                *overrides,
            ]
        )

    tok = load_tokenizer(model)
    trainer = build_training_engine(plugin_spec("training_engine", "reference"), make_config(), model=model)
    CheckpointEngineTests._perturb(trainer, seed=0)

    def make_receiver(path):
        return build_rollout_engine(plugin_spec("rollout_engine", "hf"), make_config(), model=path, tokenizer=tok)

    return make_config, trainer, make_receiver, tok


def test_a_sync_that_drops_a_tensor_is_caught(model, tmp_path, monkeypatch):
    """Stand-in bug: the sync engine skips the second tensor of the stream (layer 0's first matrix)."""
    from verl.engines.weight_sync.colocated import ColocatedCheckpointEngine

    original = ColocatedCheckpointEngine.sync

    def dropping(self, trainer, rollout):
        class Trainer:
            model = None

            def iter_weights(self, *a, **kw):
                pairs = list(trainer.iter_weights(*a, **kw))
                return iter(pairs[:1] + pairs[2:])

        return original(self, Trainer(), rollout)

    monkeypatch.setattr(ColocatedCheckpointEngine, "sync", dropping)
    make_config, trainer, make_receiver, tok = _sync_fixtures(model, tmp_path)
    with pytest.raises(AssertionError, match="differs from the trainer's"):
        _SyncKit().test_sync_makes_the_receiver_equal_the_trainer(
            "in_process", make_config, trainer, make_receiver, model, tok
        )


def test_a_sync_that_writes_before_checking_is_caught(model, tmp_path, monkeypatch):
    """Stand-in bug: no up-front check; the receiver's shape error comes mid-stream, after some tensors landed."""
    from verl.engines.weight_sync.colocated import ColocatedCheckpointEngine

    monkeypatch.setattr(ColocatedCheckpointEngine, "_check", staticmethod(lambda trainer, rollout, layout: None))
    make_config, trainer, make_receiver, tok = _sync_fixtures(model, tmp_path)
    with pytest.raises(AssertionError, match="refused sync changed"):
        _SyncKit().test_refused_mismatch_leaves_the_receiver_untouched(
            "in_process", "names", make_config, trainer, make_receiver, tmp_path
        )


def test_an_engine_that_never_moves_its_weights_is_caught(model, loss_fn):
    """Stand-in bug: the optimizer step does nothing (the kit's first update runs at the warm-up's lr 0, so the
    comparison must look past it)."""

    def frozen(engine):
        engine.optimizer.step = lambda *args, **kwargs: None

    batch = make_training_batch()
    with pytest.raises(AssertionError, match="update 2|weights after two updates"):
        TRAIN.test_one_update_matches_reference(
            reference_maker(model, frozen), reference_maker(model), batch, batch, loss_fn, 1e-5, 1e-4
        )
