"""``RolloutEngineTests``: the conformance suite every rollout engine plugin subclasses.

The suite checks an engine against the tensor layout contract of :mod:`verl.engines.base` and
against the reference training engine (the numerical oracle), on a tiny model built from a config. The
engine is built from the plugin's spec and a loaded config, as the worker builds it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from verl.engines.base import RolloutEngine, wake_up_tagged
from verl.testing.conformance.build import (
    build_rollout_engine,
    engine_overrides,
    load_kit_config,
    plugin_spec,
)
from verl.testing.conformance.checks import (
    LOG_PROB_KEY,
    check_eos_stops,
    check_log_probs_close,
    check_output_layout,
    eos_token_ids,
)
from verl.testing.conformance.fixtures import KitFixtures
from verl.testing.conformance.inputs import (
    CONFORMANCE_PROMPTS,
    make_prompt_batch,
    perturb_weights,
)

GREEDY = {"validate": True}


def _with_meta(prompts: Any, meta: dict[str, Any]) -> Any:
    from verl.protocol import DataProto

    tensors = {key: prompts.batch[key] for key in prompts.batch.keys()}
    return DataProto.from_dict(tensors=tensors, meta_info={**prompts.meta_info, **meta})


def _generate(engine: Any, prompts: Any, **meta: Any) -> Any:
    return engine.generate(_with_meta(prompts, meta))


def _reference_log_probs(reference_engine: Any, out: Any, temperature: float) -> torch.Tensor:
    from verl.protocol import DataProto

    keys = ("input_ids", "attention_mask", "position_ids", "responses")
    data = DataProto.from_dict(
        tensors={key: out.batch[key].cpu() for key in keys}, meta_info={"temperature": temperature}
    )
    return reference_engine.compute_log_prob(data).batch["old_log_probs"]


def _assert_same_text(a: Any, b: Any, what: str) -> None:
    for key in ("responses", "response_mask"):
        same = (a.batch[key].cpu() == b.batch[key].cpu()).all(dim=1)
        rows = torch.nonzero(~same).flatten().tolist()
        assert not rows, f"{what}: {key} differ in rows {rows[:5]} of {len(same)}"


def rollout_overrides(model_path: Any, name: str) -> list[str]:
    """The suite's rollout settings as config overrides: engine ``name`` on ``model_path``.

    ``n=2, temperature=0.7, top_p=1.0, top_k=-1, do_sample=True``, prompts padded to 32 tokens
    (``data.max_prompt_length``, which ``rollout.prompt_length`` follows), ``response_length=16``
    (``data.max_response_length``), ``calculate_log_probs=True, seed=0`` and greedy ``val_kwargs``
    (``n=1, do_sample=False, temperature=0, top_p=1.0, top_k=-1``): the values of
    :func:`~verl.testing.conformance.make_rollout_config`. The temperature is not 1 so that log-probs computed
    without it fail (K09); ``top_p``/``top_k`` are off so the sampling distribution is ``softmax(logits / T)``.
    """
    rollout = "actor_rollout_ref.rollout"
    return [
        f"actor_rollout_ref.model.path={model_path}",
        f"{rollout}.name={name}",
        f"{rollout}.n=2",
        f"{rollout}.temperature=0.7",
        f"{rollout}.top_p=1.0",
        f"{rollout}.top_k=-1",
        f"{rollout}.do_sample=true",
        "data.max_prompt_length=32",
        "data.max_response_length=16",
        f"{rollout}.calculate_log_probs=true",
        f"{rollout}.seed=0",
        f"{rollout}.val_kwargs.n=1",
        f"{rollout}.val_kwargs.do_sample=false",
        f"{rollout}.val_kwargs.temperature=0",
        f"{rollout}.val_kwargs.top_p=1.0",
        f"{rollout}.val_kwargs.top_k=-1",
    ]


class RolloutEngineTests(KitFixtures):
    """Conformance tests for a :class:`verl.engines.base.RolloutEngine`; subclass it in a ``Test*`` class.

    Usage (a plugin's ``tests/test_conformance.py``)::

        import pytest
        from verl.testing.conformance import RolloutEngineTests


        class TestVllmConformance(RolloutEngineTests):
            rollout_name = "vllm"                       # actor_rollout_ref.rollout.name

            @pytest.fixture(scope="class")
            @classmethod
            def engine_kwargs(cls):                      # actor_rollout_ref.rollout.engine_kwargs.vllm
                return {"max_model_len": 256}

            @pytest.fixture(scope="class")
            @classmethod
            def config_overrides(cls):
                return ["actor_rollout_ref.rollout.dtype=bfloat16"]

            @pytest.fixture(scope="class")
            @classmethod
            def logprob_atol(cls):
                return 5e-2  # bf16 logits

    The engine is built as the worker builds it: ``spec.factory(cfg, model=model_path, tokenizer=tokenizer,
    options=role_options(cfg, "rollout", spec), device=device)``, with ``spec = get_plugin_manager().get("rollout_engine", rollout_name)`` and ``cfg`` from
    :func:`verl.config.load_config` of :func:`rollout_overrides` + ``engine_kwargs`` + ``config_overrides``, so
    the plugin's options and ``check_config`` run exactly as at config load. The engine is built once per
    class, so the fixtures it is built from must keep scope ``"class"`` or wider (pytest reports a
    ScopeMismatch otherwise). Write ``@classmethod`` under ``@pytest.fixture``: pytest >= 9.1 deprecates
    class-scoped fixtures that are instance methods (the classmethod form also works on pytest 8).

    Class attribute ``rollout_name`` (required): the ``RolloutEngineSpec.name``.

    Fixtures (override any of them in the subclass under the same name):

    ``engine_kwargs``
        The engine's options (``{}``); nested dicts become dotted keys, so an unknown option is reported
        with its full key.
    ``config_overrides``
        More ``key=value`` overrides (``[]``), e.g. ``actor_rollout_ref.rollout.dtype=bfloat16``. Keep
        ``calculate_log_probs=true``, a temperature other than 1 (else K09 goes unchecked) and ``n >= 2``.
    ``device``
        The worker's device (``torch.device("cpu")``).
    ``model_path`` (module scope)
        HF folder of the model. Default: :func:`~verl.testing.conformance.save_conformance_model` in a
        tmp dir: the tiny Llama of :mod:`verl.testing.tiny` (vocab 104, 2 layers, width 32, head_dim 8)
        with logits sharpened to std 0.75 and ``generation_config.eos_token_id = [2, '?', '!', '.',
        '\\n']``. Engines whose kernels need ``head_dim >= 32`` override it with
        ``save_conformance_model(path, hidden_size=128)``.
    ``tokenizer``
        Default ``verl.models.load_tokenizer(model_path)`` (left padding, pad token set).
    ``config`` / ``rollout_config``
        The loaded RootConfig and its ``actor_rollout_ref.rollout`` section (what the tests read ``n``,
        ``temperature`` and ``response_length`` from).
    ``prompt_texts``
        Default :data:`~verl.testing.conformance.CONFORMANCE_PROMPTS` (4 prompts of different lengths).
    ``prompts``
        ``make_prompt_batch(tokenizer, prompt_texts, n=rollout_config.n)``: left-padded ``input_ids``,
        ``attention_mask``, ``position_ids``, each prompt repeated ``n`` times with
        ``DataProto.repeat(n, interleave=True)`` as the trainer does (8 rows by default).
    ``logprob_atol``
        Absolute tolerance between the engine's ``rollout_log_probs`` and the reference training engine's
        recomputed log-probs, per valid token (``rtol = 0``). Default ``1e-5``, what the float32 ``hf``
        engine meets (observed differences are about 1.5e-6). A bf16 engine needs about ``5e-2``: the
        ``hf`` engine in bfloat16 differs by up to about 0.03 on the default model, and core runs the suite
        on it at ``5e-2``. Do not go higher: at the default temperature the K09 error (log-probs without
        the temperature) averages about 0.6 nat per token, and the suite's own tests show ``5e-2`` still
        catches it.
    ``supports_sleep``
        Default ``True``: ``sleep()`` then ``wake_up()`` must leave generation unchanged. ``False`` skips
        that test (for an engine configured without a sleep mode).
    ``reference_engine``
        :class:`verl.engines.reference.training.ReferenceTrainingEngine` on ``model_path``, float32 on CPU,
        forward-only: the oracle for log-probs.
    ``rollout_engine``
        The spec-built engine, shared by the tests (greedy comparisons are taken within one test; the weight
        test restores the original weights even when it fails); its ``close()``, when it has one, runs at
        teardown. Override it only to add more teardown.

    Tests (greedy means ``meta_info={"validate": True}``, i.e. ``val_kwargs``):

    * the engine satisfies the ``RolloutEngine`` protocol;
    * output keys, shapes ``(bs, prompt_len)``/``(bs, response_length)``/``(bs, prompt_len +
      response_length)``, dtypes (int64, log-probs float32), the input's device, and the padding rules:
      ``prompts`` = input rows, ``input_ids = [prompts | responses]``, ``attention_mask = [prompt mask |
      response_mask]``, responses right-padded with the pad id, ``position_ids = clip(cumsum(attention_mask)
      - 1, 0)`` (K07), log-probs 0 on padding (sampled and greedy calls);
    * EOS: every row ends at its first EOS (any of the tokenizer's and the generation config's ids, the EOS
      itself valid) or at ``response_length``; some row must stop at an EOS, and at a secondary EOS id when
      the model has one (K06);
    * ``n`` samples: row ``i`` answers input row ``i``; the ``n`` samples of a prompt are not all identical;
      greedy responses do not depend on row order (reversed batch -> reversed responses);
    * extra left padding changes neither greedy text nor log-probs (K07);
    * greedy is deterministic: two greedy calls and a ``do_sample=False`` call give identical responses;
    * ``rollout_log_probs`` equal the reference engine's ``compute_log_prob`` with ``meta_info
      ["temperature"]`` = the sampling temperature (K09), or 1.0 for greedy calls, within ``logprob_atol``;
    * ``update_weights`` with perturbed weights (every matrix ``+ std * N(0, 1)``, seeded, tied names
      consistent, sent as float32 CPU tensors from a generator) changes greedy text and the log-probs
      match the reference engine holding the same weights; sending the original weights back restores
      the greedy text exactly;
    * ``sleep()`` + ``wake_up()`` leaves greedy text unchanged and log-probs within ``logprob_atol``.

    The default suite takes a few seconds on CPU with the ``hf`` engine.
    """

    rollout_name: str = ""

    # ------------------------------------------------------------------ fixtures a plugin overrides

    @pytest.fixture(scope="class")
    @classmethod
    def tokenizer(cls, model_path: Any) -> Any:
        from verl.models import load_tokenizer

        return load_tokenizer(model_path)

    @pytest.fixture(scope="class")
    @classmethod
    def rollout_spec(cls) -> Any:
        if not cls.rollout_name:
            pytest.fail(f"{cls.__name__} must set the class attribute rollout_name (e.g. 'vllm')", pytrace=False)
        return plugin_spec("rollout_engine", cls.rollout_name)

    @pytest.fixture(scope="class")
    @classmethod
    def config(cls, rollout_spec: Any, model_path: Any, engine_kwargs: dict, config_overrides: list) -> Any:
        return load_kit_config(
            [
                *rollout_overrides(model_path, cls.rollout_name),
                *engine_overrides("rollout_engine", cls.rollout_name, engine_kwargs),
                *config_overrides,
            ]
        )

    @pytest.fixture(scope="class")
    @classmethod
    def rollout_config(cls, config: Any) -> Any:
        return config.actor_rollout_ref.rollout

    @pytest.fixture(scope="class")
    @classmethod
    def prompt_texts(cls) -> tuple[str, ...]:
        return CONFORMANCE_PROMPTS

    @pytest.fixture(scope="class")
    @classmethod
    def logprob_atol(cls) -> float:
        return 1e-5

    @pytest.fixture(scope="class")
    @classmethod
    def supports_sleep(cls) -> bool:
        return True

    @pytest.fixture(scope="class")
    @classmethod
    def reference_engine(cls, model_path: Any) -> Any:
        from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine

        return ReferenceTrainingEngine(model_path, EngineSettings(dtype="float32"), device="cpu")

    @pytest.fixture(scope="class")
    @classmethod
    def rollout_engine(cls, rollout_spec: Any, config: Any, model_path: Any, tokenizer: Any, device: Any) -> Any:
        engine = build_rollout_engine(rollout_spec, config, model=model_path, tokenizer=tokenizer, device=device)
        yield engine
        close = getattr(engine, "close", None)
        if callable(close):
            close()

    @pytest.fixture(scope="class")
    @classmethod
    def prompts(cls, tokenizer: Any, prompt_texts: tuple[str, ...], rollout_config: Any) -> Any:
        return make_prompt_batch(tokenizer, prompt_texts, n=int(rollout_config.n))

    @pytest.fixture(scope="class")
    @classmethod
    def pad_token_id(cls, tokenizer: Any) -> int:
        pad = tokenizer.pad_token_id
        return int(pad if pad is not None else tokenizer.eos_token_id)

    # ------------------------------------------------------------------ layout

    def test_implements_rollout_engine_protocol(self, rollout_engine: Any) -> None:
        assert isinstance(rollout_engine, RolloutEngine), (
            f"{type(rollout_engine).__name__} lacks a RolloutEngine method (generate, update_weights, sleep, wake_up)"
        )

    @pytest.mark.parametrize("mode", ["sampled", "greedy"])
    def test_output_keys_shapes_and_padding(
        self, rollout_engine: Any, prompts: Any, rollout_config: Any, pad_token_id: int, mode: str
    ) -> None:
        out = _generate(rollout_engine, prompts, **(GREEDY if mode == "greedy" else {}))
        check_output_layout(
            out, prompts, response_length=int(rollout_config.response_length), pad_token_id=pad_token_id
        )

    def test_rows_stop_at_any_eos_id(self, rollout_engine: Any, prompts: Any, tokenizer: Any, model_path: Any) -> None:
        eos = eos_token_ids(tokenizer, model_path)
        ends = check_eos_stops(_generate(rollout_engine, prompts, **GREEDY), eos)
        ends.update(check_eos_stops(_generate(rollout_engine, prompts), eos))
        stopped = {tok: count for tok, count in ends.items() if tok != "length"}
        assert stopped, (
            f"no row stopped at an EOS id {eos} in {sum(ends.values())} rows: the check is vacuous; use a "
            "model and prompts that emit EOS within response_length (the default model does)"
        )
        secondary = [i for i in eos if i != tokenizer.eos_token_id]
        if secondary:
            assert set(stopped) & set(secondary), (
                f"rows stopped only at {sorted(stopped)}, never at the generation config's other EOS ids "
                f"{secondary} (ends: {dict(ends)}); the engine must stop at every EOS id (K06)"
            )

    # ------------------------------------------------------------------ rows and samples

    def test_n_samples_keep_row_order_and_differ(self, rollout_engine: Any, prompts: Any, rollout_config: Any) -> None:
        n = int(rollout_config.n)
        if n < 2:
            pytest.skip("rollout_config.n < 2: nothing to group")
        out = _generate(rollout_engine, prompts)
        assert torch.equal(out.batch["prompts"].cpu(), prompts.batch["input_ids"].cpu()), (
            "prompts: row i of the output must be row i of the input (DataProto.repeat(n, interleave=True) order)"
        )
        responses = out.batch["responses"].cpu()
        groups = responses.view(-1, n, responses.shape[1])
        distinct = [len({tuple(r.tolist()) for r in g}) for g in groups]
        assert max(distinct) > 1, (
            f"each prompt's {n} samples are identical (distinct per group: {distinct}): sampling ignores "
            "do_sample/temperature, or reuses one seed for every request"
        )

    def test_greedy_response_depends_only_on_its_prompt(self, rollout_engine: Any, prompts: Any) -> None:
        forward = _generate(rollout_engine, prompts, **GREEDY)
        order = torch.arange(len(prompts) - 1, -1, -1)
        backward = _generate(rollout_engine, prompts[order], **GREEDY)
        assert torch.equal(backward.batch["prompts"].cpu(), prompts.batch["input_ids"][order].cpu())
        _assert_same_text(forward, backward[order], "greedy on the reversed batch, reversed back")

    def test_extra_left_padding_changes_nothing(
        self, rollout_engine: Any, tokenizer: Any, prompt_texts: tuple[str, ...], logprob_atol: float
    ) -> None:
        plain = _generate(rollout_engine, make_prompt_batch(tokenizer, prompt_texts), **GREEDY)
        padded = _generate(rollout_engine, make_prompt_batch(tokenizer, prompt_texts, extra_left_pad=3), **GREEDY)
        _assert_same_text(plain, padded, "greedy with 3 extra left-pad columns (K07)")
        check_log_probs_close(
            padded.batch[LOG_PROB_KEY],
            plain.batch[LOG_PROB_KEY],
            plain.batch["response_mask"],
            atol=logprob_atol,
            what="greedy log-probs with 3 extra left-pad columns (K07)",
        )

    def test_greedy_is_deterministic(self, rollout_engine: Any, prompts: Any) -> None:
        first = _generate(rollout_engine, prompts, **GREEDY)
        _generate(rollout_engine, prompts)  # a sampled call in between must not leak state into greedy
        second = _generate(rollout_engine, prompts, **GREEDY)
        no_sample = _generate(rollout_engine, prompts, do_sample=False)
        _assert_same_text(first, second, "two greedy (validate=True) calls")
        _assert_same_text(first, no_sample, "validate=True (val_kwargs) versus do_sample=False")

    # ------------------------------------------------------------------ numerics

    @pytest.mark.parametrize("mode", ["sampled", "greedy"])
    def test_rollout_log_probs_match_reference_engine(
        self,
        rollout_engine: Any,
        reference_engine: Any,
        prompts: Any,
        rollout_config: Any,
        logprob_atol: float,
        mode: str,
    ) -> None:
        if mode == "greedy":
            out, temperature = _generate(rollout_engine, prompts, **GREEDY), 1.0
        else:
            out, temperature = _generate(rollout_engine, prompts), float(rollout_config.temperature)
        reference = _reference_log_probs(reference_engine, out, temperature)
        check_log_probs_close(
            out.batch[LOG_PROB_KEY],
            reference,
            out.batch["response_mask"],
            atol=logprob_atol,
            what=f"{mode} rollout_log_probs vs reference compute_log_prob at temperature {temperature} (K09)",
        )

    def test_update_weights_changes_and_restores_outputs(
        self, rollout_engine: Any, reference_engine: Any, prompts: Any, rollout_config: Any, logprob_atol: float
    ) -> None:
        from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine

        original = perturb_weights(reference_engine.iter_weights(), scale=0.0)
        perturbed = perturb_weights(reference_engine.iter_weights(), scale=1.0, seed=0)
        before = _generate(rollout_engine, prompts, **GREEDY)
        try:
            rollout_engine.update_weights(iter(perturbed.items()))
            changed = _generate(rollout_engine, prompts, **GREEDY)
            assert not torch.equal(changed.batch["responses"].cpu(), before.batch["responses"].cpu()), (
                "update_weights with perturbed weights left every greedy response unchanged: the weights were "
                "not loaded into the model that generates"
            )
            sampled = _generate(rollout_engine, prompts)
            model = copy.deepcopy(reference_engine.model)
            model.load_state_dict(perturbed, strict=True)
            oracle = ReferenceTrainingEngine(model, EngineSettings(dtype="float32"), device="cpu")
            check_log_probs_close(
                sampled.batch[LOG_PROB_KEY],
                _reference_log_probs(oracle, sampled, float(rollout_config.temperature)),
                sampled.batch["response_mask"],
                atol=logprob_atol,
                what="after update_weights: rollout_log_probs vs the reference engine with the same weights",
            )
        finally:
            rollout_engine.update_weights(iter(original.items()))
        _assert_same_text(
            before, _generate(rollout_engine, prompts, **GREEDY), "after sending the original weights back"
        )

    def test_sleep_wake_up_round_trip(
        self, rollout_engine: Any, reference_engine: Any, prompts: Any, supports_sleep: bool, logprob_atol: float
    ) -> None:
        """The hybrid engine's cycle, in the trainer's order: sleep, wake the weights, sync them, wake the KV
        cache; generation afterwards equals generation before (whatever the sleep level discarded)."""
        if not supports_sleep:
            pytest.skip("supports_sleep is False for this engine")
        before = _generate(rollout_engine, prompts, **GREEDY)
        rollout_engine.sleep()
        wake_up_tagged(rollout_engine, ["weights"])
        rollout_engine.update_weights(iter(perturb_weights(reference_engine.iter_weights(), scale=0.0).items()))
        wake_up_tagged(rollout_engine, ["kv_cache"])
        after = _generate(rollout_engine, prompts, **GREEDY)
        _assert_same_text(before, after, "greedy after sleep() + wake_up(weights) + update_weights + wake_up(kv_cache)")
        check_log_probs_close(
            after.batch[LOG_PROB_KEY],
            before.batch[LOG_PROB_KEY],
            before.batch["response_mask"],
            atol=logprob_atol,
            what="greedy log-probs after a sleep / wake-up cycle",
        )
