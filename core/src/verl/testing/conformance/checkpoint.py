"""``CheckpointEngineTests``: the conformance kit every weight-sync (checkpoint) engine plugin subclasses.

A reference training engine (the sender) and an ``hf`` rollout engine holding its own copy of the weights
(the receiver) are built from a config through their specs, as the worker builds them; the engine under
test moves the trainer's weights into the receiver the way the worker drives it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

from verl.testing.conformance.build import (
    build_checkpoint_engine,
    build_rollout_engine,
    build_training_engine,
    engine_overrides,
    load_kit_config,
    plugin_spec,
)
from verl.testing.conformance.fixtures import KitFixtures
from verl.testing.conformance.inputs import (
    CONFORMANCE_PROMPTS,
    make_prompt_batch,
    perturb_weights,
    save_conformance_model,
)

MODES = ("in_process", "group")


def checkpoint_overrides(model_path: Any, backend: str) -> list[str]:
    """The kit's config: weight-sync engine ``backend``, ``hf`` rollout, reference trainer on ``model_path``.

    Greedy generation of 8 tokens (``data.max_response_length=8``, prompts padded to 32).
    """
    return [
        f"actor_rollout_ref.model.path={model_path}",
        "actor_rollout_ref.actor.strategy=reference",
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.rollout.checkpoint_engine.backend={backend}",
        "actor_rollout_ref.rollout.n=1",
        "data.max_prompt_length=32",
        "data.max_response_length=8",
        "actor_rollout_ref.actor.use_torch_compile=false",
    ]


def _state(rollout: Any) -> dict[str, torch.Tensor]:
    module = getattr(rollout, "model", None)
    if not isinstance(module, torch.nn.Module):
        pytest.fail(f"{type(rollout).__name__} has no .model to read the received weights from", pytrace=False)
    return {name: t.detach().cpu().clone() for name, t in module.state_dict().items()}


def _greedy(rollout: Any, tokenizer: Any) -> torch.Tensor:
    prompts = make_prompt_batch(tokenizer, CONFORMANCE_PROMPTS, meta_info={"validate": True})
    return rollout.generate(prompts).batch["responses"].cpu()


def _sizes(trainer: Any) -> list[int]:
    return [t.numel() * t.element_size() for _, t in trainer.iter_weights()]


class CheckpointEngineTests(KitFixtures):
    """Conformance tests for a :class:`verl.engines.base.CheckpointEngine`; subclass it in a ``Test*`` class.

    Usage (a plugin's ``tests/test_conformance.py``)::

        from verl.testing.conformance import CheckpointEngineTests


        class TestMySyncConformance(CheckpointEngineTests):
            backend = "my_sync"             # actor_rollout_ref.rollout.checkpoint_engine.backend

    Built as the worker builds them, from one config (:func:`checkpoint_overrides` + ``engine_kwargs`` +
    ``config_overrides``): the engine with ``spec.factory(cfg, options=role_options(cfg, "checkpoint", spec), platform=None)``
    (:func:`~verl.testing.conformance.build.build_checkpoint_engine`); the trainer with core's ``reference``
    training spec (``role="actor"``, CPU) and its weights perturbed (``perturb_weights``, seeded) so that
    they differ from the checkpoint; the receiver with core's ``hf`` rollout spec from the checkpoint folder
    (its own copy of the weights, so nothing is shared).

    Two ways of driving the engine, each test parametrised over them:

    ``in_process``
        ``engine.sync(trainer, rollout)``: the hybrid worker's ``update_weights`` (both in one process).
    ``group``
        For an engine with ``init_group`` (standalone/colocated placement, the worker's ``init_weight_sync``
        and ``sync_weights``): two engines from the spec join a 2-rank group on ``127.0.0.1`` (rank 0 in a
        thread, ``engine.sync(trainer, None)``; rank 1 here, ``engine.sync(None, rollout)``), then ``close()``.
        Skipped for an engine without ``init_group``.

    Class attribute ``backend`` (required): the ``CheckpointEngineSpec.name``.

    Fixtures (override under the same name, ``@pytest.fixture(scope="class")`` then ``@classmethod``):

    ``engine_kwargs``
        Options, ``checkpoint_engine.engine_kwargs.<backend>`` (``{}``).
    ``config_overrides``
        More ``key=value`` overrides (``[]``).
    ``bucket_options``
        ``bucket_options(nbytes) -> dict | None``: the options that cap one bucket at exactly ``nbytes``
        bytes. Default: ``{"bucket_bytes": nbytes}`` when the spec's options class has a ``bucket_bytes``
        field (core's engines), else ``None``, which skips the bucket test with that reason.
    ``expected_buckets``
        ``expected_buckets(sizes, cap) -> int``: the bucket count for tensors of ``sizes`` bytes (in
        ``iter_weights`` order) under ``cap``; default core's greedy planner, ``None`` for an engine that
        packs differently (the bounds still apply).
    ``model_path`` (module scope)
        :func:`save_conformance_model` (2 layers, width 32: 21 tensors, the embedding 13312 bytes).

    Tests (each in both modes):

    * the factory's object satisfies the ``CheckpointEngine`` protocol;
    * sync: the receiver's state dict equals the trainer's ``iter_weights()`` exactly (float32 both sides)
      and its greedy text equals a rollout generating from the trainer's own module; a second sync after
      another perturbation follows it; the metrics report ``tensors`` (pairs the trainer yielded) and
      ``bytes`` (their ``numel * element_size``) on the receiving side;
    * bucket boundaries: a cap smaller than the largest tensor, and one that splits the weights into
      buckets of unequal counts, give the same received weights; where ``buckets`` is reported (non-zero),
      ``bytes``/``tensors`` are the whole set, ``buckets <= tensors`` and at least one per tensor larger than
      the cap plus ``ceil(other bytes / cap)``, and, with the default ``expected_buckets`` (core's greedy
      planner), exactly :func:`verl.engines.weight_sync.plan_buckets`'s count (``None`` drops that check);
    * refused mismatches: a receiver whose model lacks a layer (unknown names) or has another width (other
      shapes) makes the sync raise ``KeyError``/``ValueError`` naming an offending weight, and the receiver's
      weights stay exactly as they were (the sender side, in ``group`` mode, still finishes).

    About 5 s on 2 CPU cores per engine.
    """

    backend: str = ""

    # ------------------------------------------------------------------ fixtures

    @pytest.fixture(scope="class")
    @classmethod
    def engine_spec(cls) -> Any:
        if not cls.backend:
            pytest.fail(f"{cls.__name__} must set the class attribute backend (e.g. 'broadcast')", pytrace=False)
        return plugin_spec("checkpoint_engine", cls.backend)

    @pytest.fixture(scope="class")
    @classmethod
    def bucket_options(cls, engine_spec: Any) -> Callable[[int], dict | None]:
        import attrs

        options_cls = engine_spec.options_cls
        has = options_cls is not None and attrs.has(options_cls) and "bucket_bytes" in attrs.fields_dict(options_cls)
        return (lambda nbytes: {"bucket_bytes": int(nbytes)}) if has else (lambda nbytes: None)

    @pytest.fixture(scope="class")
    @classmethod
    def expected_buckets(cls) -> Callable[[list[int], int], int] | None:
        from verl.engines.weight_sync import plan_buckets

        return lambda sizes, capacity: len(plan_buckets(sizes, capacity))

    @pytest.fixture(scope="class")
    @classmethod
    def make_config(cls, engine_spec: Any, model_path: Path, engine_kwargs: dict, config_overrides: list) -> Callable:
        def make(extra_kwargs: dict | None = None, overrides: Iterable[str] = ()) -> Any:
            options = {**engine_kwargs, **(extra_kwargs or {})}
            return load_kit_config(
                [
                    *checkpoint_overrides(model_path, cls.backend),
                    *engine_overrides("checkpoint_engine", cls.backend, options),
                    *config_overrides,
                    *overrides,
                ]
            )

        return make

    @pytest.fixture(scope="class")
    @classmethod
    def tokenizer(cls, model_path: Path) -> Any:
        from verl.models import load_tokenizer

        return load_tokenizer(model_path)

    @pytest.fixture(autouse=True)
    def _skip_group_mode_without_init_group(self, request: pytest.FixtureRequest, engine_spec: Any) -> None:
        callspec = getattr(request.node, "callspec", None)
        if callspec is not None and callspec.params.get("mode") == "group":
            engine = build_checkpoint_engine(engine_spec, request.getfixturevalue("make_config")())
            if not callable(getattr(engine, "init_group", None)):
                pytest.skip(f"{self.backend}: no init_group, so there is no sync group to test (in_process only)")

    @pytest.fixture
    def trainer(self, make_config: Callable, model_path: Path) -> Any:
        cfg = make_config()
        engine = build_training_engine(plugin_spec("training_engine", "reference"), cfg, model=model_path)
        self._perturb(engine, seed=0)
        return engine

    @pytest.fixture
    def make_receiver(self, make_config: Callable, tokenizer: Any) -> Callable[[Any], Any]:
        def make(model: Any) -> Any:
            return build_rollout_engine(
                plugin_spec("rollout_engine", "hf"), make_config(), model=model, tokenizer=tokenizer, device="cpu"
            )

        return make

    @staticmethod
    def _perturb(trainer: Any, seed: int) -> None:
        perturbed = perturb_weights(trainer.iter_weights(), scale=0.5, seed=seed)
        trainer.model.load_state_dict(perturbed, strict=True)

    def run_sync(
        self, mode: str, make_config: Callable, trainer: Any, rollout: Any, extra_kwargs: dict | None = None
    ) -> dict:
        """Drive the engine in ``mode``; returns ``{"receiver": metrics, "sender": metrics or None}``.

        Raises whatever the receiving side raises (after the sender side finished, in ``group`` mode).
        """
        spec = plugin_spec("checkpoint_engine", self.backend)
        cfg = make_config(extra_kwargs)
        if mode == "in_process":
            return {"receiver": build_checkpoint_engine(spec, cfg).sync(trainer, rollout), "sender": None}
        sender, receiver = build_checkpoint_engine(spec, cfg), build_checkpoint_engine(spec, cfg)
        from verl.engines.weight_sync import free_port

        port = free_port()
        outcome: dict[str, Any] = {}

        def send() -> None:
            try:
                sender.init_group(master_addr="127.0.0.1", master_port=port, rank=0, world_size=2)
                outcome["sender"] = sender.sync(trainer, None)
            except BaseException as exc:  # re-raised in the test's thread
                outcome["error"] = exc

        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        try:
            receiver.init_group(master_addr="127.0.0.1", master_port=port, rank=1, world_size=2)
            try:
                received = receiver.sync(None, rollout)
            finally:
                thread.join(timeout=120)
            assert not thread.is_alive(), "the sending rank did not finish within 120 s after the receiver returned"
            if "error" in outcome:
                raise AssertionError(f"the sending rank failed: {outcome['error']!r}") from outcome["error"]
            return {"receiver": received, "sender": outcome.get("sender")}
        finally:
            receiver.close()
            sender.close()

    # ------------------------------------------------------------------ tests

    def test_implements_checkpoint_engine_protocol(self, engine_spec: Any, make_config: Callable) -> None:
        from verl.engines.base import CheckpointEngine

        engine = build_checkpoint_engine(engine_spec, make_config())
        assert isinstance(engine, CheckpointEngine), f"{type(engine).__name__} has no sync(trainer, rollout)"

    @pytest.mark.parametrize("mode", MODES)
    def test_sync_makes_the_receiver_equal_the_trainer(
        self, mode: str, make_config: Callable, trainer: Any, make_receiver: Callable, model_path: Path, tokenizer: Any
    ) -> None:
        receiver = make_receiver(model_path)
        oracle = make_receiver(trainer.model)  # generates from the trainer's own module
        assert _state(receiver) != {}, "empty receiver"
        assert not torch.equal(_greedy(receiver, tokenizer), _greedy(oracle, tokenizer)), (
            "the perturbed trainer and the checkpoint generate the same text: the check would be vacuous"
        )
        for round_ in range(2):
            if round_:
                self._perturb(trainer, seed=1)
            metrics = self.run_sync(mode, make_config, trainer, receiver)["receiver"]
            sent = {name: t.detach().cpu() for name, t in trainer.iter_weights()}
            got = _state(receiver)
            for name, tensor in sent.items():
                assert name in got, f"receiver has no {name}"
                assert torch.equal(got[name], tensor), (
                    f"sync {round_ + 1}: receiver's {name} differs from the trainer's"
                )
            assert torch.equal(_greedy(receiver, tokenizer), _greedy(oracle, tokenizer)), (
                f"sync {round_ + 1}: greedy text of the receiver differs from the trainer's module"
            )
            assert metrics.get("tensors") == len(sent), f"metrics tensors={metrics.get('tensors')}, sent {len(sent)}"
            nbytes = sum(t.numel() * t.element_size() for t in sent.values())
            assert metrics.get("bytes") == nbytes, f"metrics bytes={metrics.get('bytes')}, sent {nbytes}"

    @pytest.mark.parametrize("mode", MODES)
    @pytest.mark.parametrize("split", ["below_largest_tensor", "uneven"])
    def test_bucket_boundaries(
        self,
        mode: str,
        split: str,
        make_config: Callable,
        trainer: Any,
        make_receiver: Callable,
        model_path: Path,
        bucket_options: Callable,
        expected_buckets: Callable | None,
    ) -> None:
        from verl.engines.weight_sync import plan_buckets

        sizes = _sizes(trainer)
        if split == "below_largest_tensor":
            capacity = max(64, (max(sizes) // 2) // 64 * 64)
        else:
            capacity = (sum(sizes) // 3) // 64 * 64 + 64
        counts = [len(b) for b in plan_buckets(sizes, capacity)]
        assert len(counts) >= 2 and (split != "uneven" or len(set(counts)) > 1), f"cap {capacity}: plan {counts}"
        options = bucket_options(capacity)
        if options is None:
            pytest.skip(f"{self.backend}: no byte-exact bucket option (override the bucket_options fixture)")
        receiver = make_receiver(model_path)
        result = self.run_sync(mode, make_config, trainer, receiver, extra_kwargs=options)
        got = _state(receiver)
        for name, tensor in trainer.iter_weights():
            assert torch.equal(got[name], tensor.detach().cpu()), f"cap {capacity} bytes: receiver's {name} differs"
        for side in ("receiver", "sender"):
            metrics = result[side]
            if not metrics or not metrics.get("buckets"):
                continue  # this engine/mode does not bucket (e.g. a direct hand-over in one process)
            buckets, nbytes, tensors = int(metrics["buckets"]), int(metrics["bytes"]), int(metrics["tensors"])
            assert nbytes == sum(sizes) and tensors == len(sizes), f"{side}: {metrics}"
            # A bucket exceeds the cap only holding one tensor larger than it; the rest fill buckets of <= cap.
            oversized = [s for s in sizes if s > capacity]
            lower = len(oversized) + math.ceil((nbytes - sum(oversized)) / capacity)
            assert lower <= buckets <= tensors, (
                f"{side}: {buckets} buckets for {tensors} tensors of {nbytes} bytes under a {capacity}-byte cap "
                f"({len(oversized)} of them larger than the cap): at least {lower} expected"
            )
            if expected_buckets is not None:
                want = expected_buckets(sizes, capacity)
                assert buckets == want, f"{side}: {buckets} buckets, the planner gives {want} under {capacity} bytes"

    @pytest.mark.parametrize("mode", MODES)
    @pytest.mark.parametrize("mismatch", ["names", "shapes"])
    def test_refused_mismatch_leaves_the_receiver_untouched(
        self,
        mode: str,
        mismatch: str,
        make_config: Callable,
        trainer: Any,
        make_receiver: Callable,
        tmp_path: Path,
    ) -> None:
        if mismatch == "names":  # the trainer sends model.layers.1.*, which a 1-layer receiver lacks
            other, needle = save_conformance_model(tmp_path / "one_layer", num_layers=1), "model.layers.1."
        else:  # every matrix has another shape at width 48
            other, needle = save_conformance_model(tmp_path / "wider", hidden_size=48), "shape"
        receiver = make_receiver(other)
        before = _state(receiver)
        with pytest.raises((KeyError, ValueError)) as err:
            self.run_sync(mode, make_config, trainer, receiver)
        assert needle in str(err.value), f"the refusal does not name the mismatch ({needle!r}): {err.value}"
        after = _state(receiver)
        changed = [name for name, t in before.items() if not torch.equal(after[name], t)]
        assert not changed, f"a refused sync changed the receiver's {changed[:5]}"
