"""``VLLMRolloutEngine``: verl's :class:`~verl.engines.base.RolloutEngine` on an in-process ``vllm.LLM``.

Hybrid (colocated) mode, as verl's ``RolloutMode.HYBRID`` (anatomy §6.1, §6.3): the vLLM engine core runs
inside the worker process that also holds the training engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
so weight sync hands tensors to the live vLLM model without files or IPC. Token-in/token-out: the
prompt ids the trainer built are sent as ``TokensPrompt`` (padding stripped) and the response ids come
back untouched, laid out exactly like core's ``hf`` engine (:func:`verl.engines.reference.postprocess.
build_rollout_batch`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from verl.engines.prompts import check_prompt_batch, eos_token_ids
from verl.engines.reference.postprocess import build_rollout_batch
from verl.engines.reference.sampling import resolve_sampling_params
from verl_vllm.backend import device_type, engine_environment, import_vllm
from verl_vllm.engine_args import passthrough_arguments
from verl_vllm.lora import AdapterSlot, LoraServing, lora_engine_arguments
from verl_vllm.rollout_keys import device_problems, engine_arguments, load_format, options_from_rollout
from verl_vllm.translate import collect_outputs, max_tokens_per_row, row_seeds, sampling_kwargs, strip_left_padding
from verl_vllm.weights import UnknownWeightError, check_specs, checkpoint_shapes, reload_batches, tied_embeddings

if TYPE_CHECKING:
    from verl.protocol import DataProto
    from verl_vllm.server import VLLMRolloutServer

__all__ = ["ModelTooLongError", "UnknownWeightError", "VLLMRolloutEngine"]


class ModelTooLongError(ValueError):
    """``rollout.prompt_length + rollout.response_length`` exceeds the engine's ``max_model_len``."""


def _cfg(config: Any, name: str, default: Any) -> Any:
    value = getattr(config, name, default)
    return default if value is None else value


