"""Engine control flow against :class:`RecordingTRTLLMStandIn` (a recording stand-in of ``tensorrt_llm.LLM``).

These tests show our call order (what the engine asks TensorRT-LLM, in which order, with which arguments) and
our own translation of its answers; they never show that TensorRT-LLM works. The GPU check
(``scripts/check_cuda.sh``) runs the engine on the real library.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from verl_trtllm.backend import TRTLLMBinding
from verl_trtllm.engine import TRTLLMRolloutEngine
from verl_trtllm.options import TRTLLMRolloutOptions
from verl_trtllm.weights import decode_payload

from verl.engines.weight_sync.names import UnknownWeightError
from verl.protocol import DataProto
from verl.testing.conformance import CONFORMANCE_PROMPTS, make_prompt_batch, save_conformance_model

PROMPT_LEN, RESP_LEN = 32, 8

UUID = "GPU-standin-0"
# ExecutorMemoryType values of TensorRT-LLM's 1.3 line, in enum order.
TAGS = (
    "sampler",
    "drafter",
    "guided_decoder",
    "spec_resource_manager",
    "_no_capture_init_kv_cache",
    "_no_capture_init_extra_resources",
    "model_extra",
    "executor_extra",
    "kv_cache",
    "model",
    "draft_model",
    "model_weights",
    "draft_model_weights",
)
WEIGHT_TAGS = [t for t in TAGS if t != "kv_cache" and not t.startswith("_")]


class RecordedSamplingParams(SimpleNamespace):
    """Stands in for ``tensorrt_llm.SamplingParams``: keeps the keyword arguments it was built with."""


def standin_reduce_tensor(tensor: torch.Tensor) -> tuple[str, tuple[Any, ...]]:
    """Stands in for ``reduce_tensor``: a picklable ``(fn, args)`` naming the staged tensor's storage, plus a copy of
    its values at the time of the call (what TensorRT-LLM's worker would read through the handle)."""
    return ("standin_rebuild", (tuple(tensor.shape), str(tensor.dtype), tensor.data_ptr(), tensor.detach().clone()))


class RecordingTRTLLMStandIn:
    """Recording stand-in of ``tensorrt_llm.LLM``: it shows our call order, not that TensorRT-LLM works.

    Every call lands in ``events`` as ``(name, detail)``. ``generate`` answers row ``i`` (prompt ``p``) with the
    tokens ``[p[-1] + 1, p[-1] + 2, ...]`` up to ``max_tokens``, ending at the first stop token it is given when
    ``stop_at`` (a position) is set, and the log-prob of token ``t`` as ``-t / 100``. With ``fail_update=k`` the
    ``k``-th ``update_weights`` payload (0-based) raises, as a worker whose reload fails would.
    """

    def __init__(
        self,
        events: list,
        *,
        uuid: str = UUID,
        stop_at: int | None = None,
        has_release: bool = True,
        fail_update: int | None = None,
        **kwargs,
    ):
        self.events = events
        self.fail_update = fail_update
        self.kwargs = kwargs
        self.uuid = uuid
        self.stop_at = stop_at
        self.has_release = has_release
        self.sampling: list[Any] = []
        self.inputs: list[list[int]] = []
        self.loaded: list[list[tuple[str, Any]]] = []
        events.append(("init", kwargs))

    def __getattr__(self, name: str) -> Any:
        if name in ("release", "resume") and self.__dict__.get("has_release"):
            return lambda tags: self.events.append((name, list(tags)))
        raise AttributeError(name)

    def _collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None, **_: Any) -> list:
        if method == "report_device_id":
            self.events.append(("rpc", method))
            return [self.uuid]
        if method == "update_weights":
            payload = args[0]
            if payload is None:
                self.events.append(("rpc", "update_weights(None)"))
            else:
                handles = decode_payload(payload, self.uuid)
                if self.fail_update == len(self.loaded):
                    self.events.append(("rpc", "update_weights failed"))
                    raise RuntimeError("stand-in worker: reload failed")
                self.loaded.append(handles)
                self.events.append(("rpc", "update_weights", [name for name, _ in handles]))
            return [None]
        self.events.append(("rpc", method, *args))
        return [None]

    def generate(self, inputs, sampling_params=None, use_tqdm=True):
        self.events.append(("generate", len(inputs)))
        self.inputs = [list(row) for row in inputs]
        self.sampling = list(sampling_params)
        outputs = []
        for row, sp in zip(inputs, sampling_params, strict=True):
            tokens = [int(row[-1]) + k for k in range(1, sp.max_tokens + 1)]
            if self.stop_at is not None and sp.stop_token_ids and self.stop_at < len(tokens):
                tokens = tokens[: self.stop_at] + [sp.stop_token_ids[0]]
            logprobs = (
                [{t: SimpleNamespace(logprob=-t / 100, rank=1)} for t in tokens] if sp.logprobs is not None else []
            )
            completion = SimpleNamespace(token_ids=tokens, logprobs=logprobs, finish_reason="stop")
            outputs.append(SimpleNamespace(outputs=[completion], prompt_token_ids=list(row)))
        return outputs

    def shutdown(self):
        self.events.append(("shutdown",))


