"""Control flow of ``SGLangRolloutEngine`` against recording stand-ins of ``sglang.Engine`` (see conftest).

These tests show the order and the arguments of our calls (sleep/wake tags, weight-update session, buckets, cache
flush, error paths) and how SGLang-shaped outputs are laid out; a stand-in never shows that SGLang works. The
engine is built as on a GPU worker (``device="cuda:0"``: the device is only named, nothing touches CUDA) with the
stand-in weight API (host tensors).
"""

from __future__ import annotations

import pytest
import torch

from verl.testing.conformance import make_prompt_batch, make_rollout_config

CKPT = {"update_weights_bucket_megabytes": 2048}


def _rollout(**kw):
    from types import SimpleNamespace

    values = {
        "tensor_model_parallel_size": 1,
        "multi_stage_wake_up": True,
        "checkpoint_engine": SimpleNamespace(**CKPT),
        "max_model_len": None,
        "load_format": "auto",
        "dtype": "auto",
        "disable_log_stats": True,
        "engine_kwargs": {},
    }
    values.update(kw)
    return make_rollout_config(**values)


def _engine(engine_cls, model_path, api, **rollout_kw):
    from verl_sglang.engine import SGLangRolloutEngine

    engine = SGLangRolloutEngine(
        model_path, None, _rollout(**rollout_kw), device="cuda:0", engine_cls=engine_cls, weight_api=api
    )
    return engine, engine_cls.last


def _weights(model_path):
    from safetensors.torch import load_file

    return load_file(str(model_path / "model.safetensors"))


def test_standin_engine_gets_token_in_token_out_server_args(session_standin, model_path, standin_api):
    engine, sgl = _engine(session_standin, model_path, standin_api, gpu_memory_utilization=0.3, seed=7)
    args = sgl.server_args
    assert args["skip_tokenizer_init"] is True and args["model_path"] == str(model_path)
    assert (args["tp_size"], args["base_gpu_id"], args["device"]) == (1, 0, "cuda")
    assert (args["mem_fraction_static"], args["random_seed"], args["dtype"]) == (0.3, 7, "bfloat16")
    # prompt_length 32 + response_length 16 + the 2 positions SGLang keeps free.
    assert args["context_length"] == 50 and engine.context == 50
    assert args["enable_memory_saver"] is True and args["enable_weights_cpu_backup"] is True


def test_standin_sleep_update_wake_follow_verls_order(session_standin, model_path, standin_api):
    engine, sgl = _engine(session_standin, model_path, standin_api)
    engine.sleep()
    engine.wake_up(["weights"])
    engine.update_weights(iter(_weights(model_path).items()))
    engine.wake_up(["kv_cache"])
    names = sgl.names()
    assert names[0] == "release_memory_occupation" and sgl.calls[0][1] == ["kv_cache", "weights"]
    assert sgl.calls[1] == ("resume_memory_occupation", ["weights"])
    assert names[2] == "begin_weight_update"
    updates = [i for i, n in enumerate(names) if n == "update_weights_from_tensor"]
    assert updates and all(
        sgl.calls[i][1] == {"payloads": 1, "load_format": "flattened_bucket", "flush_cache": False} for i in updates
    )
    assert names[updates[-1] + 1 :] == ["end_weight_update", "flush_cache", "resume_memory_occupation", "flush_cache"]
    assert sgl.calls[-2] == ("resume_memory_occupation", ["kv_cache"])
    assert not sgl.released


def test_standin_update_wakes_released_weights_itself(session_standin, model_path, standin_api):
    engine, sgl = _engine(session_standin, model_path, standin_api)
    engine.sleep()
    engine.update_weights(iter(_weights(model_path).items()))
    assert sgl.calls[1] == ("resume_memory_occupation", ["weights"]) and sgl.released == {"kv_cache"}


@pytest.mark.parametrize("multi_stage", [True, False])
def test_standin_wake_up_is_staged_whatever_multi_stage_wake_up_says(
    session_standin, model_path, standin_api, multi_stage
):
    # verl reads rollout.multi_stage_wake_up nowhere and always resumes weights, syncs, then the KV cache.
    engine, sgl = _engine(session_standin, model_path, standin_api, multi_stage_wake_up=multi_stage)
    engine.sleep()
    engine.wake_up(["weights"])
    engine.wake_up(["kv_cache"])
    assert [c for c in sgl.calls if c[0].startswith("resume")] == [
        ("resume_memory_occupation", ["weights"]),
        ("resume_memory_occupation", ["kv_cache"]),
    ]


def test_standin_sleep_twice_and_wake_when_awake_are_no_ops(session_standin, model_path, standin_api):
    engine, sgl = _engine(session_standin, model_path, standin_api)
    engine.wake_up()
    engine.sleep()
    engine.sleep()
    assert sgl.names() == ["release_memory_occupation"]
    with pytest.raises(ValueError, match="wake_up tags"):
        engine.wake_up(["cuda_graph"])


