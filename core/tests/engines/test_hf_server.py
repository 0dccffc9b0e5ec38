"""The ``hf`` engine's async server (continuous batching): same samples as the sync path, requests that join
and leave a running batch, per-request sampling parameters, weights shared with the engine, clear errors."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from verl.engines.reference import server_batch
from verl.engines.reference.rollout import HFRolloutEngine, StaleWeightsError, build_hf_rollout
from verl.engines.reference.server import HFRolloutServer
from verl.engines.serving import AsyncRolloutServer
from verl.models import load_tokenizer
from verl.protocol import DataProto
from verl.testing.conformance import make_rollout_config
from verl.testing.tiny import save_tiny_model

PROMPTS = ["What is 2+3?", "hi", "Count: 1 2 3", "a longer prompt with words", "x", "12 + 30 ="]
EOS = 2  # the tiny tokenizer's <|im_end|>


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return path, load_tokenizer(path)


def _engine(setup, **cfg) -> HFRolloutEngine:
    path, tok = setup
    return build_hf_rollout(make_rollout_config(**cfg), str(path), tok)


def _sync(engine, tok, texts, seeds=None, **meta):
    """``engine.generate`` rows as ``[(tokens, log_probs)]`` (padding removed)."""
    enc = tok(texts, padding=True, return_tensors="pt")
    tensors = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    if seeds is not None:
        tensors["sample_seed"] = torch.tensor(seeds, dtype=torch.int64)
    out = engine.generate(DataProto.from_dict(tensors=tensors, meta_info=meta))
    rows = []
    for i in range(len(texts)):
        n = int(out.batch["response_mask"][i].sum())
        rows.append((out.batch["responses"][i, :n].tolist(), out.batch["rollout_log_probs"][i, :n]))
    return rows


async def _decoding(server, steps: int, since: int) -> None:
    """Wait until ``server`` ran ``steps`` decode steps more than ``since`` (its earlier count)."""
    await _until(lambda: server.stats()["decode_steps"] >= since + steps)


async def _until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)


def _assert_matches(result, tokens, log_probs, max_tokens) -> None:
    assert result.token_ids == tokens
    torch.testing.assert_close(torch.tensor(result.log_probs), log_probs, atol=1e-5, rtol=0)
    ended_by_eos = tokens[-1] == EOS and len(tokens) <= max_tokens
    assert result.stop_reason == ("stop" if ended_by_eos else "length")


def test_server_is_one_per_engine_and_implements_the_contract(setup) -> None:
    engine = _engine(setup)
    server = engine.server()
    assert server is engine.server()
    assert isinstance(server, HFRolloutServer) and isinstance(server, AsyncRolloutServer)


def test_seeded_requests_match_sync_rows_even_when_arriving_late(setup) -> None:
    _, tok = setup
    length = 20
    engine = _engine(setup, response_length=length, temperature=1.3, top_p=0.9, top_k=30)
    seeds = [1000 + 17 * i for i in range(len(PROMPTS))]
    expected = _sync(engine, tok, PROMPTS, seeds)
    server = engine.server()
    params = {"temperature": 1.3, "top_p": 0.9, "top_k": 30, "logprobs": True}

    async def one(i: int, max_tokens: int = length):
        if i >= 4:  # the last two join a batch that is already decoding
            await _decoding(server, 3, 0)
        ids = tok(PROMPTS[i])["input_ids"]
        return await server.generate(f"r{i}", ids, {**params, "max_tokens": max_tokens, "seed": seeds[i]})

    async def main():
        return await asyncio.gather(*(one(i) for i in range(len(PROMPTS))), one(0, max_tokens=7))

    results = asyncio.run(main())
    for i, result in enumerate(results[:-1]):
        _assert_matches(result, *expected[i], length)
    # A shorter max_tokens gives the first tokens of the same sample (CPU draws do not depend on their count).
    short = results[-1]
    tokens, log_probs = expected[0]
    assert short.token_ids == tokens[:7] and short.stop_reason == ("stop" if tokens[6:7] == [EOS] else "length")
    torch.testing.assert_close(torch.tensor(short.log_probs), log_probs[:7], atol=1e-5, rtol=0)
    stats = server.stats()
    # The late rows were prefilled apart and decoded together with the rows that run to the full length.
    full_length = sum(len(tokens) == length for tokens, _ in expected[:4])
    assert stats["prefills"] >= 2 and stats["max_running"] >= full_length + 2
    assert stats["requests"] == len(PROMPTS) + 1
    assert stats["tokens"] == sum(len(r.token_ids) for r in results)
    assert stats["prefill_tokens"] == sum(len(tok(p)["input_ids"]) for p in PROMPTS) + len(tok(PROMPTS[0])["input_ids"])
    assert server.in_flight == 0


def test_greedy_and_sampled_rows_share_one_batch(setup) -> None:
    _, tok = setup
    length = 16
    engine = _engine(setup, response_length=length, temperature=0.7)
    seeds = [5 + i for i in range(len(PROMPTS))]
    greedy = _sync(engine, tok, PROMPTS, do_sample=False)
    sampled = _sync(engine, tok, PROMPTS, seeds)
    server = engine.server()

    async def main():
        calls = []
        for i, text in enumerate(PROMPTS):
            params = {"max_tokens": length, "logprobs": True}
            params.update({"temperature": 0.0} if i % 2 == 0 else {"temperature": 0.7, "seed": seeds[i]})
            calls.append(server.generate(f"r{i}", tok(text)["input_ids"], params))
        return await asyncio.gather(*calls)

    for i, result in enumerate(asyncio.run(main())):
        _assert_matches(result, *(greedy if i % 2 == 0 else sampled)[i], length)
    assert greedy != sampled


def test_unseeded_requests_draw_from_the_engine_generator(setup) -> None:
    _, tok = setup
    ids = tok(PROMPTS[0])["input_ids"]
    params = {"temperature": 1.5, "max_tokens": 24}

    def run(seed: int) -> list[list[int]]:
        engine = _engine(setup, seed=seed, ignore_eos=True)
        server = engine.server()
        return [asyncio.run(server.generate("r", ids, params)).token_ids for _ in range(2)]

    first, again, other = run(0), run(0), run(1)
    assert first == again  # the engine's seeded generator, consumed in request order
    assert first[0] != first[1] and first != other


def test_stop_token_ids_max_tokens_and_the_context_cap(setup) -> None:
    _, tok = setup
    engine = _engine(setup, ignore_eos=True, max_model_len=40)
    server = engine.server()
    ids = tok(PROMPTS[0])["input_ids"]
    sample = {"temperature": 1.0, "seed": 3, "logprobs": True}

    def run(prompt, **params):
        return asyncio.run(server.generate("r", prompt, {**sample, **params}))

    full = run(ids, max_tokens=20)
    assert len(full.token_ids) == 20 and full.stop_reason == "length"  # ignore_eos: EOS ends nothing
    # The stop token is the latest first occurrence in the sample, so the request must end exactly there.
    firsts = {}
    for k, token in enumerate(full.token_ids):
        firsts.setdefault(token, k)
    k = max(firsts.values())
    stopped = run(ids, max_tokens=20, stop_token_ids=[full.token_ids[k]])
    assert stopped.token_ids == full.token_ids[: k + 1] and stopped.stop_reason == "stop"
    assert stopped.log_probs == pytest.approx(full.log_probs[: k + 1], abs=1e-5)
    five = run(ids, max_tokens=5)
    assert five.token_ids == full.token_ids[:5] and five.stop_reason == "length"
    # max_model_len=40: a 30-token prompt leaves 10 tokens, whatever max_tokens asks.
    capped = run(list(range(4, 34)), max_tokens=100)
    assert len(capped.token_ids) == 40 - 30 and capped.stop_reason == "length"
    with pytest.raises(ValueError, match="max_model_len=40"):
        run(list(range(4, 44)), max_tokens=1)


def test_eos_ends_a_request_unless_ignore_eos(setup) -> None:
    _, tok = setup
    ids = tok(PROMPTS[2])["input_ids"]
    params = {"temperature": 1.5, "max_tokens": 20}
    ignoring = _engine(setup, ignore_eos=True).server()
    # The first seed whose sample holds EOS before its last token (the tiny model emits EOS now and then).
    for seed in range(200):
        ignored = asyncio.run(ignoring.generate("r", ids, {**params, "seed": seed}))
        if EOS in ignored.token_ids[:-1]:
            break
    else:
        raise AssertionError("no sample with EOS among 200 seeds")
    ended = asyncio.run(_engine(setup).server().generate("r", ids, {**params, "seed": seed}))
    cut = ignored.token_ids.index(EOS) + 1
    assert ended.token_ids == ignored.token_ids[:cut] and ended.stop_reason == "stop"
    assert len(ignored.token_ids) == 20 and ignored.stop_reason == "length"
    assert ended.log_probs is None


def test_a_short_request_sent_later_overtakes_a_long_one(setup) -> None:
    _, tok = setup
    engine = _engine(setup, ignore_eos=True)
    server = engine.server()
    long_ids, short_ids = tok(PROMPTS[3])["input_ids"], tok(PROMPTS[1])["input_ids"]
    long_params = {"temperature": 0.9, "seed": 1, "max_tokens": 400, "logprobs": True}
    short_params = {"temperature": 0.0, "max_tokens": 4, "logprobs": True}
    order = []

    async def main():
        async def long():
            out = await server.generate("long", long_ids, long_params)
            order.append("long")
            return out

        async def short():
            await _decoding(server, 2, 0)
            out = await server.generate("short", short_ids, short_params)
            order.append("short")
            return out

        return await asyncio.gather(long(), short())

    merged_long, merged_short = asyncio.run(main())
    assert order == ["short", "long"]
    stats = server.stats()
    assert stats["max_running"] == 2 and stats["prefills"] == 2
    assert len(merged_long.token_ids) == 400 and len(merged_short.token_ids) == 4
    # Joining and leaving the batch changed neither sample: each equals its run alone.
    alone_long = asyncio.run(server.generate("long", long_ids, long_params))
    alone_short = asyncio.run(server.generate("short", short_ids, short_params))
    for merged, alone in ((merged_long, alone_long), (merged_short, alone_short)):
        assert merged.token_ids == alone.token_ids
        assert merged.log_probs == pytest.approx(alone.log_probs, abs=1e-5)


def test_concurrent_requests_take_less_time_than_sequential_ones(setup) -> None:
    _, tok = setup
    engine = _engine(setup, ignore_eos=True)
    server = engine.server()
    requests = [
        (tok(PROMPTS[i % len(PROMPTS)])["input_ids"], {"temperature": 1.0, "seed": i, "max_tokens": 96})
        for i in range(8)
    ]
    asyncio.run(server.generate("warm-up", *requests[0]))

    async def sequential():
        return [await server.generate(f"r{i}", ids, p) for i, (ids, p) in enumerate(requests)]

    async def concurrent():
        return await asyncio.gather(*(server.generate(f"r{i}", ids, p) for i, (ids, p) in enumerate(requests)))

    start = time.perf_counter()
    one_by_one = asyncio.run(sequential())
    sequential_s = time.perf_counter() - start
    start = time.perf_counter()
    together = asyncio.run(concurrent())
    concurrent_s = time.perf_counter() - start
    assert [r.token_ids for r in together] == [r.token_ids for r in one_by_one]
    assert concurrent_s < 0.7 * sequential_s, (concurrent_s, sequential_s)
    assert server.stats()["max_running"] >= 4


def test_max_num_seqs_caps_the_running_batch(setup) -> None:
    _, tok = setup
    length = 12
    engine = _engine(setup, response_length=length, temperature=1.1, max_num_seqs=2, max_num_batched_tokens=64)
    seeds = [70 + i for i in range(len(PROMPTS))]
    expected = _sync(engine, tok, PROMPTS, seeds)
    server = engine.server()

    async def main():
        return await asyncio.gather(
            *(
                server.generate(
                    f"r{i}",
                    tok(t)["input_ids"],
                    {"temperature": 1.1, "seed": seeds[i], "max_tokens": length, "logprobs": True},
                )
                for i, t in enumerate(PROMPTS)
            )
        )

    for i, result in enumerate(asyncio.run(main())):
        _assert_matches(result, *expected[i], length)
    stats = server.stats()
    assert stats["max_running"] == 2 and stats["prefills"] >= 3  # six requests, at most two at a time
    with pytest.raises(ValueError, match="max_num_batched_tokens=64"):
        asyncio.run(server.generate("r", list(range(4, 4 + 65)), {"max_tokens": 1}))


def test_weights_are_the_engines_and_cannot_change_in_flight(setup) -> None:
    _, tok = setup
    engine = _engine(setup, ignore_eos=True, response_length=12)
    server = engine.server()
    ids = tok(PROMPTS[0])["input_ids"]
    greedy = {"temperature": 0.0, "max_tokens": 12}
    before = asyncio.run(server.generate("r", ids, greedy)).token_ids
    generator = torch.Generator().manual_seed(0)
    engine.update_weights(
        (name, p + 0.5 * torch.randn(p.shape, generator=generator)) for name, p in engine.model.state_dict().items()
    )
    after = asyncio.run(server.generate("r", ids, greedy)).token_ids
    assert after != before
    assert after == _sync(engine, tok, [PROMPTS[0]], do_sample=False)[0][0]

    async def main():
        since = server.stats()["decode_steps"]
        task = asyncio.ensure_future(server.generate("long", ids, {"temperature": 0.0, "max_tokens": 300}))
        await _decoding(server, 2, since)
        with pytest.raises(RuntimeError, match=r"update_weights: the async server has 1 request\(s\) in flight"):
            engine.update_weights(iter([]))
        with pytest.raises(RuntimeError, match="HFRolloutEngine.sleep: the async server has 1 request"):
            engine.sleep()
        return await task

    assert len(asyncio.run(main()).token_ids) == 300
    engine.update_weights(iter([]))  # accepted again once nothing is in flight


def test_a_sleeping_engine_is_woken_and_stale_weights_are_refused(setup) -> None:
    _, tok = setup
    engine = _engine(setup, response_length=10)
    server = engine.server()
    ids = tok(PROMPTS[1])["input_ids"]
    greedy = {"temperature": 0.0, "max_tokens": 10}
    before = asyncio.run(server.generate("r", ids, greedy))
    saved = {k: v.clone() for k, v in engine.model.state_dict().items()}
    engine.sleep()  # owned model, sleep_level 2: the weights are discarded
    assert engine.weights.asleep
    with pytest.raises(StaleWeightsError, match="not synced back"):
        asyncio.run(server.generate("r", ids, greedy))
    assert not engine.weights.asleep and server.in_flight == 0
    engine.update_weights(iter(saved.items()))
    assert asyncio.run(server.generate("r", ids, greedy)) == before


def test_cancel_and_close_abort_requests(setup) -> None:
    _, tok = setup
    engine = _engine(setup, ignore_eos=True)
    server = engine.server()
    ids = tok(PROMPTS[0])["input_ids"]
    params = {"temperature": 0.0, "max_tokens": 500, "logprobs": True}

    async def cancelled():
        task = asyncio.ensure_future(server.generate("c", ids, params))
        await _decoding(server, 2, 0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _until(lambda: server.in_flight == 0)

    asyncio.run(cancelled())
    assert server.stats()["tokens"] < 500 and server.stats()["requests"] == 0

    async def closed():
        since = server.stats()["decode_steps"]
        task = asyncio.ensure_future(server.generate("a", ids, params))
        await _decoding(server, 10, since)
        server.close(timeout=30)
        return await task

    aborted = asyncio.run(closed())
    assert aborted.stop_reason == "aborted" and 0 < len(aborted.token_ids) < 500
    assert len(aborted.log_probs) == len(aborted.token_ids)
    assert len(asyncio.run(server.generate("b", ids, {"temperature": 0.0, "max_tokens": 3})).token_ids) == 3


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ([], {"max_tokens": 4}, "prompt_ids is empty"),
        ([5, 6], {"max_tokens": 4, "temperatur": 1.0}, r"unknown sampling parameter\(s\) \['temperatur'\]"),
        ([5, 6], {"temperature": 1.0}, r"sampling_params\['max_tokens'\] must be >= 1"),
        ([5, 6], {"max_tokens": "4"}, r"sampling_params\['max_tokens'\] must be an integer, got '4'"),
        ([5, 6], {"max_tokens": float("nan")}, r"sampling_params\['max_tokens'\] must be an integer, got nan"),
        ([5, 6], {"max_tokens": 4, "top_p": 0.0}, r"sampling_params\['top_p'\] must be in \(0, 1\]"),
        ([5, 6], {"max_tokens": 4, "top_p": float("nan")}, r"sampling_params\['top_p'\] must be a finite number"),
        ([5, 6], {"max_tokens": 4, "temperature": -1.0}, r"sampling_params\['temperature'\] must be >= 0"),
        ([5, 6], {"max_tokens": 4, "temperature": float("nan")}, r"'temperature'\] must be a finite number, got nan"),
        ([5, 6], {"max_tokens": 4, "temperature": float("inf")}, r"'temperature'\] must be a finite number, got inf"),
        ([5, 6], {"max_tokens": 4, "temperature": True}, r"'temperature'\] must be a number, got True"),
        ([5, 6], {"max_tokens": 4, "top_k": "5"}, r"sampling_params\['top_k'\] must be an integer, got '5'"),
        ([5, 6], {"max_tokens": 4, "top_k": -2}, r"sampling_params\['top_k'\] must be -1 or 0 \(off\)"),
        ([5, 6], {"max_tokens": 4, "seed": 1.5}, r"sampling_params\['seed'\] must be an integer, got 1.5"),
        ([5, 6], {"max_tokens": 4, "seed": 2**64}, r"sampling_params\['seed'\] must fit in 64 bits"),
        ([5, 6], {"max_tokens": 4, "logprobs": "yes"}, r"sampling_params\['logprobs'\] must be true or false"),
        ([5, 6], {"max_tokens": 4, "stop_token_ids": 2}, r"sampling_params\['stop_token_ids'\] must be a list"),
        ([5, 6], {"max_tokens": 4, "stop_token_ids": [2.5]}, r"'stop_token_ids'\]\[0\] must be an integer token"),
        ([5, 104], {"max_tokens": 4}, r"prompt_ids\[1\] = 104 is outside the model's vocabulary \[0, 104\)"),
        ([5, 6.0], {"max_tokens": 4}, r"prompt_ids\[1\] must be an integer token id, got 6.0 \(float\)"),
        ([5, "6"], {"max_tokens": 4}, r"prompt_ids\[1\] must be an integer token id, got '6' \(str\)"),
        ([True, 6], {"max_tokens": 4}, r"prompt_ids\[0\] must be an integer token id, got True \(bool\)"),
        ("56", {"max_tokens": 4}, r"prompt_ids must be a list of integer token ids, got str"),
        ([5, 6], [("max_tokens", 4)], r"sampling_params must be a dict, got list"),
        (list(range(4, 104)) * 11, {"max_tokens": 1}, "max_position_embeddings=1024"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(setup, prompt, params, message) -> None:
    """Every field of a request is checked before it reaches the decode thread: no NaN / inf sampling value, no
    float, string or bool token id, no wrong type passes (issue #36)."""
    server = _engine(setup).server()
    with pytest.raises(ValueError, match=message):
        asyncio.run(server.generate("bad", prompt, params))
    with pytest.raises(ValueError, match=r"request_id must be a str, got int"):
        asyncio.run(server.generate(7, [5, 6], {"max_tokens": 4}))
    assert server.in_flight == 0 and server.stats()["prefills"] == 0


def test_requests_with_numpy_and_tensor_ids_are_accepted_as_plain_ints() -> None:
    """Integer types a caller may hold (numpy scalars, a 1-D int tensor, an integral float ``max_tokens`` from a
    JSON client) are normalised to Python ints; the checked values come back as given."""
    import numpy as np

    from verl.engines.serving import validate_request

    valid = validate_request(
        "r",
        torch.tensor([5, 6, 7]),
        {"max_tokens": 16.0, "temperature": np.float32(0.5), "top_k": np.int64(3), "stop_token_ids": [np.int32(2)]},
        owner="test",
        vocab_size=104,
    )
    assert valid.prompt_ids == [5, 6, 7] and all(type(t) is int for t in valid.prompt_ids)
    assert (valid.max_tokens, valid.temperature, valid.top_k, valid.stop_token_ids) == (16, 0.5, 3, (2,))
    assert (valid.top_p, valid.logprobs, valid.seed, valid.greedy) == (1.0, False, None, False)
    assert validate_request("r", np.array([1]), {"max_tokens": 1, "temperature": 0}, owner="t").greedy


def test_merge_right_aligns_rows_and_select_cuts_padding() -> None:
    from transformers import LlamaConfig

    config = LlamaConfig(num_hidden_layers=1)
    a, b = server_batch.new_cache(config, 8), server_batch.new_cache(config, 8)
    ka, kb = torch.arange(1, 1 + 2 * 3).float().reshape(2, 1, 3, 1), torch.full((1, 1, 5, 1), 9.0)
    a.layers[0].update(ka, -ka)
    b.layers[0].update(kb, -kb)
    merged = server_batch.merge(a, b, 10)
    layer = merged.layers[0]
    assert layer.length == 5 and layer.capacity == 10
    want = torch.tensor([[0, 0, 1, 2, 3], [0, 0, 4, 5, 6], [9, 9, 9, 9, 9]], dtype=torch.float32)
    torch.testing.assert_close(layer.keys[:, 0, :, 0], want)
    torch.testing.assert_close(layer.values[:, 0, :, 0], -want)
    server_batch.select(merged, torch.tensor([1]), drop_left=2)
    torch.testing.assert_close(layer.keys[:, 0, :, 0], torch.tensor([[4.0, 5.0, 6.0]]))
    layer.update(torch.full((1, 1, 9, 1), 7.0), torch.zeros(1, 1, 9, 1))  # past the capacity: the buffers grow
    assert layer.length == 12 and layer.capacity >= 12
    torch.testing.assert_close(layer.keys[0, 0, :, 0], torch.tensor([4.0, 5.0, 6.0] + [7.0] * 9))