def standin_binding(events: list, llm_fields: Any = None, **llm_options: Any) -> TRTLLMBinding:
    """A :class:`TRTLLMBinding` whose ``LLM`` is a :class:`RecordingTRTLLMStandIn` (staging on the CPU);
    ``llm_fields``: the ``TorchLlmArgs`` field names the binding reports (None: unknown)."""

    def make_llm(**kwargs: Any) -> RecordingTRTLLMStandIn:
        return RecordingTRTLLMStandIn(events, **llm_options, **kwargs)

    return TRTLLMBinding(
        LLM=make_llm,
        SamplingParams=RecordedSamplingParams,
        memory_tags=TAGS,
        device_uuid=lambda index: UUID,
        reduce_tensor=standin_reduce_tensor,
        staging_device=lambda: torch.device("cpu"),
        llm_fields=llm_fields,
    )


class _Rollout:
    """The loaded rollout section with a few attributes replaced (a bucket size below one MiB, for instance)."""

    def __init__(self, base, **replaced):
        self._base, self._replaced = base, replaced

    def __getattr__(self, name):
        return self._replaced[name] if name in self._replaced else getattr(self._base, name)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_conformance_model(tmp_path_factory.mktemp("trtllm_standin") / "model")


@pytest.fixture
def rollout(model_path, pretend_trtllm_installed):
    from verl.config import load_config

    cfg = load_config(
        None,
        [
            "actor_rollout_ref.rollout.name=trtllm",
            "trainer.device=cuda",
            f"actor_rollout_ref.model.path={model_path}",
            f"data.max_prompt_length={PROMPT_LEN}",
            f"data.max_response_length={RESP_LEN}",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            "actor_rollout_ref.rollout.temperature=0.7",
            "actor_rollout_ref.rollout.seed=5",
        ],
    )
    return cfg.actor_rollout_ref.rollout


def _engine(model_path, rollout, events, options=None, **llm_options):
    return TRTLLMRolloutEngine(
        model_path, None, rollout, device="cuda", options=options, binding=standin_binding(events, **llm_options)
    )


def _prompts(engine, **meta):
    batch = make_prompt_batch(engine.tokenizer, CONFORMANCE_PROMPTS[:2], n=2)
    return DataProto.from_dict(tensors={k: batch.batch[k] for k in batch.batch.keys()}, meta_info=meta)


def _weights(model_path):
    from safetensors.torch import load_file

    return dict(load_file(str(model_path / "model.safetensors")))


def test_standin_construction_passes_llm_kwargs_and_checks_the_gpu(model_path, rollout):
    events = []
    engine = _engine(model_path, rollout, events, TRTLLMRolloutOptions(sleep_level=2))
    (name, kwargs), second = events[0], events[1]
    assert name == "init" and second == ("rpc", "report_device_id")
    assert kwargs["model"] == str(model_path) and kwargs["max_seq_len"] == PROMPT_LEN + RESP_LEN
    assert kwargs["orchestrator_type"] == "ray" and kwargs["skip_tokenizer_init"] is True
    assert kwargs["sleep_config"] == {"restore_modes": {"kv_cache": "NONE", "model_weights": "NONE"}}
    assert kwargs["dtype"] == "bfloat16"  # rollout.dtype auto on a GPU
    assert engine.eos_token_ids[0] == engine.tokenizer.eos_token_id and len(engine.eos_token_ids) > 1

    events = []
    with pytest.raises(RuntimeError, match=r"runs on GPU \['GPU-other'\], this trainer process on GPU-standin-0"):
        _engine(model_path, rollout, events, uuid="GPU-other")
    assert events[-1] == ("shutdown",)