def test_standin_weights_arrive_whole_and_exact(session_standin, model_path, standin_api):
    engine, sgl = _engine(session_standin, model_path, standin_api)
    sent = {name: torch.randn_like(t) for name, t in _weights(model_path).items()}
    engine.update_weights(iter(sent.items()))
    loaded = dict(pair for load in sgl.loads for pair in load)
    # Tied embeddings: SGLang holds one tensor for both names, so the head goes as the embedding only.
    assert "lm_head.weight" not in loaded and set(loaded) == set(sent)
    for name, tensor in sent.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name


def test_standin_tied_head_sent_alone_goes_as_the_embedding(session_standin, model_path, standin_api):
    engine, sgl = _engine(session_standin, model_path, standin_api)
    head = torch.randn(104, 32)
    engine.update_weights(iter([("lm_head.weight", head)]))
    assert [n for n, _ in sgl.loads[0]] == ["model.embed_tokens.weight"] and torch.equal(sgl.loads[0][0][1], head)


def test_standin_bucket_size_comes_from_the_checkpoint_engine_section(session_standin, model_path, standin_api):
    engine, sgl = _engine(session_standin, model_path, standin_api)
    engine.config.checkpoint_engine.update_weights_bucket_megabytes = 0
    weights = _weights(model_path)
    with pytest.raises(ValueError, match="bucket_bytes"):
        engine.update_weights(iter(weights.items()))
    engine.config.checkpoint_engine.update_weights_bucket_megabytes = None  # unset: 2048 MiB, one bucket here
    engine.update_weights(iter(weights.items()))
    assert len(sgl.loads) == 1


def test_standin_bucket_boundaries_follow_the_size_and_the_groups(
    session_standin, model_path, standin_api, monkeypatch
):
    import verl_sglang.engine as eng

    engine, sgl = _engine(session_standin, model_path, standin_api)
    # 1-byte buckets: each bucket closes as soon as no fused group is open.
    real = eng.checked_buckets
    monkeypatch.setattr(
        eng, "checked_buckets", lambda w, s, *, bucket_bytes, tied: real(w, s, bucket_bytes=1, tied=tied)
    )
    weights = _weights(model_path)
    engine.update_weights(iter(weights.items()))
    loads = [[n for n, _ in load] for load in sgl.loads]

    def open_group(names):  # some q/k/v or gate/up group of these names is incomplete
        from verl.engines.weight_sync.names import fused_group

        return any((fused_group(n, weights) or {n}) - set(names) for n in names)

    assert len(loads) > 1
    for load in loads:
        assert not open_group(load), load  # fused groups arrive whole
        assert all(open_group(load[:k]) for k in range(1, len(load))), load  # and the bucket closes right after
    assert sorted(n for load in loads for n in load) == sorted(n for n in weights if n != "lm_head.weight")


def test_standin_mixed_dtypes_go_as_one_load_per_dtype(session_standin, model_path, standin_api):
    engine, sgl = _engine(session_standin, model_path, standin_api)
    norm, embed = torch.randn(32).half(), torch.randn(104, 32)
    engine.update_weights(iter([("model.norm.weight", norm), ("model.embed_tokens.weight", embed)]))
    assert [[(n, t.dtype) for n, t in load] for load in sgl.loads] == [
        [("model.norm.weight", torch.float16)],
        [("model.embed_tokens.weight", torch.float32)],
    ]
    assert torch.equal(sgl.loads[0][0][1], norm) and torch.equal(sgl.loads[1][0][1], embed)


def test_standin_unknown_name_sends_nothing_and_closes_the_session(session_standin, model_path, standin_api):
    from verl.engines.weight_sync.names import UnknownWeightError

    engine, sgl = _engine(session_standin, model_path, standin_api)
    with pytest.raises(UnknownWeightError, match="model.norm.weight"):
        engine.update_weights(iter([("model.norm.weigth", torch.zeros(32))]))
    assert sgl.names() == ["begin_weight_update", "end_weight_update"] and not sgl.session
    with pytest.raises(ValueError, match="without"):
        engine.check_weights([("model.layers.0.self_attn.q_proj.weight", (32, 32))])


def test_standin_refused_load_raises_and_still_ends_the_session(session_standin, model_path, standin_api):
    from verl_sglang.engine import SGLangEngineError

    engine, sgl = _engine(session_standin, model_path, standin_api)
    sgl.update_results.append((False, "Failed to update parameter online: boom"))
    with pytest.raises(SGLangEngineError, match="boom"):
        engine.update_weights(iter(_weights(model_path).items()))
    assert sgl.names()[-2:] == ["update_weights_from_tensor", "end_weight_update"] and not sgl.session
    assert "flush_cache" not in sgl.names()


