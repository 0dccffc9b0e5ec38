"""``TRTLLMRolloutEngine``: verl's :class:`~verl.engines.base.RolloutEngine` on a ``tensorrt_llm.LLM``.

Hybrid (colocated) mode, as verl's ``RolloutMode.HYBRID``: the trainer's worker process builds the ``LLM``
(PyTorch backend); TensorRT-LLM runs its model in a Ray GPU worker on the same GPU (its Ray orchestrator, the
only one with worker extensions and collective RPC). Token-in/token-out: the prompt ids the trainer built go in
(padding stripped), the response ids come back untouched, laid out exactly like core's ``hf`` engine
(:func:`verl.engines.reference.postprocess.build_rollout_batch`). Weights reach TensorRT-LLM's worker as CUDA
IPC handles of staged bucket copies (:mod:`verl_trtllm.weights`); sleep and wake-up are ``LLM.release`` /
``LLM.resume`` with TensorRT-LLM's memory tags (:func:`verl_trtllm.translate.release_tags`).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from verl.engines.prompts import check_prompt_batch, eos_token_ids
from verl.engines.reference.postprocess import build_rollout_batch
from verl.engines.reference.sampling import resolve_sampling_params
from verl.engines.weight_sync.names import (
    UnknownWeightError,
    check_specs,
    checkpoint_shapes,
    tied_embeddings,
    update_buckets,
)
from verl_trtllm.backend import device_type, load_binding
from verl_trtllm.engine_args import llm_kwargs, resolve_dtype_name, resolve_sampler
from verl_trtllm.options import TRTLLMRolloutOptions
from verl_trtllm.rollout_keys import TRTLLM_MAX_NUM_TOKENS
from verl_trtllm.translate import (
    VERL_TAGS,
    collect_outputs,
    max_tokens_per_row,
    release_tags,
    row_seeds,
    sampling_kwargs,
    strip_left_padding,
)
from verl_trtllm.weights import ipc_payload, stage_stream

if TYPE_CHECKING:
    from verl.protocol import DataProto

__all__ = ["ModelTooLongError", "TRTLLMRolloutEngine", "UnknownWeightError"]


class ModelTooLongError(ValueError):
    """``rollout.prompt_length + rollout.response_length`` exceeds the engine's context (``max_seq_len``)."""


def _cfg(config: Any, name: str, default: Any) -> Any:
    value = getattr(config, name, default)
    return default if value is None else value