def test_standin_a_release_without_sampler_type_gets_none_and_torch_sampler_semantics(model_path, rollout):
    events = []
    binding = standin_binding(events, llm_fields=frozenset({"model", "max_seq_len"}))
    engine = TRTLLMRolloutEngine(model_path, None, rollout, device="cuda", options=None, binding=binding)
    assert "sampler_type" not in events[0][1] and engine.sampler == "TorchSampler"
    events = []
    binding = standin_binding(events, llm_fields=frozenset({"model", "sampler_type"}))
    engine = TRTLLMRolloutEngine(model_path, None, rollout, device="cuda", options=None, binding=binding)
    assert events[0][1]["sampler_type"] == "TRTLLMSampler" and engine.sampler == "TRTLLMSampler"


def test_standin_bad_arguments_are_refused_before_trtllm_starts(model_path, rollout):
    events = []
    with pytest.raises(TypeError, match="pass a model path, not a live module"):
        TRTLLMRolloutEngine(torch.nn.Linear(2, 2), binding=standin_binding(events))
    with pytest.raises(TypeError, match="must be a TRTLLMRolloutOptions"):
        _engine(model_path, rollout, events, options={"sleep_level": 2})
    with pytest.raises(ValueError, match="tensor_model_parallel_size=2"):
        _engine(model_path, _Rollout(rollout, tensor_model_parallel_size=2), events)
    with pytest.raises(ValueError, match="NVIDIA GPUs only"):
        TRTLLMRolloutEngine(model_path, None, rollout, device="cpu", binding=standin_binding(events))
    assert events == []


def test_standin_generate_sends_stripped_rows_and_builds_the_hf_layout(model_path, rollout):
    events = []
    engine = _engine(model_path, rollout, events, stop_at=3)
    prompts = _prompts(engine)
    out = engine.generate(prompts)
    llm = engine.llm
    mask = prompts.batch["attention_mask"]
    assert llm.inputs == [row[m.bool()].tolist() for row, m in zip(prompts.batch["input_ids"], mask, strict=True)]
    eos = engine.eos_token_ids
    for i, sp in enumerate(llm.sampling):
        assert (sp.n, sp.max_tokens, sp.end_id, sp.stop_token_ids, sp.logprobs) == (1, RESP_LEN, -1, eos, 1)
        assert (sp.temperature, sp.top_p, sp.top_k, sp.detokenize, sp.include_stop_str_in_output) == (
            0.7,
            1.0,
            0,
            False,
            True,
        )
        assert sp.seed == (5 * 1_000_003 + i) % (1 << 63)  # rollout.seed, one seed per row
    # The stand-in answers [last+1, last+2, last+3, eos]: 4 tokens, EOS included, then padding.
    for i, row in enumerate(llm.inputs):
        expected = [row[-1] + 1, row[-1] + 2, row[-1] + 3, eos[0]]
        assert out.batch["responses"][i].tolist() == expected + [engine.pad_token_id] * (RESP_LEN - 4)
        assert out.batch["response_mask"][i].tolist() == [1] * 4 + [0] * (RESP_LEN - 4)
        assert out.batch["rollout_log_probs"][i].tolist() == pytest.approx([-t / 100 for t in expected] + [0.0] * 4)
    assert torch.equal(out.batch["input_ids"], torch.cat([prompts.batch["input_ids"], out.batch["responses"]], 1))
    positions = torch.clip(torch.cumsum(out.batch["attention_mask"], -1) - 1, min=0)
    assert torch.equal(out.batch["position_ids"], positions)


def test_standin_greedy_and_seeds_across_calls(model_path, rollout):
    events = []
    engine = _engine(model_path, rollout, events)
    engine.generate(_prompts(engine, validate=True))
    assert all(sp.temperature == 0.0 and sp.seed is None and not hasattr(sp, "top_k") for sp in engine.llm.sampling)
    engine.generate(_prompts(engine))
    first = [sp.seed for sp in engine.llm.sampling]
    engine.generate(_prompts(engine))
    second = [sp.seed for sp in engine.llm.sampling]
    # Greedy calls use no seeds; unseeded sampled calls continue the engine's sequence (no row repeats a seed).
    assert len(set(first + second)) == 8 and second[0] == first[-1] + 1
    engine.generate(_prompts(engine, seed=9))
    assert [sp.seed for sp in engine.llm.sampling] == [9 * 1_000_003 + i for i in range(4)]


