"""``SGLangRolloutEngine``: verl's :class:`~verl.engines.base.RolloutEngine` on an in-process ``sglang.Engine``.

Hybrid mode: the worker that trains also owns the rollout. ``sglang.Engine(**server_args)`` runs SGLang's
tokenizer manager in this process and its scheduler(s) in processes it spawns on the GPU(s); this engine talks to
it through the offline API (``srt/entrypoints/engine.py``): ``generate(input_ids=..., sampling_params=...,
return_logprob=...)`` token-in/token-out (``skip_tokenizer_init``), ``update_weights_from_tensor`` for the weight
sync (inside ``begin_weight_update()`` / ``end_weight_update()`` where the Engine has them: sglang 0.5.2x refuses
an update outside that session, verl's pinned 0.5.8 has no session), ``flush_cache`` (the prefix cache after new
weights), ``release_memory_occupation`` / ``resume_memory_occupation`` with tags for sleep / wake-up, and
``shutdown``. Outputs are laid out like core's ``hf`` engine (:func:`verl.engines.reference.postprocess.
build_rollout_batch`). Tensor parallelism: :mod:`verl_sglang.tp_group`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from verl.engines.prompts import check_prompt_batch, eos_token_ids
from verl.engines.reference.postprocess import build_rollout_batch
from verl.engines.reference.sampling import resolve_sampling_params
from verl.engines.weight_sync.names import UnknownWeightError, check_specs, checkpoint_shapes, tied_embeddings
from verl_sglang.backend import device_index, device_type, import_sglang, sglang_version
from verl_sglang.options import SGLangRolloutOptions
from verl_sglang.rollout_keys import check_config
from verl_sglang.server_args import ModelTooLongError, build_server_args, context_length, model_context_length
from verl_sglang.server_args_fields import server_args_fields
from verl_sglang.tp_group import make_tp_group
from verl_sglang.translate import (
    RELEASE_TAGS,
    collect_outputs,
    max_new_tokens_per_row,
    row_seeds,
    sampling_params,
    strip_left_padding,
    wake_tags,
)
from verl_sglang.weights import LOAD_FORMAT, BucketPacker, checked_buckets, dtype_groups, load_weight_api

if TYPE_CHECKING:
    from verl.protocol import DataProto

__all__ = ["ModelTooLongError", "SGLangEngineError", "SGLangRolloutEngine", "UnknownWeightError"]


class SGLangEngineError(RuntimeError):
    """SGLang answered a control call (weight update, session, cache flush) with ``success=False``."""


def _cfg(config: Any, name: str, default: Any) -> Any:
    value = getattr(config, name, default)
    return default if value is None else value


def check_result(result: Any, what: str) -> None:
    """Raise :class:`SGLangEngineError` when an Engine control call reports failure: ``(False, message)`` (weight
    updates and sessions) or an object with ``success=False`` (``flush_cache``); None and anything else pass."""
    if isinstance(result, (tuple, list)) and result and result[0] is False:
        message = result[1] if len(result) > 1 else ""
        raise SGLangEngineError(f"SGLang {what} failed: {message}")
    if getattr(result, "success", True) is False:
        raise SGLangEngineError(f"SGLang {what} failed: {getattr(result, 'message', '')}")


class SGLangRolloutEngine:
    """Batched generation with an in-process ``sglang.Engine`` (one per tensor-parallel group of workers).

    Args:
        model_path: HF model folder (``*.safetensors``) or a name :func:`verl.models.resolve_model_path` resolves.
            A live ``nn.Module`` is refused: SGLang loads its own copy.
        tokenizer: HF tokenizer (EOS / pad ids); None loads it from the path.
        config: the rollout section (verl names, read with ``getattr``): sampling (``temperature``, ``top_p``,
            ``top_k``, ``do_sample``, ``val_kwargs``, ``ignore_eos``), ``prompt_length``, ``response_length``,
            ``calculate_log_probs``, ``dtype``, ``seed``, ``tensor_model_parallel_size``,
            ``checkpoint_engine.update_weights_bucket_megabytes`` and the engine keys of
            :mod:`verl_sglang.rollout_keys`. Its ``engine_kwargs`` are read only by
            :func:`~verl_sglang.rollout_keys.check_config` (the config-load check, run again here); the engine
            takes its SGLang options from ``options``.
        device: the worker's device: ``cuda[:i]`` or ``npu[:i]`` (``cpu`` runs SGLang's source-built Xeon backend,
            without sleep mode).
        options: :class:`~verl_sglang.options.SGLangRolloutOptions` (the validated ``engine_kwargs.sglang``);
            None = the defaults.
        model_config: the ``actor_rollout_ref.model`` section: ``trust_remote_code`` and ``override_config``
            (SGLang's ``json_model_override_args``); None = the saved config.
        engine_cls: the engine class; None = ``sglang.Engine``. Tests pass a stand-in here.
        weight_api: :class:`~verl_sglang.weights.SGLangWeightAPI`; None = the installed sglang's, on first use.

    Raises:
        TypeError: a live module, or options of another type.
        UnsupportedDeviceError (ValueError): a device SGLang does not run on.
        ValueError: a rollout key the engine cannot take (:func:`verl_sglang.rollout_keys.check_config`), a TP
            size that does not divide the world, a ServerArgs field the installed sglang lacks.
        ModelTooLongError (ValueError): prompt + response does not fit the model's context.
        SGLangNotInstalledError (ImportError): sglang missing (only when ``engine_cls`` is None).
        RuntimeError: TP > 1 on cuda where the group's first rank cannot see the group's GPUs.
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
        engine_cls: Any = None,
        weight_api: Any = None,
    ) -> None:
        if isinstance(model_path, torch.nn.Module):
            raise TypeError(
                "rollout engine 'sglang' loads its own copy of the weights: pass a model path, not a live module"
            )
        self.device = torch.device(device)
        self.device_kind = device_type(self.device)
        self.config = config
        if options is None:
            options = SGLangRolloutOptions()
        elif not isinstance(options, SGLangRolloutOptions):
            raise TypeError(
                "rollout engine 'sglang': options must be a SGLangRolloutOptions (verl.config.role_options(cfg, "
                f"'rollout', spec)) or None, got {type(options).__name__}"
            )
        self.options = options
        problems = check_config(config)
        if problems:
            raise ValueError("rollout engine 'sglang': " + "; ".join(f"{key}{msg}" for key, msg in problems))
        from verl.models import load_tokenizer, resolve_model_path
        from verl.models.hf_config import load_hf_config, split_override_config

        self.model_path = resolve_model_path(os.fspath(model_path))
        trust = bool(getattr(model_config, "trust_remote_code", False))
        override = getattr(model_config, "override_config", None)
        hf_config = load_hf_config(str(self.model_path), trust_remote_code=trust, override_config=override)
        self.tokenizer = (
            tokenizer if tokenizer is not None else load_tokenizer(self.model_path, trust_remote_code=trust)
        )
        self.eos_token_ids = eos_token_ids(self.tokenizer, self.model_path)
        if not self.eos_token_ids:
            raise ValueError("rollout engine 'sglang': neither the tokenizer nor generation_config defines an EOS id")
        pad = getattr(self.tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_ids[0]
        self._shapes = checkpoint_shapes(self.model_path)
        self._tied = tied_embeddings(self.model_path)
        self.context = context_length(config, model_context_length(hf_config))
        self.tp = make_tp_group(int(_cfg(config, "tensor_model_parallel_size", 1)))
        index = device_index(self.device)
        if index is None and self.device_kind == "cuda" and torch.cuda.is_available():
            index = torch.cuda.current_device()  # a bare "cuda": the device the worker selected
        self.base_gpu_id = int(index or 0)
        self._leader(self._check_visible_devices, "the device check", share=False)
        if engine_cls is None:
            engine_cls = import_sglang().Engine
        # Every rank decides alike (the leader's calls are collective over the group).
        self._has_session = hasattr(engine_cls, "begin_weight_update")
        from verl.engines.weight_sync.group import free_port

        _, overrides = split_override_config(override)
        self.server_args = build_server_args(
            model_path=str(self.model_path),
            rollout=config,
            options=self.options,
            fields=server_args_fields().names,
            device_kind=self.device_kind,
            base_gpu_id=self.base_gpu_id,
            tp_size=self.tp.tp,
            context=self.context,
            port=self.options.port or free_port(),
            trust_remote_code=trust,
            model_overrides=overrides,
            hip=torch.version.hip is not None,
            sglang_version=sglang_version(),
        )
        self.sleep_mode = bool(self.server_args["enable_memory_saver"])
        self._weight_api = weight_api
        self._released: list[str] = []
        # Weights released without a host backup hold garbage until a weight sync fills them.
        self._weights_stale = False
        self.last_stats: dict[str, float] = {}
        start = time.perf_counter()
        self.engine = self._leader(lambda: engine_cls(**self.server_args), "engine start", share=False)
        self.startup_seconds = time.perf_counter() - start

    # ------------------------------------------------------------------ construction helpers
    def _check_visible_devices(self) -> None:
        if self.tp.tp == 1 or self.device_kind != "cuda":
            return
        visible = torch.cuda.device_count()
        if visible < self.base_gpu_id + self.tp.tp:
            raise RuntimeError(
                f"rollout engine 'sglang': tensor_model_parallel_size={self.tp.tp} runs SGLang's TP ranks on GPUs "
                f"{self.base_gpu_id}..{self.base_gpu_id + self.tp.tp - 1} of the group's first rank, which sees "
                f"{visible} GPU(s); make the group's GPUs visible to it (e.g. Ray's "
                "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1 with CUDA_VISIBLE_DEVICES listing the node's GPUs)"
            )

    def weight_layout(self) -> Any:
        """Whole tensors on every rank in a world of several ranks (SGLang's loader takes full HF tensors and
        shards them per TP rank itself), None in a one-process world."""
        if self.tp.world == 1:
            return None
        from verl.engines.weight_sync.layout import TensorParallelLayout

        return TensorParallelLayout(self.tp.world, 1, {})

    def _leader(self, fn: Any, what: str, *, share: bool = True) -> Any:
        """Run ``fn()`` on the group's leader; every rank of the group gets its result (``share``; else the other
        ranks get None) or raises its failure, so no rank waits in a collective the leader has left."""
        if self.tp.tp == 1:
            return fn()
        value: Any = None
        outcome: tuple[bool, Any] = (True, None)
        if self.tp.is_leader:
            try:
                value = fn()
                outcome = (True, value if share else None)
            except Exception as exc:
                self.tp.broadcast((False, f"{type(exc).__name__}: {exc}"))
                raise
        ok, shared = self.tp.broadcast(outcome)
        if not ok:
            raise SGLangEngineError(f"{what} failed on the TP group's first rank: {shared}")
        return value if self.tp.is_leader else shared

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: DataProto) -> DataProto:
        """Generate one response per row of ``prompts`` (the trainer already repeated rows ``n`` times).

        Input: ``prompts.batch["input_ids"]`` / ``["attention_mask"]`` ``(bs, prompt_len)`` int64, left-padded;
        optional ``["sample_seed"]`` ``(bs,)``; ``meta_info`` may override sampling (``validate``, ``do_sample``,
        ``temperature``, ``top_p``, ``top_k``), ``response_length`` and ``seed``. Output: verl's rollout keys
        (``prompts``, ``responses`` ``(bs, response_length)``, ``response_mask``, ``input_ids``,
        ``attention_mask``, ``position_ids``, ``rollout_log_probs`` float32 with ``calculate_log_probs``) on the
        input's device, ``meta_info["timing"]["generate_sequences"]`` in seconds. Wakes a sleeping engine.

        Raises:
            ValueError: a bad prompt batch, or a prompt longer than SGLang takes (``context_length - 7`` tokens).
            RuntimeError: the weights were released without a backup and not synced since; SGLang aborted a
                request or returned inconsistent log-probs.
        """
        from verl.protocol import DataProto

        start = time.perf_counter()
        batch, meta = prompts.batch, prompts.meta_info or {}
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        params = resolve_sampling_params(self.config, meta)
        resp_len = int(meta.get("response_length") or _cfg(self.config, "response_length", 512))
        check_prompt_batch(input_ids, attention_mask, resp_len)
        if self._released:
            self.wake_up()
        if self._weights_stale:
            raise RuntimeError(
                "SGLangRolloutEngine.generate: the weights were released by sleep() without a host backup "
                "(engine_kwargs.sglang.enable_weights_cpu_backup=false); call update_weights before generating"
            )
        rows = strip_left_padding(input_ids, attention_mask)
        bs = len(rows)
        seeds = row_seeds(
            bs, batch["sample_seed"] if "sample_seed" in batch.keys() else None, meta.get("seed"), params.greedy
        )
        caps = max_new_tokens_per_row([len(r) for r in rows], resp_len, self.context)
        want_lp = bool(_cfg(self.config, "calculate_log_probs", False))
        ignore_eos = bool(_cfg(self.config, "ignore_eos", False))
        requests = [
            sampling_params(
                params, max_new_tokens=caps[i], stop_token_ids=self.eos_token_ids, seed=seeds[i], ignore_eos=ignore_eos
            )
            for i in range(bs)
        ]

        def run() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            outputs: Any = (
                self.engine.generate(input_ids=rows, sampling_params=requests, return_logprob=want_lp) if bs else []
            )
            if isinstance(outputs, dict):  # one request comes back unwrapped
                outputs = [outputs]
            if len(outputs) != bs:
                raise RuntimeError(f"SGLang returned {len(outputs)} outputs for {bs} requests")
            return collect_outputs(outputs, resp_len, self.pad_token_id, want_lp)

        responses, lengths, log_probs = self._leader(run, "SGLang generate")
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
        """Refuse an update of these ``(hf_name, shape)`` pairs before anything is sent (names and full shapes
        of the checkpoint, fused q/k/v and gate/up groups complete).

        Raises:
            UnknownWeightError (KeyError): a name the checkpoint does not have (closest names suggested).
            ValueError: a shape mismatch, or part of a fused group.
        """
        check_specs(specs, self._shapes, engine="sglang")

    def _weights(self) -> Any:
        if self._weight_api is None:
            self._weight_api = load_weight_api()
        return self._weight_api

    def update_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Load ``(hf_name, tensor)`` pairs into the running SGLang model, then flush its prefix cache.

        Wakes the weights first when they are released. The stream is cut into buckets of about
        ``checkpoint_engine.update_weights_bucket_megabytes`` that keep fused groups whole, each checked against
        the checkpoint before it is sent (:mod:`verl_sglang.weights`); every bucket goes as one
        ``update_weights_from_tensor(load_format="flattened_bucket", flush_cache=False)`` per dtype, with one payload
        per TP rank (each rank packs its own copy), inside a ``begin/end_weight_update`` session where the Engine
        has one (ended on errors too). ``flush_cache`` runs once at the end. Names not sent keep their values.
        A bad name stops the update before its bucket is sent; buckets sent before it stay loaded (the trainer's
        sync calls :meth:`check_weights` on the whole update first, so a bad update sends nothing).

        Raises:
            UnknownWeightError (KeyError), ValueError: as :meth:`check_weights`, for the bucket about to be sent.
            SGLangEngineError: SGLang refused a load, the session or the cache flush.
        """
        if "weights" in self._released:
            self.wake_up(["weights"])
        megabytes = getattr(getattr(self.config, "checkpoint_engine", None), "update_weights_bucket_megabytes", None)
        bucket_bytes = int(2048 if megabytes is None else megabytes) << 20
        packer = BucketPacker(self._weights(), self.device)
        session = self._has_session
        if session:
            self._leader(
                lambda: check_result(self.engine.begin_weight_update(), "begin_weight_update"),
                "SGLang begin_weight_update",
            )
        failed = True
        try:
            for bucket in checked_buckets(weights, self._shapes, bucket_bytes=bucket_bytes, tied=self._tied):
                for group in dtype_groups(bucket):
                    payload, flat = packer.pack(group)
                    payloads = self.tp.gather(payload)
                    self._leader(lambda p=payloads: self._load(p), "SGLang update_weights_from_tensor")
                    del flat  # after every rank of the group knows SGLang has read it
                del bucket
            failed = False
        finally:
            if session:
                self._end_session(raise_errors=not failed)
        self._leader(lambda: check_result(self.engine.flush_cache(), "flush_cache"), "SGLang flush_cache")
        self._weights_stale = False

    def _load(self, payloads: list[bytes]) -> None:
        result = self.engine.update_weights_from_tensor(
            named_tensors=payloads, load_format=LOAD_FORMAT, flush_cache=False
        )
        check_result(result, "SGLang update_weights_from_tensor")

    def _end_session(self, *, raise_errors: bool) -> None:
        try:
            self._leader(
                lambda: check_result(self.engine.end_weight_update(), "end_weight_update"), "SGLang end_weight_update"
            )
        except SGLangEngineError:
            if raise_errors:
                raise
            # An update error is already propagating and says more; SGLang's failed end is secondary.

    # ------------------------------------------------------------------ memory
    def sleep(self) -> None:
        """Release the KV cache and the weights (verl's tags ``["kv_cache", "weights"]``); no-op when already
        released, and on cpu (no memory saver: weights and cache are host memory already)."""
        if not self.sleep_mode or self._released:
            return
        tags = list(RELEASE_TAGS)
        self._leader(lambda: self.engine.release_memory_occupation(tags=tags), "SGLang release_memory_occupation")
        self._released = tags
        self._weights_stale = not self.server_args.get("enable_weights_cpu_backup", False)

    def wake_up(self, tags: Any = None) -> None:
        """Resume released memory: ``["weights"]`` before the weight sync, ``["kv_cache"]`` after it (verl's
        order, whatever ``rollout.multi_stage_wake_up`` says: verl reads it nowhere); None = everything.
        Flushes the prefix cache once everything is back. No-op when nothing is released.

        Raises:
            ValueError: an unknown tag.
        """
        resume = wake_tags(tags, self._released)
        if not resume:
            return
        self._leader(lambda: self.engine.resume_memory_occupation(tags=resume), "SGLang resume_memory_occupation")
        self._released = [t for t in self._released if t not in resume]
        if not self._released:
            self._leader(lambda: check_result(self.engine.flush_cache(), "flush_cache"), "SGLang flush_cache")

    def close(self) -> None:
        """Shut the SGLang engine down (its scheduler processes exit; the engine is unusable afterwards)."""
        engine = self.__dict__.pop("engine", None)
        if engine is not None:
            engine.shutdown()
