"""Reference training engine: single-process PyTorch on a HF ``AutoModelForCausalLM``.

``actor_rollout_ref.actor.strategy=reference``. It is the embedded default on CPU and the
numerical oracle that backend plugins (FSDP, Megatron) are compared against, so it favours
exactness and clarity over speed:

* log-probs follow DESIGN §5: logits divided by the rollout temperature, response
  log-prob ``t`` read from input position ``prompt_len - 1 + t``;
* ``train_batch`` splits the batch into mini-batches (``ppo_mini_batch_size`` rows, already
  multiplied by ``rollout.n`` by the caller), runs ``ppo_epochs`` epochs, accumulates the
  micro-batch losses (the loss function normalises globally, so the sum equals one pass
  over the mini-batch, K04), clips the gradient and steps AdamW once per mini-batch; a
  non-finite grad norm skips the step and is counted;
* the LR scheduler steps once per ``train_batch`` call (verl: once per training step).

Follows ``verl/workers/engine/fsdp/transformer_impl.py`` and
``verl/workers/engine_workers.py:TrainingWorker.train_mini_batch`` in semantics.
"""

from __future__ import annotations

import inspect
import logging
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import attrs
import torch

from verl.algorithms.loss_agg import compute_global_batch_info
from verl.engines import attention
from verl.engines.dtypes import resolve_dtype
from verl.engines.micro_batch import fixed_size_plan, mini_batch_schedule, restore_order, token_budget_plan
from verl.engines.optim import build_lr_scheduler, build_optimizer
from verl.engines.packing import packed_token_plan
from verl.engines.reference.log_probs import LogProbForward
from verl.engines.reference.lora_weights import LoraWeights
from verl.engines.reference.offload import HostOffload

logger = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class EngineSettings:
    """Batch and precision settings of one training engine (one role).

    Attributes:
        mini_batch_size: rows per optimizer step (``ppo_mini_batch_size * rollout.n``).
        micro_batch_size: rows per forward/backward (``ppo_micro_batch_size_per_gpu``); used when
            ``use_dynamic_bsz`` is false; ``None`` = the whole mini-batch.
        use_dynamic_bsz: plan training micro-batches by a token budget instead.
        max_token_len: token budget per training micro-batch (``ppo_max_token_len_per_gpu``).
        ppo_epochs: passes over each batch.
        shuffle: shuffle rows between epochs (seeded by ``data_loader_seed``).
        data_loader_seed: seed of that shuffle.
        infer_micro_batch_size: rows per forward in ``compute_log_prob`` (``None`` = all).
        infer_use_dynamic_bsz / infer_max_token_len: token budget for ``compute_log_prob``.
        clip_grad: max global grad norm (``optim.clip_grad``).
        dtype: parameter dtype (``float32`` is the CPU dtype; bf16 matmuls are ~6x slower there).
        gradient_checkpointing: recompute activations in backward to save memory.
        use_remove_padding: pack each micro-batch's real tokens into one row (``model.use_remove_padding``,
            :mod:`verl.engines.packing`): padding costs nothing, and token budgets count real tokens only.
            Needs a model with ``sdpa`` attention; others run padded (with a log line).
        trust_remote_code: run the model repository's code when loading (``model.trust_remote_code``).
        override_config: HF config values set before the weights load (``model.override_config``,
            :func:`verl.models.hf_config.load_hf_config`); empty changes nothing.
        use_torch_compile: ``torch.compile`` the entropy function (verl's ``use_torch_compile``; the config
            default is verl's ``true``, this class's is ``false`` so engines built in code start without a compile).
        entropy_from_logits_with_chunking / entropy_from_logits_chunk_size: entropy over the vocabulary in row
            chunks of this many tokens (:mod:`verl.engines.entropy`).
        entropy_checkpointing: recompute the entropy in backward instead of keeping its softmax.
        use_fused_kernels: log-probs and entropy from the hidden states without the full logits
            (``model.use_fused_kernels``, :mod:`verl.engines.fused_linear`); ``fused_kernels_backend`` is
            ``model.fused_kernel_options.impl_backend`` (only ``torch`` is built).
        enable_activation_offload: keep the activations saved for backward in host memory (training forwards).
        lora: :class:`verl.engines.lora.LoraSettings` of a trainable engine (``model.lora_rank > 0``): peft
            adapters on the module, only they are trained and checkpointed, weights are synced merged; None = off.
    """

    mini_batch_size: int = 8
    micro_batch_size: int | None = None
    use_dynamic_bsz: bool = False
    max_token_len: int = 16384
    ppo_epochs: int = 1
    shuffle: bool = False
    data_loader_seed: int = 42
    infer_micro_batch_size: int | None = None
    infer_use_dynamic_bsz: bool = False
    infer_max_token_len: int = 16384
    clip_grad: float = 1.0
    dtype: str = "float32"
    gradient_checkpointing: bool = False
    use_remove_padding: bool = False
    trust_remote_code: bool = False
    override_config: dict[str, Any] = attrs.field(factory=dict, hash=False)
    use_torch_compile: bool = False
    entropy_from_logits_with_chunking: bool = False
    entropy_from_logits_chunk_size: int = 2048
    entropy_checkpointing: bool = False
    use_fused_kernels: bool = False
    fused_kernels_backend: str = "torch"
    enable_activation_offload: bool = False
    lora: Any = None