def test_standin_sleep_wake_sync_in_verls_order(model_path, rollout):
    events = []
    engine = _engine(model_path, rollout, events)
    del events[:]
    engine.sleep()
    engine.sleep()  # already asleep: nothing more
    engine.wake_up(["weights"])
    engine.update_weights(iter(_weights(model_path).items()))
    engine.wake_up(["kv_cache"])
    engine.generate(_prompts(engine))
    names = [e[0] if e[0] != "rpc" else e[1] for e in events]
    assert names == [
        "release",
        "resume",
        "update_weights",
        "update_weights(None)",
        "verl_reset_prefix_cache",
        "resume",
        "generate",
    ]
    assert events[0] == ("release", [*WEIGHT_TAGS, "kv_cache"])
    assert events[1] == ("resume", WEIGHT_TAGS) and events[5] == ("resume", ["kv_cache"])


def test_standin_generate_and_update_wake_what_they_need(model_path, rollout):
    events = []
    engine = _engine(model_path, rollout, events)
    engine.sleep()
    del events[:]
    engine.generate(_prompts(engine))
    assert [e[0] for e in events] == ["resume", "resume", "generate"]
    assert events[0][1] == WEIGHT_TAGS and events[1][1] == ["kv_cache"]
    engine.sleep()
    del events[:]
    engine.update_weights(iter(_weights(model_path).items()))  # an update while asleep wakes the weights first
    assert events[0] == ("resume", WEIGHT_TAGS) and events[1][:2] == ("rpc", "update_weights")
    with pytest.raises(ValueError, match="wake_up tags must be among"):
        engine.wake_up(["cuda_graph"])


def test_standin_sleep_level_2_needs_an_update_before_generating(model_path, rollout):
    events = []
    engine = _engine(model_path, rollout, events, TRTLLMRolloutOptions(sleep_level=2))
    engine.sleep()
    engine.wake_up()
    with pytest.raises(RuntimeError, match="discarded by sleep"):
        engine.generate(_prompts(engine))
    engine.update_weights(iter(_weights(model_path).items()))
    engine.generate(_prompts(engine))


def test_standin_sleep_is_a_no_op_without_sleep_mode_and_falls_back_to_rpc(model_path, rollout):
    events = []
    engine = _engine(model_path, rollout, events, TRTLLMRolloutOptions(enable_sleep_mode=False))
    assert "sleep_config" not in events[0][1]
    del events[:]
    engine.sleep()
    engine.wake_up()
    assert events == []
    # An LLM without release()/resume(): the worker's sleep / wakeup through collective RPC.
    events = []
    engine = _engine(model_path, rollout, events, has_release=False)
    del events[:]
    engine.sleep()
    engine.wake_up(["kv_cache"])
    assert events == [("rpc", "sleep", [*WEIGHT_TAGS, "kv_cache"]), ("rpc", "wakeup", ["kv_cache"])]


def test_standin_update_buckets_hold_whole_fused_groups(model_path, rollout):
    events = []
    # About 1 KiB per bucket: most tensors close a bucket alone, but q/k/v and gate/up of a layer stay together.
    small = _Rollout(rollout, checkpoint_engine=type("C", (), {"update_weights_bucket_megabytes": 1 / 1024})())
    engine = _engine(model_path, small, events)
    weights = _weights(model_path)
    assert "lm_head.weight" not in weights  # a tied checkpoint (and trainer) has the embedding only
    engine.update_weights(iter(weights.items()))
    buckets = engine.llm.loaded
    assert len(buckets) > 3
    sent = [name for bucket in buckets for name, _ in bucket]
    assert sorted(sent) == sorted([*weights, "lm_head.weight"])  # the tied head goes with the embedding
    for bucket in buckets:
        names = {name for name, _ in bucket}
        for layer in (0, 1):
            for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
                part = "self_attn" if group[0] == "q_proj" else "mlp"
                full = {f"model.layers.{layer}.{part}.{g}.weight" for g in group}
                assert not (names & full) or full <= names, f"bucket splits {sorted(full)}: {sorted(names)}"
    # Staged copies: the engine's dtype (bfloat16), one storage for the embedding and the tied head.
    handle = dict(buckets[0])
    assert handle["model.embed_tokens.weight"][1][1] == "torch.bfloat16"
    assert handle["model.embed_tokens.weight"][1][2] == handle["lm_head.weight"][1][2]
    tail = [e[1] for e in events[-2:]]
    assert tail == ["update_weights(None)", "verl_reset_prefix_cache"]