class TRTLLMRolloutEngine:
    """Batched generation with a ``tensorrt_llm.LLM`` beside the trainer (one per worker process, one GPU).

    Args:
        model_path: HF model folder or a name :func:`verl.models.resolve_model_path` resolves. A live
            ``nn.Module`` is refused: TensorRT-LLM loads its own copy.
        tokenizer: HF tokenizer (its ``eos_token_id``/``pad_token_id`` are used); None loads it from the path.
        config: rollout section (verl names, read with ``getattr``): sampling (``temperature``, ``top_p``,
            ``top_k``, ``do_sample``, ``val_kwargs``), ``prompt_length``, ``response_length`` (512),
            ``calculate_log_probs``, ``dtype``, ``seed`` (0), ``ignore_eos``, the engine keys of
            :mod:`verl_trtllm.rollout_keys`, ``checkpoint_engine.update_weights_bucket_megabytes``.
        device: ``cuda[:i]`` (anything else raises).
        options: :class:`~verl_trtllm.options.TRTLLMRolloutOptions`, the validated ``engine_kwargs.trtllm``; None =
            the defaults.
        model_config: ``actor_rollout_ref.model`` (``trust_remote_code``, ``override_config``); None = the saved config.
        binding: the TensorRT-LLM objects used (:class:`verl_trtllm.backend.TRTLLMBinding`); None imports
            TensorRT-LLM. Tests pass a recording stand-in here.

    Raises:
        UnsupportedDeviceError (ValueError): a device other than cuda.
        TRTLLMNotInstalledError (ImportError): TensorRT-LLM missing (the message has the install command).
        ModelTooLongError (ValueError): ``prompt_length + response_length`` over the context limit.
        ValueError: ``tensor_model_parallel_size != 1``, an ``override_config`` key the model lacks, no EOS id.
        RuntimeError: TensorRT-LLM's worker runs on another GPU than this process (CUDA IPC needs the same one).
        TypeError: a live module instead of a path, or options of another type.
    """

    def __init__(
        self,
        model_path: Any,
        tokenizer: Any = None,
        config: Any = None,
        *,
        device: Any = "cuda",
        options: Any = None,
        model_config: Any = None,
        binding: Any = None,
    ) -> None:
        if isinstance(model_path, torch.nn.Module):
            raise TypeError(
                "rollout engine 'trtllm' loads its own copy of the weights: pass a model path, not a live module "
                "(the trtllm spec does not declare the share_module capability)"
            )
        self.device_type = device_type(device)
        if options is None:
            options = TRTLLMRolloutOptions()
        elif not isinstance(options, TRTLLMRolloutOptions):
            raise TypeError(
                "rollout engine 'trtllm': options must be a TRTLLMRolloutOptions (verl.config.role_options(cfg, "
                f"'rollout', spec)) or None, got {type(options).__name__}"
            )
        tp = int(_cfg(config, "tensor_model_parallel_size", 1))
        if tp != 1:
            raise ValueError(
                f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}: the trtllm engine runs one TensorRT-LLM "
                "worker on the trainer's GPU; only 1 is built"
            )
        self.config, self.options = config, options
        self._binding = binding if binding is not None else load_binding()
        from verl.models import load_tokenizer, resolve_model_path
        from verl.models.hf_config import load_hf_config, split_override_config

        self.model_path = resolve_model_path(os.fspath(model_path))
        trust = bool(getattr(model_config, "trust_remote_code", False))
        override = getattr(model_config, "override_config", None)
        # Checked before TensorRT-LLM starts: an override key the model lacks fails here, naming it.
        self.hf_config = load_hf_config(str(self.model_path), trust_remote_code=trust, override_config=override)
        _load_time, overrides = split_override_config(override)
        self.tokenizer = (
            tokenizer if tokenizer is not None else load_tokenizer(self.model_path, trust_remote_code=trust)
        )
        self.eos_token_ids = eos_token_ids(self.tokenizer, self.model_path)
        if not self.eos_token_ids:
            raise ValueError("rollout engine 'trtllm': neither the tokenizer nor generation_config defines an EOS id")
        pad = getattr(self.tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_ids[0]
        self.max_seq_len = self._max_seq_len()
        self.dtype = resolve_dtype_name(options, config)
        self._torch_dtype = getattr(torch, self.dtype)
        self._shapes = checkpoint_shapes(self.model_path)
        self._tied = tied_embeddings(self.model_path)
        self.max_num_tokens = int(_cfg(config, "max_num_batched_tokens", TRTLLM_MAX_NUM_TOKENS))
        self.chunked_prefill = bool(_cfg(config, "enable_chunked_prefill", False))
        self.sleep_mode = bool(options.enable_sleep_mode)
        self.sleep_level = int(options.sleep_level)
        self.engine_seed = int(_cfg(config, "seed", 0))
        self.sampler, pass_sampler = resolve_sampler(options.sampler_type, self._binding.llm_fields)
        self.llm_kwargs = llm_kwargs(
            model_path=str(self.model_path),
            rollout=config,
            options=options,
            max_seq_len=self.max_seq_len,
            dtype=self.dtype,
            trust_remote_code=trust,
            model_overrides=overrides,
            memory_tags=self._binding.memory_tags,
            sampler=self.sampler if pass_sampler else None,
        )
        start = time.perf_counter()
        self.llm = self._binding.LLM(**self.llm_kwargs)
        self.startup_seconds = time.perf_counter() - start
        self._worker_uuid = self._same_gpu()
        self._asleep = False
        self._awake: set[str] = set()
        self._weights_stale = False
        self._rows_sampled = 0
        self.last_stats: dict[str, float] = {}

    # ------------------------------------------------------------------ construction helpers
    def _max_seq_len(self) -> int:
        model_limit = getattr(self.hf_config, "max_position_embeddings", None)
        prompt_len = getattr(self.config, "prompt_length", None)
        resp_len = int(_cfg(self.config, "response_length", 512))
        set_len = getattr(self.config, "max_model_len", None)
        needed = int(prompt_len) + resp_len if prompt_len is not None else None
        limit = set_len if set_len is not None else needed if needed is not None else model_limit
        if limit is None:
            raise ValueError(
                "rollout engine 'trtllm': the model config has no max_position_embeddings; set "
                "actor_rollout_ref.rollout.max_model_len"
            )
        if model_limit is not None and int(limit) > int(model_limit):
            raise ModelTooLongError(
                f"the TensorRT-LLM engine's context ({limit} tokens, "
                f"{'rollout.max_model_len' if set_len is not None else 'prompt_length + response_length'}) exceeds "
                f"the model's max_position_embeddings ({model_limit}); lower data.max_prompt_length / "
                "data.max_response_length" + (" or rollout.max_model_len" if set_len is not None else "")
            )
        if needed is not None and needed > int(limit):
            raise ModelTooLongError(
                f"rollout.prompt_length ({prompt_len}) + rollout.response_length ({resp_len}) = {needed} tokens exceeds "
                f"the TensorRT-LLM engine's max_seq_len ({limit}, from rollout.max_model_len); raise it or lower the "
                "lengths"
            )
        return int(limit)

    def _same_gpu(self) -> str:
        """The UUID of TensorRT-LLM's worker GPU, checked to be this process's (CUDA IPC opens memory there)."""
        reported = list(self.llm._collective_rpc("report_device_id"))
        device = self._binding.staging_device()
        mine = self._binding.device_uuid(device.index if device.index is not None else 0)
        if reported != [mine]:
            with contextlib.suppress(Exception):
                self.llm.shutdown()
            raise RuntimeError(
                f"TensorRT-LLM's worker runs on GPU {reported}, this trainer process on {mine} ({device}); the weight "
                "sync hands CUDA IPC handles over, which needs one GPU for both: run one trainer worker per GPU "
                "(trainer.n_gpus_per_node=1) with CUDA_VISIBLE_DEVICES naming that GPU"
            )
        return mine

    def weight_layout(self) -> Any:
        """None: one process holds the whole model (no tensor-parallel split to follow)."""
        return None

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: DataProto) -> DataProto:
        """Generate one response per row of ``prompts`` (the trainer already repeated rows ``n`` times).

        Input: ``prompts.batch["input_ids"]`` and ``["attention_mask"]`` ``(bs, prompt_len)`` left-padded; optional
        ``sample_seed`` ``(bs,)`` int64 per-row seeds. ``meta_info`` may hold ``seed``, ``validate`` (greedy
        ``val_kwargs``), ``do_sample``, ``temperature``, ``top_p``, ``top_k``, ``response_length``.

        Output (on the input's device): ``prompts, responses, response_mask, input_ids, attention_mask,
        position_ids`` as core's ``hf`` engine (``resp_len = response_length``) and ``rollout_log_probs``
        ``(bs, resp_len)`` float32 when ``config.calculate_log_probs``: TensorRT-LLM's log-prob of each generated
        token, 0 on padding. ``meta_info["timing"]["generate_sequences"]`` holds the wall time in seconds.

        Raises:
            KeyError: ``input_ids`` / ``attention_mask`` missing.
            ValueError: not left-padded, an empty row, a prompt with no room in ``max_seq_len`` (or, without
                chunked prefill, longer than ``max_num_tokens``).
            RuntimeError: the weights were discarded by a level-2 sleep and not updated since; a request that did
                not finish; log-probs missing.
        """
        from verl.protocol import DataProto

        start = time.perf_counter()
        batch = prompts.batch
        present = set(batch.keys()) if batch is not None else set()
        for key in ("input_ids", "attention_mask"):
            if key not in present:
                raise KeyError(f"TRTLLMRolloutEngine.generate: prompts.batch needs {key!r} (bs, prompt_len)")
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        meta = prompts.meta_info or {}
        params = resolve_sampling_params(self.config, meta)
        resp_len = int(meta.get("response_length") or _cfg(self.config, "response_length", 512))
        check_prompt_batch(input_ids, attention_mask, resp_len)
        if self._asleep:
            self.wake_up()
        if self._weights_stale:
            raise RuntimeError(
                "TRTLLMRolloutEngine.generate: the weights were discarded by sleep (sleep_level=2); call "
                "update_weights before generating (or use engine_kwargs.trtllm.sleep_level=1)"
            )
        rows = strip_left_padding(input_ids, attention_mask)
        bs = len(rows)
        seeds = row_seeds(
            bs,
            batch["sample_seed"] if "sample_seed" in present else None,
            meta.get("seed"),
            params.greedy,
            engine_seed=self.engine_seed,
            offset=self._rows_sampled,
        )
        caps = max_tokens_per_row(
            [len(r) for r in rows],
            resp_len,
            self.max_seq_len,
            max_num_tokens=self.max_num_tokens,
            chunked_prefill=self.chunked_prefill,
        )
        want_lp = bool(_cfg(self.config, "calculate_log_probs", False))
        ignore_eos = bool(_cfg(self.config, "ignore_eos", False))
        sampling = [
            self._binding.SamplingParams(
                **sampling_kwargs(
                    params,
                    max_tokens=caps[i],
                    eos_token_ids=self.eos_token_ids,
                    pad_token_id=self.pad_token_id,
                    sampler=self.sampler,
                    logprobs=want_lp,
                    seed=seeds[i],
                    ignore_eos=ignore_eos,
                )
            )
            for i in range(bs)
        ]
        outputs = self.llm.generate(rows, sampling_params=sampling, use_tqdm=False) if bs else []
        if not params.greedy:
            self._rows_sampled += bs
        responses, lengths, log_probs = collect_outputs(outputs, resp_len, self.pad_token_id, want_lp)
        device = input_ids.device
        tensors = build_rollout_batch(
            input_ids,
            attention_mask,
            responses.to(device),
            lengths.to(device),
            self.pad_token_id,
            log_probs.to(device) if want_lp else None,
        )
        seconds = time.perf_counter() - start
        n_tokens = int(lengths.sum())
        self.last_stats = {"seconds": seconds, "tokens": n_tokens, "tokens_per_s": n_tokens / max(seconds, 1e-9)}
        return DataProto.from_dict(tensors=tensors, meta_info={"timing": {"generate_sequences": seconds}})

    # ------------------------------------------------------------------ weights
    def check_weights(self, specs: Any) -> None:
        """Refuse an update of these ``(hf_name, shape)`` pairs before anything is sent (names and full shapes of
        the checkpoint, fused q/k/v and gate/up groups complete).

        Raises:
            UnknownWeightError (KeyError): a name the checkpoint does not have (closest names suggested).
            ValueError: a shape mismatch, or part of a fused group.
        """
        check_specs(specs, self._shapes, engine="trtllm")

    def update_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Load ``(hf_name, tensor)`` pairs into TensorRT-LLM's model, then reset its prefix cache.

        Each tensor is copied onto this GPU in the engine's dtype as it arrives, before the next one is asked for
        (the sender may reuse its buffers), and the copies are cut into buckets of about
        ``checkpoint_engine.update_weights_bucket_megabytes`` that each hold whole fused groups
        (:func:`verl.engines.weight_sync.names.update_buckets`, which checks each bucket's names and shapes first);
        each bucket is handed over as CUDA IPC handles (``_collective_rpc("update_weights", payload)``,
        TensorRT-LLM's partial reload) and freed once the worker has loaded it. After the last bucket
        ``update_weights(None)`` finalises the load (post-load processing) and ``verl_reset_prefix_cache`` drops
        every KV block computed with the old weights. Names not sent keep their values. With tied embeddings
        ``lm_head.weight`` goes with ``model.embed_tokens.weight``. An update while asleep wakes the weights first
        (verl's order: weights before the sync).

        Raises:
            UnknownWeightError (KeyError) / ValueError: a bad name, shape or split fused group in the first bucket:
                nothing was sent.
            RuntimeError: such an error after some buckets were loaded, or the worker's own error on any bucket
                (TensorRT-LLM prepares every module for a reload before it loads the first one): the load was
                finalised, and the model holds a partial update.
        """
        if self._asleep and "weights" not in self._awake:
            self.wake_up(["weights"])
        megabytes = getattr(getattr(self.config, "checkpoint_engine", None), "update_weights_bucket_megabytes", None)
        bucket_bytes = int((megabytes or 2048) * (1 << 20))
        staged = stage_stream(weights, self._binding.staging_device(), self._torch_dtype)
        loaded, in_worker = 0, False
        try:
            # copy=False: stage_stream already made a fresh copy of each tensor.
            for bucket in update_buckets(
                staged, self._shapes, bucket_bytes=bucket_bytes, tied=self._tied, engine="trtllm", copy=False
            ):
                payload = ipc_payload(bucket, self._worker_uuid, self._binding.reduce_tensor)
                in_worker = True
                self.llm._collective_rpc("update_weights", args=(payload,))
                in_worker = False
                loaded += 1
                del bucket  # the worker has loaded it: the call returned
        except Exception as exc:
            if not loaded and not in_worker:
                raise
            self._finalize_update()
            failing = " and the worker may have loaded part of the failing one" if in_worker else ""
            raise RuntimeError(
                f"update_weights (trtllm): {loaded} bucket(s) were loaded before this error{failing}, so the model "
                f"now holds a partial update ({type(exc).__name__}: {exc}); check the update first "
                "(check_weights) and send it again"
            ) from exc
        self._finalize_update()
        self._weights_stale = False

    def _finalize_update(self) -> None:
        self.llm._collective_rpc("update_weights", args=(None,))
        self.llm._collective_rpc("verl_reset_prefix_cache")

    # ------------------------------------------------------------------ memory
    def _call_memory(self, name: str, rpc: str, tags: list[str]) -> None:
        """``LLM.release`` / ``LLM.resume`` where the installed LLM has them, else the worker's ``sleep`` / ``wakeup``."""
        method = getattr(self.llm, name, None)
        if callable(method) and not inspect.iscoroutinefunction(method):
            method(tags)
        else:
            self.llm._collective_rpc(rpc, args=(tags,))

    def sleep(self) -> None:
        """Free the GPU memory of the weights and the KV cache between generations (hybrid mode).

        ``LLM.release(weights tags + ["kv_cache"])`` (verl's full tag list): at ``sleep_level`` 1 the weights are
        backed up in host memory and come back on wake-up; at level 2 they are discarded (``update_weights`` must
        follow before the next ``generate``). Asleep with some tags woken (the weights, for a sync), it releases
        those again. A no-op with ``enable_sleep_mode=false`` or when nothing is awake.
        """
        if not self.sleep_mode:
            return
        again = [tag for tag in VERL_TAGS if not self._asleep or tag in self._awake]
        if not again:
            return
        tags = self._binding.memory_tags
        self._call_memory("release", "sleep", [t for tag in again for t in release_tags(tags, tag)])
        self._asleep = True
        self._awake = set()
        if "weights" in again:
            self._weights_stale = self.sleep_level == 2

    def wake_up(self, tags: Any = None) -> None:
        """Undo :meth:`sleep` for ``tags`` (``weights``, ``kv_cache``; None = both, weights first); a no-op when
        awake. :meth:`generate` wakes everything itself.

        Raises:
            ValueError: an unknown tag.
        """
        wanted = list(VERL_TAGS) if tags is None else list(tags)
        bad = [t for t in wanted if t not in VERL_TAGS]
        if bad:
            raise ValueError(f"wake_up tags must be among {list(VERL_TAGS)}, got {bad}")
        if not self._asleep:
            return
        for tag in wanted:
            if tag not in self._awake:
                self._call_memory("resume", "wakeup", release_tags(self._binding.memory_tags, tag))
                self._awake.add(tag)
        if set(VERL_TAGS) <= self._awake:
            self._asleep = False
            self._awake = set()

    def close(self) -> None:
        """Shut TensorRT-LLM down (its worker and, if it started one, its Ray cluster); unusable afterwards."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            llm.shutdown()