class ReferenceTrainingEngine(HostOffload, LogProbForward, LoraWeights):
    """Trains (or, with ``optim=None``, only evaluates) a causal LM in one process.

    Args:
        model: a HF folder path or an already built ``PreTrainedModel``.
        settings: :class:`EngineSettings`.
        optim: the ``optim`` config section; ``None`` makes a forward-only engine (the
            reference policy for ``use_kl_loss`` / in-reward KL).
        total_training_steps: horizon of the LR schedule (training steps).
        device: torch device to run on (from the platform).
        param_offload: :meth:`offload` moves the weights to host memory (verl's ``fsdp_config.param_offload``).
        optimizer_offload: :meth:`offload` moves the optimizer state to host memory.

    Offloading is driven by the trainer between phases (rollout generates while the trainer is offloaded);
    every method that needs the weights onloads them first. On the CPU nothing moves.

    Raises:
        ValueError: for an unknown dtype or a model that cannot be loaded as a causal LM.
    """

    # Namespace of the engine's own metrics (grad_norm, lr, skipped_steps); the critic engine uses "critic".
    metric_prefix = "actor"

    def __init__(
        self,
        model: Any,
        settings: EngineSettings,
        *,
        optim: Any = None,
        total_training_steps: int = 1,
        device: torch.device | str = "cpu",
        param_offload: bool = False,
        optimizer_offload: bool = False,
    ) -> None:
        self.settings = settings
        self.device = torch.device(device)
        self.param_offload = bool(param_offload)
        self.optimizer_offload = bool(optimizer_offload)
        self.offloaded = False
        dtype = resolve_dtype(
            settings.dtype, self.device, field="actor_rollout_ref.actor.engine_kwargs.reference.dtype"
        )
        self.model = self._load(model, dtype).to(self.device)
        self.model.config.use_cache = False
        self._logits_to_keep = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self._packed = bool(settings.use_remove_padding) and attention.install(self.model)
        if settings.use_remove_padding and not self._packed:
            logger.info(
                "use_remove_padding: %s runs attention %r, not sdpa; micro-batches stay padded",
                type(self.model).__name__,
                getattr(self.model.config, "_attn_implementation", None),
            )
        self.trainable = optim is not None
        # LoRA: peft layers in place (self.model keeps its class and forward); base weights frozen.
        self.peft_model = None
        if settings.lora is not None and self.trainable:
            from verl.engines.lora import apply_lora, lora_modules

            self.peft_model = apply_lora(self.model, settings.lora)
            self._lora_modules = lora_modules(self.model)
        if settings.gradient_checkpointing and self.trainable:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self._setup_log_probs()
        # Distributed subclasses shard the module here, before the optimizer sees its parameters.
        self.model = self._wrap_model(self.model)
        # Only trainable parameters (all of them, or the LoRA adapters) get optimizer state.
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(params, optim) if self.trainable else None
        self.lr_scheduler = (
            build_lr_scheduler(self.optimizer, optim, max(1, int(total_training_steps))) if self.trainable else None
        )
        self.global_step = 0  # training steps (train_batch calls) done
        self.skipped_steps = 0  # optimizer steps skipped for a non-finite grad norm
        if not self.trainable:
            self.model.requires_grad_(False)
        self.model.train(False)

    def _wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Hook: return the module to train (identity here; FSDP shards it)."""
        return model

    def _load(self, model: Any, dtype: torch.dtype) -> torch.nn.Module:
        if isinstance(model, torch.nn.Module):  # a live module already carries its config
            return model.to(dtype)
        from transformers import AutoModelForCausalLM

        from verl.models.hf_config import load_hf_config

        trust = self.settings.trust_remote_code
        hf_config = load_hf_config(model, trust_remote_code=trust, override_config=self.settings.override_config)
        try:
            return AutoModelForCausalLM.from_pretrained(
                str(model), config=hf_config, dtype=dtype, trust_remote_code=trust
            )
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot load {model!r} as a causal LM (AutoModelForCausalLM): {exc}") from exc

    # ------------------------------------------------------------------ forward (LogProbForward)

    @staticmethod
    def _plan(
        data: Any, *, use_dynamic: bool, micro: int | None, max_tokens: int, packed: bool = False
    ) -> list[list[int]]:
        """Micro-batch plan: fixed row counts, or a token budget (``packed``: real tokens; else padded cost)."""
        if use_dynamic and packed:
            return packed_token_plan(data.batch["attention_mask"].sum(-1), max_tokens)
        if use_dynamic:
            mask = data.batch["attention_mask"]
            resp_len = data.batch["responses"].shape[1]
            return token_budget_plan(mask.sum(-1), max_tokens, response_lens=mask[:, -resp_len:].sum(-1))
        return fixed_size_plan(len(data), micro or len(data))

    @torch.no_grad()
    def compute_log_prob(self, data: Any, *, calculate_entropy: bool = False) -> Any:
        """Log-probs of ``data``'s responses under the current weights (no grad).

        Args:
            data: DataProto with ``input_ids, attention_mask, position_ids, responses`` and
                ``meta_info["temperature"]`` (default 1.0).
            calculate_entropy: also return ``entropys``.

        Returns:
            DataProto with ``old_log_probs`` (and ``entropys``) ``(bs, resp_len)`` float32, in
            the input's row order.
        """
        from verl.protocol import DataProto

        self.onload()
        s = self.settings
        temperature = float(data.meta_info.get("temperature", 1.0))
        plan = self._plan(
            data,
            use_dynamic=s.infer_use_dynamic_bsz,
            micro=s.infer_micro_batch_size,
            max_tokens=s.infer_max_token_len,
            packed=self._packed,
        )
        outs: dict[str, list[torch.Tensor]] = defaultdict(list)
        for rows in plan:
            micro = data.batch[torch.tensor(rows)]
            for key, value in self.forward_micro_batch(micro, temperature, calculate_entropy=calculate_entropy).items():
                outs[key].append(value.cpu())
        tensors = {"old_log_probs": restore_order(plan, outs["log_probs"])}
        if calculate_entropy:
            tensors["entropys"] = restore_order(plan, outs["entropys"])
        return DataProto.from_dict(tensors=tensors, meta_info={"temperature": temperature})

    # ------------------------------------------------------------------ training

    def train_batch(self, data: Any, loss_fn: Any) -> dict[str, list[float]]:
        """Update the model on ``data``: one optimizer step per mini-batch per epoch.

        Args:
            data: DataProto with the forward inputs, ``response_mask``, whatever ``loss_fn``
                reads, and ``meta_info["temperature"]``.
            loss_fn: ``loss_fn(micro: DataProto, outputs: dict, norm: dict) -> (loss, metrics)``;
                ``norm`` is :func:`verl.algorithms.compute_global_batch_info` of the whole
                mini-batch (``batch_num_tokens``, ``global_batch_size``, ``dp_size``), so that
                summing micro-batch losses gives the mini-batch loss (DESIGN §5, K04). Its
                metrics are additive contributions, summed over the micro-batches. A loss
                with ``needs_entropy = False`` gets no ``entropys`` output (saves memory).

        Returns:
            metrics as lists of floats: the loss function's metrics per mini-batch, plus
            ``actor/grad_norm`` and ``actor/lr`` per optimizer step and ``actor/skipped_steps``
            (non-finite grad norms so far); ``actor`` is :attr:`metric_prefix`.

        Raises:
            RuntimeError: if the engine was built forward-only.
            ValueError: if the batch is not divisible into mini-batches.
        """
        if not self.trainable:
            raise RuntimeError("this engine is forward-only (built with optim=None) and cannot train")
        self.onload()
        steps = mini_batch_schedule(
            len(data),
            self.settings,
            global_step=self.global_step,
            old_log_prob_source=data.meta_info.get("old_log_prob_source"),
        )
        temperature = float(data.meta_info.get("temperature", 1.0))
        metrics: dict[str, list[float]] = defaultdict(list)
        self.model.train(True)
        try:
            for rows in steps:
                self._train_mini_batch(data[rows], loss_fn, temperature, metrics)
        finally:
            self.model.train(False)
        self.lr_scheduler.step()
        self.global_step += 1
        metrics[f"{self.metric_prefix}/skipped_steps"].append(float(self.skipped_steps))
        return dict(metrics)

    def _train_mini_batch(self, mb: Any, loss_fn: Any, temperature: float, metrics: dict[str, list[float]]) -> None:
        s = self.settings
        norm = self._batch_norm(mb)
        plan = self._plan(
            mb, use_dynamic=s.use_dynamic_bsz, micro=s.micro_batch_size, max_tokens=s.max_token_len, packed=self._packed
        )
        # The entropy's graph costs memory; build it only for a loss that uses it (entropy bonus). A loss
        # that only reports the entropy (no separate old_log_prob pass) gets it without a graph.
        needs_entropy = bool(getattr(loss_fn, "needs_entropy", True))
        entropy_metric = bool(getattr(loss_fn, "entropy_metric", False))
        self.optimizer.zero_grad(set_to_none=True)
        summed: dict[str, float] = defaultdict(float)
        for rows in plan:
            micro = mb[rows]
            outputs = self.forward_micro_batch(
                micro.batch, temperature, calculate_entropy=needs_entropy or entropy_metric, entropy_grad=needs_entropy
            )
            loss, micro_metrics = loss_fn(micro, outputs, norm)
            if loss.requires_grad:  # a micro-batch of only empty responses has no graph: nothing to add (K08)
                loss.backward()
            for key, value in micro_metrics.items():
                summed[key] += float(value)
        for key, value in self._reduce_metrics(dict(summed)).items():
            metrics[key].append(value)
        grad_norm = self._clip_grad()
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        else:
            # A non-finite norm means some gradient is inf/NaN: applying it would corrupt the weights.
            self.skipped_steps += 1
            logger.warning(
                "non-finite grad norm (%s): optimizer step skipped (%d so far)", grad_norm, self.skipped_steps
            )
        self.optimizer.zero_grad(set_to_none=True)
        metrics[f"{self.metric_prefix}/grad_norm"].append(float(grad_norm))
        metrics[f"{self.metric_prefix}/lr"].append(float(self.optimizer.param_groups[0]["lr"]))

    # Hooks overridden by data-parallel subclasses (verl-fsdp); here: one process holds the whole mini-batch.

    def _batch_norm(self, mb: Any) -> dict[str, Any]:
        """Hook: loss normalisers of mini-batch ``mb`` (:func:`compute_global_batch_info`, ``dp_size=1``)."""
        return compute_global_batch_info(mb.batch["response_mask"], dp_size=1)

    def _reduce_metrics(self, summed: dict[str, float]) -> dict[str, float]:
        """Hook: combine the mini-batch's summed loss metrics across ranks (identity here)."""
        return summed

    def _clip_grad(self) -> torch.Tensor:
        """Hook: clip the gradients to ``settings.clip_grad`` and return the total norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=self.settings.clip_grad)

    # ------------------------------------------------------------------ weights & state

    def iter_weights(
        self, layout: Any = None, *, bucket_bytes: int = 1 << 30, stats: Any = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(hf_name, tensor)`` for every entry of the model's state dict.

        Args:
            layout: the rollout's :class:`~verl.engines.weight_sync.layout.WeightLayout` (None: whole tensors).
                This engine is one process, so only a one-rank layout fits; its slices are views.
            bucket_bytes: unused here (nothing crosses processes); part of the protocol for sharded engines.
            stats: a :class:`~verl.engines.weight_sync.reshard.ReshardStats` filled in when ``layout`` is given.

        Tensors are detached views of the live weights (no copy): consumers copy them.

        Raises:
            ValueError: a layout over more than one rank.
        """
        self.onload()
        if layout is None:
            for name, tensor in self._sync_items():
                yield name, tensor.detach()
            return
        from verl.engines.weight_sync.reshard import reshard_weights

        yield from reshard_weights(
            self._sync_items(),
            layout,
            bucket_bytes=bucket_bytes,
            rank=0,
            world_size=1,
            stats=stats,
            dedupe=False,
        )

    def weight_manifest(self, layout: Any = None) -> list[tuple[str, tuple[int, ...]]]:
        """``(hf_name, shape)`` of what :meth:`iter_weights` (with ``layout``) will yield, without moving data."""
        from verl.engines.weight_sync.layout import local_shape

        return [(n, local_shape(layout, n, shape, 0)) for n, shape in self._sync_manifest()]

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer and LR-scheduler state plus step counters (for checkpoints).

        Tensors are live references (as ``nn.Module.state_dict``): serialise them (``torch.save``)
        before training further.
        """
        self.onload()
        model_state = self.model.state_dict()
        if self.lora:  # the frozen base is the model folder itself: only the adapter is state
            names = set(self.adapter_names())
            model_state = {k: v for k, v in model_state.items() if k in names}
        state: dict[str, Any] = {
            "model": model_state,
            "lora": self.lora,
            "global_step": self.global_step,
            "skipped_steps": self.skipped_steps,
        }
        if self.trainable:
            state["optimizer"] = self.optimizer.state_dict()
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (strict: every model key must match; with LoRA every adapter key).

        Raises:
            ValueError: a LoRA state into an engine without LoRA or the reverse.
        """
        self.onload()
        if bool(state.get("lora", False)) != self.lora:
            raise ValueError(
                f"checkpoint {'has' if state.get('lora') else 'has no'} LoRA adapter but this engine has LoRA "
                f"{'on' if self.lora else 'off'}: resume with the model.lora_rank it was saved with"
            )
        if self.lora:
            self._check_adapter_keys(state["model"])
            self.model.load_state_dict(state["model"], strict=False)
        else:
            self.model.load_state_dict(state["model"], strict=True)
        self.global_step = int(state.get("global_step", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        if self.trainable and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])

    def save_hf(self, path: Any, tokenizer: Any = None) -> None:
        """Write the current weights (and ``tokenizer``) as a HF folder for ``from_pretrained``.

        The exported config has ``use_cache: true`` (the engine turns the KV cache off for training). With LoRA:
        the merged weights as a plain HF model, and the adapter in ``<path>/lora_adapter/`` (a peft folder).
        """
        self.onload()
        if self.lora:
            from verl.engines.lora import write_merged_hf

            write_merged_hf(self.model.config, self._sync_items(), path)
            self.save_adapter(f"{path}/{self.adapter_dir}")
            if tokenizer is not None:
                tokenizer.save_pretrained(str(path))
            return
        self.model.config.use_cache = True
        try:
            self.model.save_pretrained(str(path))
        finally:
            self.model.config.use_cache = False
        if tokenizer is not None:
            tokenizer.save_pretrained(str(path))