class VLLMRolloutEngine(LoraServing):
    """Batched generation with an in-process ``vllm.LLM`` (one per worker process).

    Args:
        model_path: HF model folder or a name :func:`verl.models.resolve_model_path` resolves (e.g.
            ``smollm2-135m-instruct``). A live ``nn.Module`` is refused: vLLM loads its own copy.
        tokenizer: HF tokenizer (its ``eos_token_id``/``pad_token_id`` are used); None loads it from the path.
        config: rollout config section (verl names, read with ``getattr``): ``temperature`` (1.0), ``top_p``
            (1.0), ``top_k`` (-1), ``do_sample`` (True), ``prompt_length``, ``response_length`` (512),
            ``calculate_log_probs`` (False), ``val_kwargs`` (greedy), ``dtype``, ``seed`` (0), and verl's engine
            keys (``gpu_memory_utilization`` ... ``load_format``, ``ignore_eos``: :mod:`verl_vllm.rollout_keys`),
            which lie over ``options``. Its ``engine_kwargs`` are not read.
        device: ``cpu`` or ``cuda[:i]``.
        options: :class:`~verl_vllm.options.VLLMRolloutOptions`, the validated ``engine_kwargs.vllm``
            (the factory passes ``verl.config.role_options``); None = the defaults.
        model_config: the ``actor_rollout_ref.model`` section: ``trust_remote_code`` reaches ``vllm.LLM``, the
            tokenizer and HF-config loads, ``override_config`` becomes vLLM's ``hf_overrides``
            (:mod:`verl_vllm.model_config`). None = the saved config, no remote code.
        lora_rank: > 0 serves the actor's LoRA adapter of that rank (:mod:`verl_vllm.lora`; the factory decides
            with :func:`verl.config.validate_lora.serves_lora_adapters`): :meth:`load_lora_adapter` takes it, every
            request carries it. 0 = plain weights (merged LoRA comes through :meth:`update_weights`).

    Tensor parallelism: ``config.tensor_model_parallel_size = T`` in a torch.distributed world of ``W`` ranks
    (``T`` dividing ``W``) builds every engine with ``distributed_executor_backend="external_launcher"``:
    consecutive ``T`` ranks are one vLLM engine (TP group), ``W / T`` engines in all; every rank of a group
    must call :meth:`generate` and :meth:`update_weights` with the same arguments.

    Serving (``rollout.mode=async``): :meth:`server` gives a :class:`~verl_vllm.server.VLLMRolloutServer` on this
    same vLLM engine; while it has requests in flight :meth:`generate`, :meth:`update_weights`, :meth:`sleep` and
    :meth:`wake_up` raise ``RuntimeError``.

    Raises:
        UnsupportedDeviceError (ValueError): a device other than cpu/cuda.
        VLLMNotInstalledError (ImportError): vLLM missing; names ``pip install './plugins/verl-vllm[cpu]'``/``[cuda]``.
        ModelTooLongError (ValueError): ``prompt_length + response_length > max_model_len``.
        ValueError: an ``override_config`` key the model config lacks (named with a close spelling).
        TypeError: a live module instead of a path.
    """

    def __init__(
        self,
        model_path: Any,
        tokenizer: Any = None,
        config: Any = None,
        *,
        device: Any = "cpu",
        options: Any = None,
        model_config: Any = None,
        lora_rank: int = 0,
    ) -> None:
        if isinstance(model_path, torch.nn.Module):
            raise TypeError(
                "rollout engine 'vllm' loads its own copy of the weights: pass a model path, not a live module "
                "(the vllm spec does not declare the share_module capability)"
            )
        self.device_type = device_type(device)
        self.config = config
        # The validated engine_kwargs.vllm (from the factory) under verl's first-class rollout keys.
        self.options = options_from_rollout(config, options)
        problems = device_problems(config, self.options, self.device_type)
        if problems:
            raise ValueError("rollout engine 'vllm': " + "; ".join(problems))
        vllm = import_vllm(self.device_type)
        from verl.models import load_tokenizer, resolve_model_path
        from verl_vllm.model_config import hf_overrides, load_model_config, trust_remote_code

        self.model_path = resolve_model_path(os.fspath(model_path))
        trust = trust_remote_code(model_config)
        # The overridden config, checked before vLLM starts; its context length sizes max_model_len.
        self.hf_config = load_model_config(self.model_path, model_config)
        self.tokenizer = (
            tokenizer if tokenizer is not None else load_tokenizer(self.model_path, trust_remote_code=trust)
        )
        self.eos_token_ids = eos_token_ids(self.tokenizer, self.model_path)
        if not self.eos_token_ids:
            raise ValueError("rollout engine 'vllm': neither the tokenizer nor generation_config defines an EOS id")
        pad = getattr(self.tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_ids[0]
        self.max_model_len = self._max_model_len()
        self._checkpoint_shapes = checkpoint_shapes(self.model_path)
        self._tied = tied_embeddings(self.model_path)
        self.tp_size, self.layout = self._parallel_layout()
        self.dtype = self.options.dtype or self._config_dtype()
        self.sleep_level = int(self.options.sleep_level)
        self.sleep_mode = self.device_type == "cuda" and bool(self.options.enable_sleep_mode)
        self.ignore_eos = bool(_cfg(config, "ignore_eos", False))
        os.environ.update(engine_environment(self.options, self.device_type))
        seed = self.options.seed if self.options.seed is not None else int(_cfg(config, "seed", 0))
        kwargs: dict[str, Any] = {
            "model": str(self.model_path),
            "dtype": self.dtype,
            "seed": int(seed),
            "max_model_len": self.max_model_len,
            "max_num_seqs": int(self.options.max_num_seqs),
            "enable_prefix_caching": bool(self.options.enable_prefix_caching),
            "enforce_eager": self._enforce_eager(),
            # Log-probs of the distribution actually sampled from (logits / T), as verl configures vLLM.
            "logprobs_mode": "processed_logprobs",
            "tensor_parallel_size": self.tp_size,
            "load_format": load_format(config),
            **engine_arguments(config),
            # compilation_config (merged with rollout.cudagraph_capture_sizes), kv_cache_dtype, async_scheduling,
            # additional_config: vLLM's own arguments, as verl's server passes engine_kwargs.vllm.
            **passthrough_arguments(config, self.options),
        }
        if self.layout is not None:
            # SPMD inside the trainer's world: each process is one TP rank; consecutive tp_size ranks form one
            # engine (vLLM's "external DP" layout), every rank of a group gets the same requests.
            kwargs["distributed_executor_backend"] = "external_launcher"
        chunked = self.options.enable_chunked_prefill
        if chunked is None and self.device_type == "cpu":
            # vLLM 0.32 rewinds a seeded request's generator after a partial (chunked) prefill with
            # Generator.set_offset, which CPU generators lack: whole prefills only (one step or several).
            chunked = False
        if chunked is not None:
            kwargs["enable_chunked_prefill"] = bool(chunked)
        if self.options.max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = int(self.options.max_num_batched_tokens)
        if self.device_type == "cuda":
            kwargs["gpu_memory_utilization"] = float(self.options.gpu_memory_utilization)
            kwargs["enable_sleep_mode"] = self.sleep_mode
        kwargs["trust_remote_code"] = trust
        overrides = hf_overrides(model_config)
        if overrides:
            kwargs["hf_overrides"] = overrides
        if lora_rank > 0:
            kwargs.update(lora_engine_arguments(lora_rank, getattr(model_config, "lora", None)))
            # verl: a served adapter's base stays resident (level 2 would discard the weights it is added to).
            self.sleep_level = min(self.sleep_level, 1)
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process; the
        # colocated trainer keeps control of its thread count, so the original is put back.
        set_num_threads = torch.set_num_threads
        local_world = os.environ.get("LOCAL_WORLD_SIZE")
        start = time.perf_counter()
        try:
            self.llm = vllm.LLM(**kwargs)
        finally:
            torch.set_num_threads = set_num_threads
            # vLLM's CPU platform overwrites LOCAL_WORLD_SIZE with the TP size; the trainer's workers read it.
            if local_world is None:
                os.environ.pop("LOCAL_WORLD_SIZE", None)
            else:
                os.environ["LOCAL_WORLD_SIZE"] = local_world
        self.startup_seconds = time.perf_counter() - start
        self._vllm = vllm
        self._asleep = False
        self._awake_tags: set[str] = set()
        self._weights_stale = False
        self._server: VLLMRolloutServer | None = None
        self.last_stats: dict[str, float] = {}
        self._adapter = AdapterSlot(self.llm, kwargs["max_lora_rank"]) if lora_rank > 0 else None

    # ------------------------------------------------------------------ construction helpers
    def _parallel_layout(self) -> tuple[int, Any]:
        """``(tensor_parallel_size, weight layout or None)`` from ``rollout.tensor_model_parallel_size`` and the
        torch.distributed world this process is a rank of.

        In a world of several ranks every rank receives *whole* weights from the sync (the layout's TP size
        is 1): vLLM's weight loaders take full HF tensors and narrow them to the rank's shard themselves (and
        on CPU repack them, so shards cannot be written in place). The sync streams them bucket by bucket.

        Raises:
            ValueError: a TP size that does not divide the world, or TP > 1 without a world of that many ranks.
        """
        import torch.distributed as dist

        from verl.engines.weight_sync.layout import TP_KEY, TensorParallelLayout, divisors

        tp = int(_cfg(self.config, "tensor_model_parallel_size", 1))
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if tp < 1 or world % tp or (tp > 1 and world < tp):
            raise ValueError(
                f"{TP_KEY}={tp}: the vllm rollout needs a torch.distributed world whose size is a multiple of it "
                f"(this process's world: {world} ranks; valid: {divisors(world)}); tensor parallelism runs one "
                "vLLM TP rank per trainer worker (trainer.controller=ray, trainer.n_gpus_per_node x nnodes workers)"
            )
        return tp, (TensorParallelLayout(world, 1, {}) if world > 1 else None)

    def weight_layout(self) -> Any:
        """Whole tensors on every rank (see :meth:`_parallel_layout`), or None in a one-process world."""
        return self.layout

    def _config_dtype(self) -> str:
        value = _cfg(self.config, "dtype", "auto")
        name = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}.get(str(value), str(value))
        if name == "auto":
            return "float32" if self.device_type == "cpu" else "bfloat16"
        return name

    def _enforce_eager(self) -> bool:
        if self.options.enforce_eager is not None:
            return bool(self.options.enforce_eager)
        return self.device_type == "cpu"

    def _max_model_len(self) -> int:
        model_limit = getattr(self.hf_config, "max_position_embeddings", None)
        prompt_len = getattr(self.config, "prompt_length", None)
        resp_len = int(_cfg(self.config, "response_length", 512))
        # verl's default: the longest sequence a rollout can make, not the model's whole context (SmolLM2:
        # 8192), so vLLM sizes its scheduler and KV blocks for what is used.
        needed = int(prompt_len) + resp_len if prompt_len is not None else None
        if self.options.max_model_len:
            limit = self.options.max_model_len
        elif needed is not None and model_limit is not None:
            limit = min(needed, int(model_limit))  # longer than the model allows: the check below says so
        else:
            limit = model_limit
        if limit is None:
            raise ValueError(
                "rollout engine 'vllm': the model config has no max_position_embeddings; set "
                "actor_rollout_ref.rollout.engine_kwargs.vllm.max_model_len"
            )
        if prompt_len is not None and int(prompt_len) + resp_len > int(limit):
            source = "engine_kwargs.vllm.max_model_len" if self.options.max_model_len else "max_position_embeddings"
            raise ModelTooLongError(
                f"rollout.prompt_length ({prompt_len}) + rollout.response_length ({resp_len}) = "
                f"{int(prompt_len) + resp_len} tokens exceeds the vLLM engine's max_model_len ({limit}, from "
                f"{source}); lower data.max_prompt_length / data.max_response_length"
                + ("" if self.options.max_model_len is None else " or raise engine_kwargs.vllm.max_model_len")
            )
        return int(limit)

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: DataProto) -> DataProto:
        """Generate one response per row of ``prompts`` (the trainer already repeated rows ``n`` times).

        Input: ``prompts.batch["input_ids"]`` and ``["attention_mask"]`` ``(bs, prompt_len)`` left-padded;
        optional ``sample_seed`` ``(bs,)`` int64 per-row sampler seeds. ``meta_info`` may hold ``seed``,
        ``validate`` (greedy ``val_kwargs``), ``do_sample``, ``temperature``, ``top_p``, ``top_k``,
        ``response_length`` (precedence as :func:`verl.engines.reference.sampling.resolve_sampling_params`).

        Output (on the input's device): ``prompts, responses, response_mask, input_ids, attention_mask,
        position_ids`` as core's ``hf`` engine, ``resp_len = response_length``, and ``rollout_log_probs``
        ``(bs, resp_len)`` float32 when ``config.calculate_log_probs``: vLLM's ``processed_logprobs`` of the
        chosen token, i.e. ``log_softmax(logits / T)`` (T = 1 when greedy) after top-k/top-p filtering
        (identical to the unfiltered value when both are off), 0 on padding.
        ``meta_info["timing"]["generate_sequences"]`` holds the wall time in seconds.

        Raises:
            KeyError: ``input_ids`` / ``attention_mask`` missing.
            ValueError: not left-padded, an empty prompt row, or a prompt with no room in ``max_model_len``.
            RuntimeError: the weights were discarded by a level-2 ``sleep`` and not updated since, or the
                :meth:`server` has requests in flight.
        """
        from verl.protocol import DataProto

        start = time.perf_counter()
        batch = prompts.batch
        present = set(batch.keys()) if batch is not None else set()
        for key in ("input_ids", "attention_mask"):
            if key not in present:
                raise KeyError(f"VLLMRolloutEngine.generate: prompts.batch needs {key!r} (bs, prompt_len)")
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        meta = prompts.meta_info or {}
        params = resolve_sampling_params(self.config, meta)
        resp_len = int(meta.get("response_length") or _cfg(self.config, "response_length", 512))
        _check_prompts(input_ids, attention_mask, resp_len)
        rows = strip_left_padding(input_ids, attention_mask)
        bs = len(rows)
        seeds = row_seeds(
            bs, batch["sample_seed"] if "sample_seed" in present else None, meta.get("seed"), params.greedy
        )
        caps = max_tokens_per_row([len(r) for r in rows], resp_len, self.max_model_len)
        want_lp = bool(_cfg(self.config, "calculate_log_probs", False))
        vllm = self._vllm
        requests = [vllm.inputs.TokensPrompt(prompt_token_ids=row) for row in rows]
        sampling = [
            vllm.SamplingParams(
                **sampling_kwargs(
                    params,
                    max_tokens=caps[i],
                    stop_token_ids=self.eos_token_ids,
                    logprobs=want_lp,
                    seed=seeds[i],
                    ignore_eos=self.ignore_eos,
                )
            )
            for i in range(bs)
        ]
        with self._exclusive("generate"):
            self._ready_for_generation("VLLMRolloutEngine.generate")
            lora = self.lora_request
            outputs = self.llm.generate(requests, sampling, use_tqdm=False, lora_request=lora) if bs else []
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

    def _ready_for_generation(self, owner: str) -> None:
        """Wake a sleeping engine; refuse weights a level-2 sleep discarded (RuntimeError naming ``owner``)."""
        if self._asleep:
            self._wake_up(None)
        if self._weights_stale:
            raise RuntimeError(
                f"{owner}: the weights were discarded by sleep(level=2); call update_weights before generating "
                "(or use engine_kwargs.vllm.sleep_level=1)"
            )

    # ------------------------------------------------------------------ serving (rollout.mode=async)
    def server(self) -> VLLMRolloutServer:
        """This engine's :class:`~verl_vllm.server.VLLMRolloutServer` (built once): concurrent token-in/token-out
        requests through this same vLLM engine's scheduler, so weight sync and sleep / wake-up keep acting on the
        model that serves.

        Raises:
            ValueError: ``tensor_model_parallel_size > 1`` (see :class:`~verl_vllm.server.VLLMRolloutServer`).
            RuntimeError: the engine was closed.
        """
        if "llm" not in self.__dict__:
            raise RuntimeError("VLLMRolloutEngine.server: the engine was closed")
        if self._server is None:
            from verl_vllm.server import VLLMRolloutServer

            self._server = VLLMRolloutServer(self)
        return self._server

    def _exclusive(self, what: str) -> contextlib.AbstractContextManager[None]:
        """The server's hold on the engine for ``what`` (it refuses while requests are in flight), if one exists."""
        server = self._server
        return server.exclusive(what) if server is not None else contextlib.nullcontext()

    # ------------------------------------------------------------------ weights and memory
    def check_weights(self, specs: Any) -> None:
        """Refuse an update of these ``(hf_name, shape)`` pairs before anything is loaded (names and full
        shapes of the checkpoint, fused q/k/v and gate/up groups complete).

        Raises:
            UnknownWeightError (KeyError): a name the checkpoint does not have (closest names suggested).
            ValueError: a shape mismatch, or part of a fused group.
        """
        check_specs(specs, self._checkpoint_shapes)

    def update_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Load ``(hf_name, tensor)`` pairs into the running vLLM model, then reset the prefix cache.

        The stream is cut into batches of about ``checkpoint_engine.update_weights_bucket_megabytes`` that
        each hold complete fused groups (:func:`verl_vllm.weights.reload_batches`); each batch goes through the
        worker's ``reload_weights`` (vLLM's in-place reload: the model's own ``load_weights`` fuses q/k/v and
        gate/up, narrows to this TP rank's shard, casts, and the layers' post-load processing runs again),
        inside this process. So the receiver holds one batch of whole tensors at a time, never the model.
        Each batch is checked first (names, shapes, complete groups): a bad batch raises and loads nothing;
        the trainer's sync checks the whole update up front (:meth:`check_weights`) so a bad update loads
        nothing at all. Names not sent keep their values. With tied embeddings ``lm_head.weight`` is loaded
        with ``model.embed_tokens.weight`` (vLLM's CPU LM head keeps a packed copy of its own).

        Raises:
            UnknownWeightError (KeyError): a name the checkpoint does not have (closest names suggested).
            ValueError: a shape mismatch, or part of a fused group.
            RuntimeError: the :meth:`server` has requests in flight (the update would change weights mid-request).
        """
        with self._exclusive("update_weights"):
            self._update_weights(weights)

    def _update_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        if self._asleep and "weights" not in self._awake_tags:
            self.llm.wake_up(tags=["weights"])
            self._awake_tags.add("weights")
        megabytes = getattr(getattr(self.config, "checkpoint_engine", None), "update_weights_bucket_megabytes", None)
        bucket = int((megabytes or 2048) * (1 << 20))
        for batch in reload_batches(weights, self._checkpoint_shapes, bucket_bytes=bucket, tied=self._tied):
            # vLLM's CPU and quantised layers repack weights after loading, so plain ``model.load_weights``
            # cannot reach them; reload_weights restores the checkpoint layout, loads and re-runs the processing.
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": iter(batch), "is_checkpoint_format": True}
            )
            del batch
        self.llm.reset_prefix_cache()
        self._weights_stale = False

    def sleep(self) -> None:
        """Free accelerator memory between generations (hybrid mode).

        cuda (with ``enable_sleep_mode``): ``LLM.sleep(level=sleep_level)``: level 1 offloads the weights to
        CPU memory and drops the KV cache; level 2 discards the weights too (``update_weights`` must follow).
        cpu: a no-op, by design: weights and KV cache already live in host memory, which is what sleeping
        would free them to, and vLLM's CPU backend has no sleep mode.

        Raises:
            RuntimeError: the :meth:`server` has requests in flight (also on cpu, where sleeping does nothing).
        """
        with self._exclusive("sleep"):
            if not self.sleep_mode or self._asleep:
                return
            self.llm.sleep(level=self.sleep_level)
            self._asleep = True
            self._awake_tags = set()
            self._weights_stale = self.sleep_level == 2

    def wake_up(self, tags: Any = None) -> None:
        """Undo :meth:`sleep` for ``tags`` (``weights``, ``kv_cache``; None = both; no-op when awake or on cpu);
        :meth:`generate` wakes everything itself.

        Raises:
            ValueError: an unknown tag.
            RuntimeError: the :meth:`server` has requests in flight.
        """
        with self._exclusive("wake_up"):
            self._wake_up(tags)

    def _wake_up(self, tags: Any) -> None:
        wanted = ("weights", "kv_cache") if tags is None else tuple(tags)
        bad = [t for t in wanted if t not in ("weights", "kv_cache")]
        if bad:
            raise ValueError(f"wake_up tags must be among ['weights', 'kv_cache'], got {bad}")
        if not self._asleep:
            return
        missing = [tag for tag in wanted if tag not in self._awake_tags]
        if missing:
            self.llm.wake_up(tags=missing)
            self._awake_tags.update(missing)
        if {"weights", "kv_cache"} <= self._awake_tags:
            self._asleep = False
            self._awake_tags = set()
            self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the vLLM engine down and free its memory (the engine is unusable afterwards); a :meth:`server`
        stops first and fails the requests it still had."""
        if self._server is not None:
            self._server.close()
        if self._adapter is not None:
            self._adapter.close()
        llm = self.__dict__.pop("llm", None)
        if llm is None:
            return
        engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if engine_core is not None and hasattr(engine_core, "shutdown"):
            engine_core.shutdown()
        del llm
        with contextlib.suppress(Exception):
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            destroy_distributed_environment()
        gc.collect()


def _check_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor, resp_len: int) -> None:
    # The context limit is checked separately against vLLM's max_model_len (its own message).
    check_prompt_batch(input_ids, attention_mask, resp_len)