def test_standin_engine_without_a_session_is_updated_directly(plain_standin, model_path, standin_api):
    engine, sgl = _engine(plain_standin, model_path, standin_api)
    engine.update_weights(iter(_weights(model_path).items()))
    assert set(sgl.names()) == {"update_weights_from_tensor", "flush_cache"} and sgl.names()[-1] == "flush_cache"


def test_standin_generate_lays_out_sglang_outputs_like_the_hf_engine(session_standin, model_path, standin_api):
    from verl.models import load_tokenizer

    engine, sgl = _engine(session_standin, model_path, standin_api)
    tok = load_tokenizer(model_path)
    prompts = make_prompt_batch(tok, ["Hi", "A longer prompt here"], n=2)
    out = engine.generate(prompts)
    eos = engine.eos_token_ids[0]
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
    for i in range(4):
        first = int(ids[i][mask[i] == 1][0])
        expected = [first + 1, first + 2, first + 3, eos]
        assert out.batch["responses"][i, :4].tolist() == expected
        assert (out.batch["responses"][i, 4:] == engine.pad_token_id).all()
        assert out.batch["response_mask"][i].tolist() == [1] * 4 + [0] * 12
        assert torch.allclose(out.batch["rollout_log_probs"][i, :4], torch.tensor([-0.25, -0.5, -0.75, -1.0]))
        assert (out.batch["rollout_log_probs"][i, 4:] == 0).all()
    assert torch.equal(out.batch["input_ids"][:, : ids.shape[1]], ids)
    assert "generate_sequences" in out.meta_info["timing"]
    # The requests: token ids without padding, n=1, every EOS id, verl's sampling values.
    row, params = sgl.requests[0]
    assert row == ids[0][mask[0] == 1].tolist()
    assert params == {
        "n": 1,
        "max_new_tokens": 16,
        "stop_token_ids": engine.eos_token_ids,
        "ignore_eos": False,
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": -1,
    }


def test_standin_generate_greedy_seeded_and_waking(session_standin, model_path, standin_api):
    from verl.models import load_tokenizer

    engine, sgl = _engine(session_standin, model_path, standin_api)
    tok = load_tokenizer(model_path)
    engine.sleep()
    prompts = make_prompt_batch(tok, ["Hi"], n=2, meta_info={"validate": True})
    engine.generate(prompts)
    assert sgl.names()[1:4] == ["resume_memory_occupation", "flush_cache", "generate"]
    assert sgl.calls[1][1] == ["weights", "kv_cache"]
    greedy = sgl.requests[0][1]
    assert (greedy["temperature"], greedy["top_k"], "sampling_seed" in greedy) == (0.0, -1, False)
    seeded = make_prompt_batch(tok, ["Hi"], n=2, meta_info={"seed": 5})
    engine.generate(seeded)
    assert [p["sampling_seed"] for _, p in sgl.requests] == [5 * 1_000_003, 5 * 1_000_003 + 1]


def test_standin_release_without_backup_needs_a_sync_before_generating(session_standin, model_path, standin_api):
    from verl_sglang.engine import SGLangRolloutEngine
    from verl_sglang.options import SGLangRolloutOptions

    from verl.models import load_tokenizer

    engine = SGLangRolloutEngine(
        model_path,
        None,
        _rollout(),
        device="cuda:0",
        options=SGLangRolloutOptions(enable_weights_cpu_backup=False),
        engine_cls=session_standin,
        weight_api=standin_api,
    )
    engine.sleep()
    prompts = make_prompt_batch(load_tokenizer(model_path), ["Hi"])
    with pytest.raises(RuntimeError, match="update_weights before generating"):
        engine.generate(prompts)
    engine.update_weights(iter(_weights(model_path).items()))
    assert engine.generate(prompts).batch["responses"].shape == (1, 16)


def test_standin_close_shuts_sglang_down_once(session_standin, model_path, standin_api):
    engine, sgl = _engine(session_standin, model_path, standin_api)
    engine.close()
    engine.close()
    assert sgl.names() == ["shutdown"]


def test_standin_refuses_a_live_module_and_foreign_options(session_standin, model_path, standin_api):
    from verl_sglang.engine import SGLangRolloutEngine

    with pytest.raises(TypeError, match="model path"):
        SGLangRolloutEngine(torch.nn.Linear(2, 2), engine_cls=session_standin)
    with pytest.raises(TypeError, match="SGLangRolloutOptions"):
        SGLangRolloutEngine(model_path, None, _rollout(), options={"log_level": "info"}, engine_cls=session_standin)
    with pytest.raises(ValueError, match="disable_log_stats"):
        _engine(session_standin, model_path, standin_api, disable_log_stats=False)
