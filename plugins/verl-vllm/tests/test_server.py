"""``VLLMRolloutServer`` (``rollout.mode=async``): concurrent requests on the engine's own vLLM scheduler.

One engine on the suite's tiny Llama (hidden 128, float32) serves the module. Expectations come from the sync
path of the same engine for seeded samples (the contract: a request with a row's ``sample_seed`` samples that
row), and from core's ``hf`` engine for greedy text, log-probs, stop tokens, the context cap and weight updates.
The late-join and in-flight tests hold the server's step thread at a chosen scheduler step (a wrapper around
``llm_engine.step``), so "a request arrives while another decodes" does not depend on timing.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import threading
from types import SimpleNamespace

import pytest
import torch

from verl.testing.conformance import make_prompt_batch, make_rollout_config, perturb_weights, save_conformance_model

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed")

DEVICE = os.environ.get("VERL_VLLM_TEST_DEVICE", "cpu")
TEXTS = ("What is 2+3?", "hi", "Count: 1 2 3", "a longer prompt with some words")
OPTIONS = {"max_model_len": 256, "max_num_batched_tokens": 256}
GREEDY = {"temperature": 0.0, "logprobs": True}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_conformance_model(tmp_path_factory.mktemp("vllm_server") / "model", hidden_size=128)


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from verl.models import load_tokenizer

    return load_tokenizer(model_path)


@pytest.fixture(scope="module")
def config():
    return make_rollout_config(n=1, dtype="float32")


@pytest.fixture(scope="module")
def engine(model_path, tokenizer, config):
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed")
    from verl_vllm.engine import VLLMRolloutEngine
    from verl_vllm.options import VLLMRolloutOptions

    eng = VLLMRolloutEngine(model_path, tokenizer, config, device=DEVICE, options=VLLMRolloutOptions(**OPTIONS))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server(engine):
    return engine.server()


@pytest.fixture(scope="module")
def hf(model_path, tokenizer, config):
    from verl.engines.reference.rollout import HFRolloutEngine

    return HFRolloutEngine(model_path, tokenizer, config, device="cpu")


def _meta(batch, **meta):
    from verl.protocol import DataProto

    return DataProto.from_dict(tensors={k: batch.batch[k] for k in batch.batch.keys()}, meta_info=meta)


def _prompts(batch) -> list[list[int]]:
    return [
        row[mask.bool()].tolist()
        for row, mask in zip(batch.batch["input_ids"], batch.batch["attention_mask"], strict=True)
    ]


def _rows(out) -> list[tuple[list[int], list[float]]]:
    """(tokens, log-probs) of every row of a rollout batch, padding cut by ``response_mask``."""
    rows = []
    for resp, mask, lp in zip(
        out.batch["responses"], out.batch["response_mask"], out.batch["rollout_log_probs"], strict=True
    ):
        n = int(mask.sum())
        rows.append((resp[:n].tolist(), lp[:n].tolist()))
    return rows


@pytest.fixture(scope="module")
def hf_greedy(hf, tokenizer):
    """Core's ``hf`` engine's greedy answers (64 tokens at most) to ``TEXTS``: the reference for greedy requests."""
    return _rows(hf.generate(_meta(make_prompt_batch(tokenizer, TEXTS), validate=True, response_length=64)))


def _expected_reason(tokens, limit, eos_ids):
    return "stop" if tokens and tokens[-1] in eos_ids else ("length" if len(tokens) == limit else "unexpected")


class StepGate:
    """Wraps ``llm_engine.step`` (looked up per call by the server thread): counts steps and, once, holds the
    thread before step number ``hold_at`` until :meth:`release`."""

    def __init__(self, core, hold_at):
        self.core, self.step, self.hold_at = core, core.step, hold_at
        self.count = 0
        self.reached, self.released = threading.Event(), threading.Event()

    def __call__(self):
        self.count += 1
        if self.count == self.hold_at:
            self.reached.set()
            assert self.released.wait(60), "the test never released the held step"
        return self.step()

    def release(self):
        self.released.set()

    async def wait_reached(self):
        for _ in range(6000):
            if self.reached.is_set():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the server thread never reached the held step")


@pytest.fixture
def gate(engine, monkeypatch):
    core = engine.llm.llm_engine

    def make(hold_at):
        g = StepGate(core, hold_at)
        monkeypatch.setattr(core, "step", g)
        return g

    return make


@pytest.fixture(scope="module")
def seeded(engine, tokenizer):
    """``(prompts, seeds, rows)``: the sync path's samples of ``TEXTS`` x 2 with per-row ``sample_seed``."""
    batch = make_prompt_batch(tokenizer, TEXTS, n=2)
    seeds = [100 + i for i in range(len(batch))]
    batch.batch["sample_seed"] = torch.tensor(seeds, dtype=torch.long)
    return _prompts(batch), seeds, _rows(engine.generate(_meta(batch)))


