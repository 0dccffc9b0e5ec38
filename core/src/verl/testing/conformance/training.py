"""``TrainingEngineTests``: the conformance kit every training engine plugin subclasses.

The engine under test and the oracle (core's ``reference`` engine) are both built from a config through
their plugin specs, on the same tiny model, and fed the same batch (:func:`make_training_batch`); the loss is
the trainer's own PPO loss (:func:`verl.workers.losses.make_ppo_loss`).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

from verl.testing.conformance.build import (
    build_training_engine,
    engine_overrides,
    load_kit_config,
    plugin_spec,
)
from verl.testing.conformance.checks import check_log_probs_close
from verl.testing.conformance.fixtures import KitFixtures
from verl.testing.conformance.inputs import make_training_batch

ROWS = 8  # rows of make_training_batch: one mini-batch


def training_overrides(model_path: Any, strategy: str) -> list[str]:
    """The kit's settings as overrides: ``strategy`` on ``model_path``, one 8-row mini-batch, micro-batches of 2.

    ``rollout.n=1``, ``ppo_mini_batch_size=8``, ``ppo_micro_batch_size_per_gpu=2``, log-prob micro-batches of 3
    rows (the last one short), ``loss_agg_mode=token-mean``, AdamW at ``lr=1e-3`` with 2 warm-up steps (so a
    state dict that loses the LR schedule changes the next update), no ``torch.compile`` (minutes on CPU).
    Everything else is verl's default (``use_remove_padding=true``, ``clip_grad=1.0``, ``entropy_coeff=0``).
    """
    return [
        f"actor_rollout_ref.model.path={model_path}",
        f"actor_rollout_ref.actor.strategy={strategy}",
        "actor_rollout_ref.rollout.n=1",
        f"data.train_batch_size={ROWS}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={ROWS}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=2",
        "actor_rollout_ref.actor.use_torch_compile=false",
    ]


def reference_config(model_path: Any, overrides: Iterable[str] = ()) -> Any:
    """RootConfig of core's ``reference`` engine with the kit's settings (:func:`training_overrides`) and
    ``overrides`` after them."""
    return load_kit_config([*training_overrides(model_path, "reference"), *overrides])


def _weights(engine: Any) -> dict[str, torch.Tensor]:
    return {name: t.detach().cpu().clone() for name, t in engine.iter_weights()}


def _log_probs(engine: Any, data: Any, *, entropy: bool = False) -> dict[str, torch.Tensor]:
    out = engine.compute_log_prob(data, calculate_entropy=entropy)
    return {k: out.batch[k].detach().cpu().clone() for k in out.batch.keys()}


def _serialised(state: Any) -> Any:
    # What a checkpoint does: the state is written out, so later training cannot alias it, and read back with the
    # weights-only loader, as checkpoints are (a state dict holding other objects than tensors and plain data
    # fails here: verl never unpickles a checkpoint).
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def assert_weights_moved(before: dict, after: dict, *, more_than: float) -> None:
    """Some weight changed by more than ``more_than`` (absolute): the update being compared really moved them."""
    moved = max(float((after[name].float() - before[name].float()).abs().max()) for name in before)
    assert moved > more_than, (
        f"the reference engine's weights moved by at most {moved:.3g} (<= {more_than:.3g}): the kit's update does not "
        "change the weights, so comparing them would prove nothing"
    )


def assert_weights_close(actual: dict, expected: dict, *, atol: float, what: str) -> None:
    """Same names, shapes and values within ``atol`` (rtol 0); names the worst tensor."""
    assert sorted(actual) == sorted(expected), (
        f"{what}: names differ: missing {sorted(set(expected) - set(actual))[:5]}, "
        f"extra {sorted(set(actual) - set(expected))[:5]}"
    )
    worst, where = 0.0, ""
    for name, ref in expected.items():
        got = actual[name]
        assert tuple(got.shape) == tuple(ref.shape), (
            f"{what}: {name} has shape {tuple(got.shape)}, want {tuple(ref.shape)}"
        )
        diff = float((got.float() - ref.float()).abs().max()) if ref.numel() else 0.0
        if diff > worst:
            worst, where = diff, name
    assert worst <= atol, f"{what}: max |difference| = {worst:.3g} > {atol:g} in {where}"


def _metric(metrics: dict, key: str) -> float:
    value = metrics[key]
    values = value if isinstance(value, list | tuple) else [value]
    assert len(values) == 1, f"metric {key} has {len(values)} values for one mini-batch: {values}"
    return float(values[0])


def hand_token_mean_update(model_path: Any, data: Any) -> tuple[float, float]:
    """``(pg_loss, grad_norm)`` of verl's PPO loss at ratio 1 under token-mean, computed by hand on the HF model.

    With ``old_log_probs`` equal to the current log-probs the clipped PPO loss is ``-A`` per token, so the
    full-batch token mean is ``-sum(A * mask) / sum(mask)`` (numpy), and its gradient is that of
    ``-sum(A * log p * mask) / sum(mask)``: one padded forward of ``AutoModelForCausalLM`` (float32, CPU),
    ``log_softmax(logits / T)`` at the response tokens (logit ``prompt_len - 1 + t`` scores token ``t``),
    autograd, and the global L2 norm of every parameter's gradient.
    """
    import numpy as np
    from transformers import AutoModelForCausalLM

    batch = data.batch
    mask = batch["response_mask"].float()
    adv = batch["advantages"].float()
    pg_loss = -float(np.sum(adv.numpy() * mask.numpy()) / np.sum(mask.numpy()))
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    model.train(False)
    temperature = float(data.meta_info.get("temperature", 1.0))
    resp_len = batch["responses"].shape[1]
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits
    prompt_len = batch["input_ids"].shape[1] - resp_len
    scores = torch.log_softmax(logits[:, prompt_len - 1 : -1].float() / temperature, dim=-1)
    log_p = scores.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    loss = -(adv * log_p * mask).sum() / mask.sum()
    loss.backward()
    grads = [p.grad.detach().flatten() for p in model.parameters() if p.grad is not None]
    return pg_loss, float(torch.cat(grads).norm())


class TrainingEngineTests(KitFixtures):
    """Conformance tests for a :class:`verl.engines.base.TrainingEngine`; subclass it in a ``Test*`` class.

    Usage (a plugin's ``tests/test_conformance.py``)::

        import pytest
        from verl.testing.conformance import TrainingEngineTests


        class TestMyEngineConformance(TrainingEngineTests):
            strategy = "my_engine"                    # actor_rollout_ref.actor.strategy

            @pytest.fixture(scope="class")
            @classmethod
            def engine_kwargs(cls):                    # actor_rollout_ref.actor.engine_kwargs.my_engine
                return {"model_dtype": "float32"}

    Both engines are built as the worker builds the actor: ``spec.factory(cfg, role="actor", model=<HF folder>,
    options=role_options(cfg, "actor", spec), total_training_steps=4, device=<device>, world_size=1)`` with ``spec`` from the plugin manager and ``cfg``
    from :func:`verl.config.load_config` of :func:`training_overrides` + ``engine_kwargs`` + ``config_overrides``
    (so the options are validated as at config load). A distributed engine needs a process group: start a
    world-1 group in a fixture (see ``plugins/verl-fsdp/tests/test_fsdp_conformance.py``).

    Class attribute ``strategy`` (required): the ``TrainingEngineSpec.name``.

    Fixtures (override under the same name, ``@pytest.fixture(scope="class")`` then ``@classmethod``):

    ``engine_kwargs``
        The engine's options, ``{}`` by default; nested dicts become dotted keys.
    ``config_overrides``
        More ``key=value`` overrides for the engine's config (not the reference's), ``[]``.
    ``device``
        Where the engine runs (``torch.device("cpu")``); the reference always runs on the CPU in float32.
    ``model_path`` (module scope)
        :func:`save_conformance_model` (tiny Llama, 2 layers, width 32, tied embeddings).
    ``logprob_atol``
        ``|engine - reference|`` of log-probs and entropies per valid token; default ``1e-5`` (float32; the
        reference against itself is exact, FSDP on one rank differs by about 1e-6). A bf16 engine needs
        about ``5e-2``.
    ``weight_atol``
        ``|engine - reference|`` of weights after one AdamW step (``lr=1e-3``: each weight moves by about
        ``1e-3``), default ``1e-5``; also the tolerance of the micro-batch and offload comparisons.
    ``metric_rtol``
        Relative tolerance of the update's metrics and of the hand-computed loss / gradient norm (``1e-4``).
    ``offload_engine_kwargs``
        Options that turn host offload on, merged into ``engine_kwargs`` for the offload test; default
        ``{"param_offload": True, "optimizer_offload": True}`` (verl's ``fsdp_config`` keys) when the spec's
        options class has those fields, else ``None``: the test is skipped with that reason.

    Tests:

    * the factory's engine satisfies the ``TrainingEngine`` protocol;
    * ``compute_log_prob(calculate_entropy=True)``: ``old_log_probs`` and ``entropys`` ``(8, 8)`` float32,
      equal to the reference's within ``logprob_atol`` on valid tokens;
    * two ``train_batch`` calls with the trainer's PPO loss (the first at the warm-up's lr 0, the second moving
      the weights, which is checked): every metric the reference reports (``actor/pg_loss``, ``actor/grad_norm``,
      ``actor/lr``, ...) within ``metric_rtol`` at both, and the updated weights equal to the reference's within
      ``weight_atol``;
    * gradient accumulation: micro-batches of 1 row and one micro-batch of the whole mini-batch give the same
      update (weights within ``weight_atol``, grad norm within ``metric_rtol``);
    * token-mean normalisation: with ``old_log_probs`` = the current log-probs, the reported
      ``actor/pg_loss`` equals the full-batch token mean ``-sum(A * mask) / sum(mask)`` (numpy) and
      ``actor/grad_norm`` the hand-computed gradient norm of :func:`hand_token_mean_update`, although the
      2-row micro-batches hold 15, 14, 1 and 3 tokens (a per-micro-batch mean gives other values);
    * ``state_dict`` round trip (``torch.save``, then ``torch.load(weights_only=True)``): after one step, saving,
      a second step and loading, log-probs are those after the first step exactly and the next step repeats the
      second exactly (optimizer, LR schedule and counters restored);
    * ``iter_weights()``: full (not sharded) tensors with the HF model's ``state_dict`` names and shapes,
      equal to the reference's weights;
    * ``offload()`` / ``onload()``: log-probs unchanged, weights on the host in between (on a device other
      than the CPU), and the next update equals an engine that never offloaded.

    The default kit takes about 10 s on 2 CPU cores for the reference engine.
    """

    strategy: str = ""

    # ------------------------------------------------------------------ fixtures a plugin overrides

    @pytest.fixture(scope="class")
    @classmethod
    def logprob_atol(cls) -> float:
        return 1e-5

    @pytest.fixture(scope="class")
    @classmethod
    def weight_atol(cls) -> float:
        return 1e-5

    @pytest.fixture(scope="class")
    @classmethod
    def metric_rtol(cls) -> float:
        return 1e-4

    @pytest.fixture(scope="class")
    @classmethod
    def engine_spec(cls) -> Any:
        if not cls.strategy:
            pytest.fail(f"{cls.__name__} must set the class attribute strategy (e.g. 'fsdp')", pytrace=False)
        return plugin_spec("training_engine", cls.strategy)

    @pytest.fixture(scope="class")
    @classmethod
    def offload_engine_kwargs(cls, engine_spec: Any) -> dict[str, Any] | None:
        import attrs

        fields = (
            {f.name for f in attrs.fields(engine_spec.options_cls)} if attrs.has(engine_spec.options_cls) else set()
        )
        wanted = {"param_offload": True, "optimizer_offload": True}
        return wanted if set(wanted) <= fields else None

    @pytest.fixture(scope="class")
    @classmethod
    def make_engine(
        cls, engine_spec: Any, model_path: Path, engine_kwargs: dict, config_overrides: list, device: torch.device
    ) -> Callable[..., Any]:
        """``make_engine(overrides=(), extra_kwargs=None)``: a fresh engine under test (training mutates it)."""

        def make(overrides: Iterable[str] = (), extra_kwargs: dict | None = None) -> Any:
            options = {**engine_kwargs, **(extra_kwargs or {})}
            cfg = load_kit_config(
                [
                    *training_overrides(model_path, cls.strategy),
                    *engine_overrides("training_engine", cls.strategy, options),
                    *config_overrides,
                    *overrides,
                ]
            )
            return build_training_engine(engine_spec, cfg, model=model_path, total_training_steps=4, device=device)

        return make

    @pytest.fixture(scope="class")
    @classmethod
    def make_reference(cls, model_path: Path) -> Callable[..., Any]:
        """``make_reference(overrides=())``: a fresh reference engine (float32, CPU) with the same settings."""
        spec = plugin_spec("training_engine", "reference")

        def make(overrides: Iterable[str] = ()) -> Any:
            cfg = reference_config(model_path, overrides)
            return build_training_engine(spec, cfg, model=model_path, total_training_steps=4, device="cpu")

        return make

    @pytest.fixture(scope="class")
    @classmethod
    def batch(cls) -> Any:
        return make_training_batch()

    @pytest.fixture(scope="class")
    @classmethod
    def loss_fn(cls, model_path: Path) -> Any:
        from verl.workers.losses import make_ppo_loss

        return make_ppo_loss(reference_config(model_path).actor_rollout_ref.actor)

    @pytest.fixture
    def data(self, batch: Any, device: torch.device) -> Any:
        return batch.to(device) if device.type != "cpu" else batch

    # ------------------------------------------------------------------ tests

    def test_implements_training_engine_protocol(self, make_engine: Callable) -> None:
        from verl.engines.base import TrainingEngine

        engine = make_engine()
        assert isinstance(engine, TrainingEngine), (
            f"{type(engine).__name__} lacks a TrainingEngine method (compute_log_prob, train_batch, iter_weights, "
            "state_dict, load_state_dict, save_hf, offload, onload)"
        )

    def test_log_probs_and_entropy_match_reference(
        self, make_engine: Callable, make_reference: Callable, data: Any, batch: Any, logprob_atol: float
    ) -> None:
        got = _log_probs(make_engine(), data, entropy=True)
        want = _log_probs(make_reference(), batch, entropy=True)
        mask = batch.batch["response_mask"]
        for key in ("old_log_probs", "entropys"):
            assert key in got, f"compute_log_prob(calculate_entropy=True) returned {sorted(got)}, no {key!r}"
            assert got[key].dtype == torch.float32 and got[key].shape == mask.shape, (
                f"{key}: {got[key].dtype} {tuple(got[key].shape)}, want float32 {tuple(mask.shape)}"
            )
            check_log_probs_close(got[key], want[key], mask, atol=logprob_atol, what=f"{key} vs the reference engine")

    def test_one_update_matches_reference(
        self,
        make_engine: Callable,
        make_reference: Callable,
        data: Any,
        batch: Any,
        loss_fn: Any,
        weight_atol: float,
        metric_rtol: float,
    ) -> None:
        engine, reference = make_engine(), make_reference()
        before = _weights(reference)
        # Two updates: the first runs at the warm-up's lr 0 (verl's schedule) and only fills AdamW's moments, the
        # second moves the weights; comparing after the first alone would pass for an engine that never updates.
        for step in (1, 2):
            got, want = engine.train_batch(data, loss_fn), reference.train_batch(batch, loss_fn)
            for key in want:
                assert key in got, f"train_batch metrics lack {key!r} (the reference reports it); got {sorted(got)}"
                assert _metric(got, key) == pytest.approx(_metric(want, key), rel=metric_rtol, abs=1e-7), (
                    f"update {step}, metric {key}: engine {got[key]}, reference {want[key]}"
                )
        assert_weights_moved(before, _weights(reference), more_than=10 * weight_atol)
        assert_weights_close(_weights(engine), _weights(reference), atol=weight_atol, what="weights after two updates")

    def test_gradient_accumulation_micro_batch_1_equals_full(
        self, make_engine: Callable, data: Any, loss_fn: Any, weight_atol: float, metric_rtol: float
    ) -> None:
        micro = make_engine(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"])
        full = make_engine([f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={ROWS}"])
        before = _weights(full)
        for _ in range(2):  # the first update is at the warm-up's lr 0 (see test_one_update_matches_reference)
            m_micro, m_full = micro.train_batch(data, loss_fn), full.train_batch(data, loss_fn)
            for key in ("actor/grad_norm", "actor/pg_loss"):
                assert _metric(m_micro, key) == pytest.approx(_metric(m_full, key), rel=metric_rtol, abs=1e-7), (
                    f"{key}: micro-batches of 1 row give {m_micro[key]}, one micro-batch of {ROWS} rows {m_full[key]}"
                )
        assert_weights_moved(before, _weights(full), more_than=10 * weight_atol)
        assert_weights_close(
            _weights(micro), _weights(full), atol=weight_atol, what="micro-batch 1 vs full mini-batch update"
        )

    def test_token_mean_across_unequal_micro_batches(
        self,
        make_engine: Callable,
        make_reference: Callable,
        model_path: Path,
        batch: Any,
        device: torch.device,
        loss_fn: Any,
        metric_rtol: float,
    ) -> None:
        from verl.protocol import DataProto

        on_policy = _log_probs(make_reference(), batch)["old_log_probs"] * batch.batch["response_mask"]
        tensors = {k: batch.batch[k] for k in batch.batch.keys()}
        tensors["old_log_probs"] = on_policy
        ratio_one = DataProto.from_dict(tensors=tensors, meta_info=dict(batch.meta_info))
        want_loss, want_norm = hand_token_mean_update(model_path, ratio_one)
        engine = make_engine()
        metrics = engine.train_batch(ratio_one.to(device) if device.type != "cpu" else ratio_one, loss_fn)
        assert _metric(metrics, "actor/pg_loss") == pytest.approx(want_loss, rel=metric_rtol, abs=1e-6), (
            f"actor/pg_loss {metrics['actor/pg_loss']} is not the mini-batch token mean -sum(A*mask)/sum(mask) = "
            f"{want_loss:.6f} (micro-batches of 15, 14, 1 and 3 tokens must be weighted by their token counts)"
        )
        assert _metric(metrics, "actor/grad_norm") == pytest.approx(want_norm, rel=metric_rtol), (
            f"actor/grad_norm {metrics['actor/grad_norm']} differs from the hand-computed full-batch token-mean "
            f"gradient norm {want_norm:.6g}"
        )

    def test_state_dict_round_trip(self, make_engine: Callable, data: Any, loss_fn: Any) -> None:
        engine = make_engine()
        engine.train_batch(data, loss_fn)
        saved = _serialised(engine.state_dict())
        after_first = _log_probs(engine, data)
        engine.train_batch(data, loss_fn)
        after_second = _weights(engine)
        engine.load_state_dict(saved)
        restored = _log_probs(engine, data)
        for key, value in after_first.items():
            assert torch.equal(restored[key], value), f"{key} after load_state_dict differ from those when saved"
        engine.train_batch(data, loss_fn)
        assert_weights_close(_weights(engine), after_second, atol=0.0, what="the update after load_state_dict")

    def test_iter_weights_are_full_hf_tensors(
        self, make_engine: Callable, make_reference: Callable, model_path: Path, weight_atol: float
    ) -> None:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).state_dict()
        pairs = list(make_engine().iter_weights())
        names = [name for name, _ in pairs]
        assert len(names) == len(set(names)), "iter_weights yields a name twice"
        for name, tensor in pairs:
            assert type(tensor) is torch.Tensor or type(tensor).__name__ == "Parameter", (
                f"iter_weights() yields {name} as {type(tensor).__name__}: without a layout it yields full tensors"
            )
        got = {name: tensor.detach().cpu() for name, tensor in pairs}
        expected = {name: tensor for name, tensor in hf.items()}
        assert_weights_close(got, expected, atol=float("inf"), what="iter_weights() vs the HF state_dict")
        assert_weights_close(got, _weights(make_reference()), atol=weight_atol, what="iter_weights() values")

    def test_offload_onload_round_trip(
        self,
        make_engine: Callable,
        data: Any,
        loss_fn: Any,
        offload_engine_kwargs: dict | None,
        logprob_atol: float,
        weight_atol: float,
    ) -> None:
        if offload_engine_kwargs is None:
            pytest.skip(
                f"{self.strategy}: no offload options (offload_engine_kwargs is None; the options class has no "
                "param_offload/optimizer_offload): set the fixture to the options that turn offload on"
            )
        engine, twin = make_engine(extra_kwargs=offload_engine_kwargs), make_engine()
        engine.train_batch(data, loss_fn)
        twin.train_batch(data, loss_fn)
        before = _log_probs(engine, data)
        engine.offload()
        if engine_device_type(engine) != "cpu" and offload_engine_kwargs.get("param_offload"):
            devices = {p.device.type for p in _module(engine).parameters()}
            assert devices == {"cpu"}, f"after offload() with param_offload the weights are on {sorted(devices)}"
        engine.onload()
        after = _log_probs(engine, data)
        mask = data.batch["response_mask"]
        check_log_probs_close(after["old_log_probs"], before["old_log_probs"], mask, atol=0.0, what="after onload")
        engine.train_batch(data, loss_fn)
        twin.train_batch(data, loss_fn)
        assert_weights_close(_weights(engine), _weights(twin), atol=weight_atol, what="update after offload/onload")


def engine_device_type(engine: Any) -> str:
    """The device type an engine computes on (its ``device`` attribute; ``cpu`` when it has none)."""
    device = getattr(engine, "device", "cpu")
    return getattr(device, "type", str(device).split(":")[0])


def _module(engine: Any) -> torch.nn.Module:
    for attr in ("model", "module"):
        module = getattr(engine, attr, None)
        if isinstance(module, torch.nn.Module):
            return module
    pytest.fail(f"{type(engine).__name__} exposes no nn.Module as .model or .module to check offloaded weights")