def test_standin_bad_first_bucket_sends_nothing(model_path, rollout):
    events = []
    engine = _engine(model_path, rollout, events)
    del events[:]
    bad = [("model.embed_tokens.weigth", torch.zeros(104, 32)), *_weights(model_path).items()]
    with pytest.raises(UnknownWeightError, match="did you mean"):
        engine.update_weights(iter(bad))
    assert events == []
    with pytest.raises(ValueError, match="has shape"):
        engine.check_weights([("model.norm.weight", (31,))])
    with pytest.raises(ValueError, match="sent without"):
        engine.check_weights([("model.layers.0.self_attn.q_proj.weight", (32, 32))])
    engine.check_weights([(n, tuple(t.shape)) for n, t in _weights(model_path).items()])


def test_standin_error_after_loaded_buckets_finalizes_and_says_so(model_path, rollout):
    events = []
    small = _Rollout(rollout, checkpoint_engine=type("C", (), {"update_weights_bucket_megabytes": 1 / 1024})())
    engine = _engine(model_path, small, events)
    del events[:]
    stream = [*_weights(model_path).items(), ("model.norm.weight", torch.zeros(31))]
    with pytest.raises(RuntimeError, match=r"bucket\(s\) were loaded before this error"):
        engine.update_weights(iter(stream))
    assert [e[1] for e in events[-2:]] == ["update_weights(None)", "verl_reset_prefix_cache"]
    assert sum(1 for e in events if e[1] == "update_weights") >= 2


def test_standin_update_copies_each_tensor_before_asking_for_the_next(model_path, rollout):
    """The sender may reuse a tensor's buffer once asked for the next one (``RolloutEngine.update_weights``): what
    the worker is handed must be the values sent, even when a bucket holds many tensors."""
    events = []
    engine = _engine(model_path, rollout, events)
    weights = _weights(model_path)

    def reusing_sender():
        previous = None
        for name, tensor in weights.items():
            if previous is not None:
                previous.fill_(float("nan"))  # the buffer of the tensor sent before is reused
            previous = tensor.clone()
            yield name, previous
        previous.fill_(float("nan"))

    engine.update_weights(reusing_sender())
    assert len(engine.llm.loaded) == 1  # one 2 GiB bucket: every tensor waits there for the last one
    handed = {name: handle[1][3] for bucket in engine.llm.loaded for name, handle in bucket}
    for name, tensor in weights.items():
        assert torch.equal(handed[name], tensor.to(torch.bfloat16)), name
    assert torch.equal(handed["lm_head.weight"], weights["model.embed_tokens.weight"].to(torch.bfloat16))


def test_standin_worker_failing_on_the_first_bucket_still_finalizes(model_path, rollout):
    """TensorRT-LLM's ``WorkerExtension.update_weights`` runs ``pre_reload_weights`` on every module before it loads
    the first payload, so a reload that fails there leaves the model mid-update: the engine finalises it."""
    events = []
    engine = _engine(model_path, rollout, events, fail_update=0)
    del events[:]
    with pytest.raises(RuntimeError, match=r"0 bucket\(s\) were loaded .*part of the failing one"):
        engine.update_weights(iter(_weights(model_path).items()))
    assert [e[1] for e in events] == ["update_weights failed", "update_weights(None)", "verl_reset_prefix_cache"]


def test_standin_sleep_after_waking_the_weights_only_releases_them_again(model_path, rollout):
    events = []
    engine = _engine(model_path, rollout, events, TRTLLMRolloutOptions(sleep_level=2))
    engine.sleep()
    engine.wake_up(["weights"])
    engine.update_weights(iter(_weights(model_path).items()))
    del events[:]
    engine.sleep()  # the KV cache is still released; the woken weights go again
    assert events == [("release", WEIGHT_TAGS)]
    engine.sleep()
    assert events == [("release", WEIGHT_TAGS)]
    with pytest.raises(RuntimeError, match="discarded by sleep"):  # level 2: the weights were discarded again
        engine.generate(_prompts(engine))


def test_standin_close_shuts_trtllm_down(model_path, rollout):
    events = []
    engine = _engine(model_path, rollout, events)
    engine.close()
    engine.close()
    assert events[-1] == ("shutdown",) and sum(e == ("shutdown",) for e in events) == 1
    assert engine.weight_layout() is None and engine._worker_uuid == UUID