def _sampling(config, **extra):
    return {"temperature": config.temperature, "top_p": config.top_p, "top_k": config.top_k, **extra}


# ---------------------------------------------------------------------------------------------- sampling
@needs_vllm
def test_concurrent_seeded_requests_equal_sync_rows(engine, server, config, seeded):
    """Every row of a seeded sync ``generate`` is reproduced by a request with that row's seed, all requests in
    flight together and sent from two event loops in two threads (as the agent-loop manager's workers)."""
    prompts, seeds, sync = seeded
    base = _sampling(config, logprobs=True)
    results: dict[int, object] = {}

    def worker(rows):
        async def run():
            outs = await asyncio.gather(
                *(
                    server.generate(
                        f"s{i}", prompts[i], {**base, "max_tokens": config.response_length, "seed": seeds[i]}
                    )
                    for i in rows
                )
            )
            results.update(zip(rows, outs, strict=True))

        asyncio.run(run())

    threads = [threading.Thread(target=worker, args=(rows,)) for rows in (range(0, 8, 2), range(1, 8, 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == list(range(len(prompts)))
    reasons = set()
    for i, (tokens, log_probs) in enumerate(sync):
        out = results[i]
        assert out.token_ids == tokens, f"row {i}"
        assert max(abs(a - b) for a, b in zip(out.log_probs, log_probs, strict=True)) < 1e-5
        assert out.stop_reason == _expected_reason(tokens, config.response_length, engine.eos_token_ids)
        reasons.add(out.stop_reason)
    # The rows exercise both endings (an EOS and the max_tokens limit).
    assert reasons == {"stop", "length"}
    assert server.in_flight == 0


@needs_vllm
def test_greedy_requests_equal_hf_engine(server, tokenizer, hf_greedy):
    prompts = _prompts(make_prompt_batch(tokenizer, TEXTS))

    async def run():
        # A seed on a greedy request changes nothing.
        return await asyncio.gather(
            *(server.generate(f"g{i}", p, {**GREEDY, "max_tokens": 64, "seed": i}) for i, p in enumerate(prompts))
        )

    for out, (tokens, log_probs) in zip(asyncio.run(run()), hf_greedy, strict=True):
        assert out.token_ids == tokens
        # hf's rollout log-probs of greedy rows are log_softmax(logits) (T = 1), as the contract asks.
        assert max(abs(a - b) for a, b in zip(out.log_probs, log_probs, strict=True)) < 1e-4


@needs_vllm
@needs_vllm
def test_stop_token_ids_end_the_request(server, engine, config, seeded):
    """A stop token taken from a seeded sample (its first occurrence, at least 3 tokens in) ends the request with
    that seed right after it, kept in the output."""
    prompts, seeds, sync = seeded
    row, tokens = next((i, t) for i, (t, _) in enumerate(sync) if len(set(t)) > 4)
    k = next(i for i in range(3, len(tokens)) if tokens[i] not in tokens[:i])
    params = _sampling(config, max_tokens=config.response_length, seed=seeds[row], stop_token_ids=[tokens[k]])
    out = asyncio.run(server.generate("st", prompts[row], params))
    assert out.token_ids == tokens[: k + 1]
    assert out.stop_reason == "stop"
    assert out.log_probs is None


@needs_vllm
def test_max_tokens_capped_to_the_context(server, hf, tokenizer, engine):
    """A prompt 3 tokens short of max_model_len (256) gets at most 3 new tokens whatever max_tokens says."""
    ids = [t for t in range(3, 80) if t not in engine.eos_token_ids]
    prompt = (ids * 4)[: OPTIONS["max_model_len"] - 3]
    out = asyncio.run(server.generate("cap", prompt, {**GREEDY, "max_tokens": 50}))
    batch = SimpleNamespace(
        batch={"input_ids": torch.tensor([prompt]), "attention_mask": torch.ones(1, len(prompt), dtype=torch.long)}
    )
    expected = _rows(hf.generate(_meta(batch, validate=True, response_length=3)))[0][0]
    assert out.token_ids == expected
    assert out.stop_reason == _expected_reason(expected, 3, engine.eos_token_ids)
    with pytest.raises(ValueError, match=r"has 256 tokens, which leaves no room in the vLLM engine's max_model_len"):
        asyncio.run(server.generate("full", prompt + [5, 6, 7], {"max_tokens": 1}))


# ---------------------------------------------------------------------------------------------- scheduling
@needs_vllm
def test_late_request_joins_a_running_one(server, tokenizer, hf_greedy, gate):
    """A short request sent while a long one decodes joins it at the next scheduler step and finishes first;
    neither result changes (both equal the hf engine's greedy answers)."""
    prompts = _prompts(make_prompt_batch(tokenizer, TEXTS))
    long_ref, short_ref = hf_greedy[2][0], hf_greedy[3][0][:4]
    assert len(long_ref) == 64  # no EOS within 64 tokens: the long request decodes 64 steps
    g = gate(hold_at=5)
    done: list[str] = []

    async def request(name, prompt, max_tokens):
        out = await server.generate(name, prompt, {**GREEDY, "max_tokens": max_tokens})
        done.append(name)
        return out

    async def run():
        long_task = asyncio.create_task(request("long", prompts[2], 64))
        await g.wait_reached()  # the long request is mid-decode, the thread held before its 5th step
        short_task = asyncio.create_task(request("short", prompts[3], 4))
        await asyncio.sleep(0)  # the short request is submitted now
        assert server.in_flight == 2 and not long_task.done()
        g.release()
        return await long_task, await short_task

    long_out, short_out = asyncio.run(run())
    assert done == ["short", "long"]
    assert long_out.token_ids == long_ref and long_out.stop_reason == "length"
    assert short_out.token_ids == short_ref and short_out.stop_reason == "length"
    # Continuous batching: the short one rode along; serially the run would take 64 + 5 steps or more.
    assert g.count < 64 + 5


@needs_vllm
def test_update_weights_between_rounds_changes_the_output(engine, server, tokenizer, hf_greedy, model_path, config):
    from verl.engines.reference.rollout import HFRolloutEngine
    from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine

    reference = ReferenceTrainingEngine(model_path, EngineSettings(dtype="float32"), device="cpu")
    original = perturb_weights(reference.iter_weights(), scale=0.0)
    perturbed = perturb_weights(reference.iter_weights(), scale=0.5, seed=1)
    prompts = _prompts(make_prompt_batch(tokenizer, TEXTS))

    async def round_():
        return await asyncio.gather(
            *(server.generate(f"u{i}", p, {**GREEDY, "max_tokens": 16}) for i, p in enumerate(prompts))
        )

    first = asyncio.run(round_())
    try:
        engine.update_weights(iter(perturbed.items()))
        second = asyncio.run(round_())
    finally:
        engine.update_weights(iter(original.items()))
    third = asyncio.run(round_())
    other = HFRolloutEngine(model_path, tokenizer, config, device="cpu")
    other.update_weights(iter(perturbed.items()))
    expected = _rows(other.generate(_meta(make_prompt_batch(tokenizer, TEXTS), validate=True, response_length=16)))
    assert [o.token_ids for o in second] == [t for t, _ in expected]
    assert [o.token_ids for o in first] != [o.token_ids for o in second]
    assert [o.token_ids for o in first] == [o.token_ids for o in third] == [t[:16] for t, _ in hf_greedy]


# ---------------------------------------------------------------------------------------------- errors
@needs_vllm
def test_engine_calls_refused_while_requests_are_in_flight(engine, server, tokenizer, gate):
    prompt = _prompts(make_prompt_batch(tokenizer, TEXTS[2:3]))[0]
    g = gate(hold_at=3)
    batch = _meta(make_prompt_batch(tokenizer, TEXTS), validate=True)

    async def run():
        task = asyncio.create_task(server.generate("busy", prompt, {**GREEDY, "max_tokens": 8}))
        await g.wait_reached()
        try:
            for call in (
                lambda: engine.update_weights(iter(())),
                engine.sleep,
                engine.wake_up,
                lambda: engine.generate(batch),
            ):
                with pytest.raises(RuntimeError, match=r"1 server request\(s\) in flight on this engine"):
                    call()
        finally:
            g.release()
        return await task

    assert len(asyncio.run(run()).token_ids) == 8
    # Once the request finished the same calls go through.
    engine.update_weights(iter(()))
    engine.sleep()
    engine.wake_up()
    assert engine.generate(batch).batch["responses"].shape[0] == len(TEXTS)


@needs_vllm
def test_cancelled_request_is_aborted(engine, server, tokenizer, gate, hf_greedy):
    prompt = _prompts(make_prompt_batch(tokenizer, TEXTS[2:3]))[0]
    g = gate(hold_at=3)

    async def run():
        task = asyncio.create_task(server.generate("c", prompt, {**GREEDY, "max_tokens": 64}))
        await g.wait_reached()
        task.cancel()
        await asyncio.sleep(0)
        assert server.in_flight == 0
        g.release()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(1000):  # the thread aborts it in vLLM at its next turn
            if not engine.llm.llm_engine.has_unfinished_requests():
                break
            await asyncio.sleep(0.01)
        assert not engine.llm.llm_engine.has_unfinished_requests()
        return await server.generate("after", prompt, {**GREEDY, "max_tokens": 4})

    assert asyncio.run(run()).token_ids == hf_greedy[2][0][:4]


@needs_vllm
@pytest.mark.parametrize(
    ("request_id", "prompt", "params", "error", "fragment"),
    [
        ("x", [1, 2], {"max_tokens": 4, "temprature": 0.5}, ValueError, "unknown sampling parameter(s) ['temprature']"),
        ("x", [1, 2], {"temperature": 0.5}, ValueError, "sampling_params['max_tokens'] must be >= 1"),
        ("x", [], {"max_tokens": 4}, ValueError, "prompt_ids is empty"),
        (
            "x",
            [1, 104],
            {"max_tokens": 4},
            ValueError,
            "prompt_ids[1] = 104 is outside the model's vocabulary [0, 104)",
        ),
        ("x", [1, -1], {"max_tokens": 4}, ValueError, "prompt_ids[1] = -1 is outside"),
        ("x", [1, 2], {"max_tokens": 4, "temperature": -1.0}, ValueError, "'temperature'] must be >= 0"),
        ("x", [1, 2], {"max_tokens": 4, "top_p": 0.0}, ValueError, "'top_p'] must be in (0, 1]"),
        ("x", [1, 2], {"max_tokens": 4, "top_k": 2.5}, ValueError, "'top_k'] must be an integer"),
        (
            "x",
            [1, 2],
            {"max_tokens": 4, "stop_token_ids": ["a"]},
            ValueError,
            "'stop_token_ids'][0] must be an integer",
        ),
        ("x", [1, 2], {"max_tokens": 4, "temperature": float("nan")}, ValueError, "'temperature'] must be a finite"),
        ("x", [1, 2.0], {"max_tokens": 4}, ValueError, "prompt_ids[1] must be an integer token id"),
        (7, [1, 2], {"max_tokens": 4}, ValueError, "request_id must be a str"),
    ],
)
def test_bad_requests_raise(server, request_id, prompt, params, error, fragment):
    with pytest.raises(error) as info:
        asyncio.run(server.generate(request_id, prompt, params))
    assert fragment in str(info.value)
    assert server.in_flight == 0


@needs_vllm
def test_closed_server_and_tensor_parallel_refused(engine, monkeypatch):
    from verl_vllm.server import VLLMRolloutServer

    extra = VLLMRolloutServer(engine)
    extra.close()
    with pytest.raises(RuntimeError, match="the server is closed"):
        asyncio.run(extra.generate("x", [1, 2], {"max_tokens": 2}))
    monkeypatch.setattr(engine, "tp_size", 2)
    with pytest.raises(ValueError, match="needs tensor_model_parallel_size=1 \\(got 2\\)"):
        VLLMRolloutServer(engine)


# ---------------------------------------------------------------------------------------------- translation
def test_request_sampling_kwargs():
    from verl_vllm.server import request_sampling_kwargs

    from verl.engines.serving import validate_request

    def kwargs(params, **extra):
        request = validate_request("r", list(range(10)), params, owner="test")
        return request_sampling_kwargs(request, max_model_len=32, eos_token_ids=[2, 7], **extra)

    sampled = kwargs(
        {"temperature": 0.7, "top_k": -1, "top_p": 0.9, "max_tokens": 100, "seed": 5, "stop_token_ids": [9, 2]}
    )
    assert sampled["max_tokens"] == 22  # 32 - 10
    assert (sampled["temperature"], sampled["top_p"], sampled["top_k"], sampled["seed"]) == (0.7, 0.9, 0, 5)
    assert sampled["stop_token_ids"] == [2, 7, 9] and sampled["ignore_eos"] is False
    assert sampled["logprobs"] is None and sampled["detokenize"] is False
    greedy = kwargs({"temperature": 0, "max_tokens": 4, "seed": 5, "logprobs": True})
    assert (greedy["temperature"], greedy["seed"], greedy["logprobs"], greedy["max_tokens"]) == (0.0, None, 0, 4)
    # Defaults: temperature 1, top_k off as vLLM's 0.
    plain = kwargs({"max_tokens": 4})
    assert (plain["temperature"], plain["top_p"], plain["top_k"]) == (1.0, 1.0, 0)
    # ignore_eos: EOS ids are no stop tokens, the request's own still are.
    no_eos = kwargs({"max_tokens": 4, "stop_token_ids": [9]}, ignore_eos=True)
    assert no_eos["stop_token_ids"] == [9] and no_eos["ignore_eos"] is True
