"""The ``megatron`` training engine: Megatron-core's GPTModel, the reference engine's numbers.

:class:`MegatronTrainingEngine` keeps the semantics of :class:`verl.engines.reference.training
.ReferenceTrainingEngine` (the numerical oracle: log-probs of ``logits / T``, mini-batches, epochs, shuffle,
micro-batch plans, the loss function's global token-mean normalisers, clip, skip on a non-finite norm, the LR
schedule stepping once per ``train_batch``) and runs the model the Megatron way
(``verl/workers/engine/megatron/transformer_impl.py``):

* the model is built from the HF config (:mod:`verl_megatron.model_config`) and loaded TP/PP-sharded from the HF
  safetensors folder (:mod:`verl_megatron.weights`); it trains in Megatron's ``DistributedDataParallel``
  with ``get_megatron_optimizer`` and ``finalize_model_grads`` (DP all-reduce, tied-embedding sync across PP);
* forward and backward go through ``get_forward_backward_func()`` (1F1B with pipeline stages), micro-batches in
  Megatron's layout (:mod:`verl_megatron.forward`); the loss of the last stage is ``loss_fn``'s times the number
  of micro-batches (Megatron divides by it), and DDP's gradient averaging over the ``dp`` ranks is undone by the
  loss's ``dp_size`` factor, exactly as in verl-fsdp;
* every rank of one data-parallel replica receives the same rows (the worker's ``actor`` mesh dispatch); results
  and metrics are broadcast from the last pipeline stage and summed over data-parallel ranks.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from verl.engines.micro_batch import fixed_size_plan, mini_batch_schedule, restore_order, token_budget_plan
from verl.engines.optim import build_lr_scheduler
from verl.engines.reference.training import EngineSettings
from verl_megatron.forward import response_stats, to_megatron_inputs
from verl_megatron.megatron_model import MegatronModel

logger = logging.getLogger(__name__)


class MegatronTrainingEngine:
    """Actor (trainable) or reference (forward-only) policy on Megatron-core.

    Every method is collective over all ranks of the default process group, called in the same order; the ranks
    of one data-parallel replica (``tp * pp * cp`` ranks) must receive the same rows.

    Args:
        model: HF folder (safetensors) of a Llama / Qwen2 / Qwen3 causal LM.
        settings: per-data-parallel-rank batch settings (``mini_batch_size`` = global / dp).
        options: :class:`verl_megatron.options.MegatronEngineOptions`.
        optim: the ``optim`` config section; None = forward-only.
        total_training_steps: LR-schedule horizon.
        device: this rank's torch device.
        world_size: ranks of the default process group.
        bucket_megabytes: bucket of the TP all-gather in :meth:`iter_weights` (MiB).
        load_weights: load the HF folder's weights (False: Megatron's initialisation, for a checkpoint to fill).
        value_model: a value head instead of the vocabulary head (:class:`MegatronCriticEngine` sets it).

    Raises:
        verl.config.ConfigError: the layout does not fit the world or the model (names the keys).
        ValueError: an architecture or HF config field this engine cannot map.
    """

    metric_prefix = "actor"

    def __init__(
        self,
        model: Any,
        settings: EngineSettings,
        *,
        options: Any,
        optim: Any = None,
        total_training_steps: int = 1,
        device: torch.device | str = "cpu",
        world_size: int = 1,
        bucket_megabytes: int = 2048,
        load_weights: bool = True,
        value_model: bool = False,
    ) -> None:
        self.settings = settings
        self.options = options
        self.device = torch.device(device)
        self.trainable = optim is not None
        self.bucket_bytes = max(1, int(bucket_megabytes)) << 20
        self.mm = MegatronModel(
            model,
            settings=settings,
            options=options,
            optim=optim,
            device=self.device,
            world_size=world_size,
            load_weights=load_weights,
            value_model=value_model,
        )
        self.place = self.mm.place
        self.offloaded = False
        self.global_step = 0
        self.skipped_steps = 0
        self.lr_scheduler = None
        if self.trainable:
            # The schedule is the reference engine's (verl's warm-up/cosine formulas), driven on a one-parameter
            # torch optimizer; its lr is copied into Megatron's param groups before every step.
            self._shadow = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=float(optim.lr))
            self.lr_scheduler = build_lr_scheduler(self._shadow, optim, max(1, int(total_training_steps)))

    # ------------------------------------------------------------------ data-parallel bookkeeping

    @property
    def model(self) -> torch.nn.Module:
        """The (DDP-wrapped when trainable) Megatron module of this rank's pipeline stage."""
        return self.mm.module

    def dispatch_info(self) -> tuple[int, int, bool]:
        """``(dp_rank, dp_size, is_collect)`` for the worker's ``actor`` mesh dispatch."""
        p = self.place
        return p.dp_rank, p.dp_size, p.is_collect

    def _dp_sum(self, values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self.mm.comm_device)
        if self.place.dp_size > 1:
            from megatron.core import parallel_state as ps

            dist.all_reduce(tensor, group=ps.get_data_parallel_group())
        return [float(v) for v in tensor.cpu().tolist()]

    def _from_last_stage(self, obj: Any) -> Any:
        """``obj`` of the last pipeline stage, on every stage (broadcast over the PP group)."""
        if self.place.pp_size == 1:
            return obj
        from megatron.core import parallel_state as ps

        box = [obj]
        dist.broadcast_object_list(
            box, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group()
        )
        return box[0]

    # ------------------------------------------------------------------ forward

    def _plan(self, data: Any, *, use_dynamic: bool, micro: int | None, max_tokens: int) -> list[list[int]]:
        if len(data) == 0:
            raise ValueError(f"rank {dist.get_rank()}: got an empty batch; every data-parallel rank needs rows")
        if use_dynamic:  # the reference engine's padded-cost token budget (Megatron runs padded BSHD rows)
            mask = data.batch["attention_mask"] if hasattr(data, "batch") else data["attention_mask"]
            resp_len = (data.batch if hasattr(data, "batch") else data)["responses"].shape[1]
            return token_budget_plan(mask.sum(-1), max_tokens, response_lens=mask[:, -resp_len:].sum(-1))
        return fixed_size_plan(len(data), micro or len(data))

    def _pad_to(self, batch: Any) -> int | None:
        """``pad_bshd_to_minibatch_max``: every micro-batch padded to the longest row of ``batch`` (else None)."""
        if not self.options.pad_bshd_to_minibatch_max:
            return None
        return int(batch["attention_mask"].sum(-1).max())

    def _run(self, micros: list[Any], step: Any, *, forward_only: bool) -> list[Any]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        tds = [m.batch if hasattr(m, "batch") else m for m in micros]  # DataProto (training) or TensorDict
        seq = max(int(td["attention_mask"].sum(-1).max()) for td in tds)
        rows = max(len(m) for m in micros)
        # The schedules create scalars with an explicit device="cuda": the full shim on cpu.
        with self.mm.compat(optimizer=True):
            return get_forward_backward_func()(
                forward_step_func=step,
                data_iterator=iter(micros),
                model=[self.mm.module],
                num_microbatches=len(micros),
                seq_length=seq,
                micro_batch_size=rows,
                forward_only=forward_only,
            )

    def _outputs(
        self, logits: torch.Tensor, inputs: Any, temperature: float, calculate_entropy: bool, entropy_grad: bool
    ) -> dict[str, torch.Tensor]:
        """What the last stage's output gives ``loss_fn``: ``log_probs`` (and ``entropys``) ``(b, resp_len)``."""
        return response_stats(
            logits,
            inputs,
            vocab_start=self.mm.vocab_start,
            vocab_size=self.mm.shape.vocab_size,
            temperature=temperature,
            calculate_entropy=calculate_entropy,
            entropy_grad=entropy_grad,
        )

    @torch.no_grad()
    def compute_log_prob(self, data: Any, *, calculate_entropy: bool = False) -> Any:
        """Log-probs (and entropy) of ``data``'s responses, as the reference engine's ``compute_log_prob``.

        Returns:
            DataProto with ``old_log_probs`` (and ``entropys``) ``(bs, resp_len)`` float32, input row order, on
            every rank.
        """
        from verl.protocol import DataProto

        self.onload()
        s = self.settings
        temperature = float(data.meta_info.get("temperature", 1.0))
        plan = self._plan(
            data, use_dynamic=s.infer_use_dynamic_bsz, micro=s.infer_micro_batch_size, max_tokens=s.infer_max_token_len
        )
        micros = [data.batch[torch.tensor(rows)] for rows in plan]
        pad_to = self._pad_to(data.batch)

        def step(iterator: Iterator[Any], module: torch.nn.Module) -> Any:
            micro = next(iterator)
            inputs = to_megatron_inputs(micro, self.device, pad_to=pad_to)
            output, selected = self.mm.forward(module, inputs)
            if selected:  # the head ran on the scored positions: output column t scores response token t
                inputs = inputs.scored_in_place()

            def collect(logits: torch.Tensor) -> Any:
                stats = self._outputs(logits, inputs, temperature, calculate_entropy, True)
                return logits.new_zeros(()), {k: v.cpu() for k, v in stats.items()}

            return output, collect

        self.mm.module.train(False)
        outs = self._from_last_stage(self._run(micros, step, forward_only=True) if micros else [])
        tensors = {"old_log_probs": restore_order(plan, [o["log_probs"] for o in outs])}
        if calculate_entropy:
            tensors["entropys"] = restore_order(plan, [o["entropys"] for o in outs])
        return DataProto.from_dict(tensors=tensors, meta_info={"temperature": temperature})

    # ------------------------------------------------------------------ training

    def train_batch(self, data: Any, loss_fn: Any) -> dict[str, list[float]]:
        """One optimizer step per mini-batch per epoch, as the reference engine's ``train_batch``.

        Returns:
            the loss function's metrics per mini-batch (summed over micro-batches and data-parallel ranks), plus
            ``actor/grad_norm``, ``actor/lr`` per step and ``actor/skipped_steps``; equal on every rank.

        Raises:
            RuntimeError: a forward-only engine. ValueError: rows not divisible into mini-batches.
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
        self.mm.module.train(True)
        try:
            for rows in steps:
                self._train_mini_batch(data[rows], loss_fn, temperature, metrics)
        finally:
            self.mm.module.train(False)
        self._shadow.step()  # a no-op (its parameter has no gradient); keeps torch's step-order check quiet
        self.lr_scheduler.step()
        self.global_step += 1
        metrics[f"{self.metric_prefix}/skipped_steps"].append(float(self.skipped_steps))
        return dict(metrics)

    def _norm(self, mb: Any) -> dict[str, Any]:
        lens = mb.batch["response_mask"].to(torch.float64).sum(-1)
        tokens, rows = self._dp_sum([float(lens.sum()), float((lens > 0).sum())])
        return {"dp_size": self.place.dp_size, "batch_num_tokens": int(tokens), "global_batch_size": int(rows)}

    def _train_mini_batch(self, mb: Any, loss_fn: Any, temperature: float, metrics: dict[str, list[float]]) -> None:
        s = self.settings
        norm = self._norm(mb)
        plan = self._plan(mb, use_dynamic=s.use_dynamic_bsz, micro=s.micro_batch_size, max_tokens=s.max_token_len)
        micros = [mb[rows] for rows in plan]
        pad_to = self._pad_to(mb.batch)
        needs_entropy = bool(getattr(loss_fn, "needs_entropy", True))
        entropy_metric = bool(getattr(loss_fn, "entropy_metric", False))
        summed: dict[str, float] = defaultdict(float)
        mm = self.mm
        count = len(micros)

        def step(iterator: Iterator[Any], module: torch.nn.Module) -> Any:
            micro = next(iterator)
            inputs = to_megatron_inputs(micro.batch, self.device, pad_to=pad_to)
            output, selected = self.mm.forward(module, inputs)
            if selected:  # the head ran on the scored positions: output column t scores response token t
                inputs = inputs.scored_in_place()

            def loss_func(logits: torch.Tensor) -> Any:
                stats = self._outputs(logits, inputs, temperature, needs_entropy or entropy_metric, needs_entropy)
                loss, micro_metrics = loss_fn(micro, stats, norm)
                for key, value in micro_metrics.items():
                    summed[key] += float(value)
                if not loss.requires_grad:  # only empty responses: keep the graph so every rank runs backward
                    loss = loss + logits.sum() * 0.0
                # Megatron divides each micro-batch's loss by their number; loss_fn already normalised globally.
                return loss * count, {}

            return output, loss_func

        mm.zero_grad()
        self._run(micros, step, forward_only=False)
        keys = sorted(self._from_last_stage(sorted(summed)))
        values = self._from_last_stage([summed.get(k, 0.0) for k in keys])
        for key, value in zip(keys, self._dp_sum(values) if keys else [], strict=True):
            metrics[key].append(value)
        lr = float(self.lr_scheduler.get_last_lr()[0])  # restored by load_state_dict, unlike the shadow's group
        grad_norm = mm.optimizer_step(lr, skip_if_no_tokens=norm["batch_num_tokens"] == 0)
        if not torch.isfinite(torch.tensor(grad_norm)):
            self.skipped_steps += 1
            logger.warning(
                "non-finite grad norm (%s): optimizer step skipped (%d so far)", grad_norm, self.skipped_steps
            )
        metrics[f"{self.metric_prefix}/grad_norm"].append(float(grad_norm))
        metrics[f"{self.metric_prefix}/lr"].append(lr)

    # ------------------------------------------------------------------ weights & state

    def iter_weights(
        self, layout: Any = None, *, bucket_bytes: int | None = None, stats: Any = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, tensor)`` in the HF model's state-dict order (collective: every rank consumes it all).

        Without ``layout``: full tensors on every rank (TP all-gather, PP broadcast), one weight at a time.
        With the rollout's :class:`~verl.engines.weight_sync.layout.WeightLayout`: each rank gets its slice. When
        the rollout's tensor-parallel split is this engine's (one pipeline stage, every slice equal to the piece
        this rank's TP shard holds: the usual hybrid engine, rollout TP = training TP) the pieces are yielded
        as they are, with no communication and no whole tensor anywhere; otherwise each slice is cut from the
        gathered full tensor (counted in ``stats.full_gathers``).
        """
        self.onload()
        yield from self.mm.hf_weights(layout, stats=stats)

    def weight_manifest(self, layout: Any = None) -> list[tuple[str, tuple[int, ...]]]:
        """``(hf_name, shape)`` of what :meth:`iter_weights` (with ``layout``) yields on this rank."""
        from verl.engines.weight_sync.layout import local_shape

        return [(n, local_shape(layout, n, s, dist.get_rank())) for n, s in self.mm.hf_manifest()]

    def state_dict(self) -> dict[str, Any]:
        """This rank's state: its model shard, optimizer state, LR scheduler and counters (same layout to load)."""
        self.onload()
        state = {
            "model": {k: v for k, v in self.mm.base.state_dict().items() if "_extra_state" not in k},
            "global_step": self.global_step,
            "skipped_steps": self.skipped_steps,
            "layout": self.mm.layout_key(),
        }
        if self.trainable:
            state["optimizer"] = self.mm.optimizer_state()
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` of the same rank in the same layout.

        Raises:
            ValueError: written by another rank or layout.
        """
        self.onload()
        if state.get("layout", self.mm.layout_key()) != self.mm.layout_key():
            raise ValueError(
                f"megatron engine state of layout {state.get('layout')} cannot be loaded by {self.mm.layout_key()}: "
                "resume with the same parallel sizes and world size (or export to HF and start from that)"
            )
        self.mm.base.load_state_dict(state["model"], strict=False)
        self.global_step = int(state.get("global_step", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        if self.trainable and "optimizer" in state:
            self.mm.load_optimizer_state(state["optimizer"])
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])

    def save_checkpoint(self, folder: Any) -> None:
        """Megatron ``dist_checkpointing`` of model + optimizer, plus counters (collective); see
        :mod:`verl_megatron.checkpoint`."""
        from verl_megatron import checkpoint

        self.onload()
        checkpoint.save(self, folder)

    def load_checkpoint(self, folder: Any) -> None:
        """Restore :meth:`save_checkpoint` output (collective; same parallel layout)."""
        from verl_megatron import checkpoint

        self.onload()
        checkpoint.load(self, folder)

    def nonfinite_state(self) -> tuple[list[str], list[str]]:
        """``(parameter names, optimizer-state names)`` holding NaN/inf on this rank (what the workers report with a
        checkpoint and refuse after loading one): the Megatron module's parameters and, when trainable, each inner
        optimizer's main parameters (the fp32 shards of the distributed optimizer), moments and step counts, named
        ``optimizer{i}.group{g}.param{p}[.key]``."""
        from verl.engines.safe_files import nonfinite_tensors, optimizer_tensors

        params = nonfinite_tensors(self.mm.base.named_parameters())
        optim: list[str] = []
        for i, inner in enumerate(self.mm._inner_optimizers() if self.trainable else []):
            torch_opt = getattr(inner, "optimizer", None)
            if torch_opt is None:
                continue
            groups = enumerate(torch_opt.param_groups)
            optim += nonfinite_tensors(
                (f"optimizer{i}.group{g}.param{p}", t) for g, group in groups for p, t in enumerate(group["params"])
            )
            optim += nonfinite_tensors(optimizer_tensors(torch_opt, prefix=f"optimizer{i}."))
        return params, optim

    def save_hf(self, path: Any, tokenizer: Any = None) -> None:
        """Gather the full weights and write a HF folder on rank 0 (collective)."""
        from verl_megatron import checkpoint

        self.onload()
        checkpoint.write_hf(self, path, tokenizer)

    def offload(self, *, keep_params: bool = False) -> dict[str, int]:
        """Move weights / gradients / optimizer state to host memory as ``param_offload``, ``grad_offload`` and
        ``optimizer_offload`` say (nothing moves on the cpu device)."""
        out = self.mm.offload(keep_params=keep_params)
        self.offloaded = any(out.values())
        return out

    def onload(self) -> dict[str, int]:
        """Bring back what :meth:`offload` moved."""
        if not self.offloaded:
            return {}
        self.offloaded = False
        return self.mm.onload()


class MegatronCriticEngine(MegatronTrainingEngine):
    """The critic (GAE value model) on Megatron: GPTModel with a one-output value head (:mod:`verl_megatron.value_head`).

    As :class:`verl.engines.reference.critic.ReferenceCriticEngine`: the value of response token ``t`` is the head
    at input position ``prompt_len - 1 + t``; ``train_batch(data, loss_fn)`` passes ``{"values": (b, resp_len)}``
    and reports ``critic/grad_norm``, ``critic/lr``, ``critic/skipped_steps``. Args: as
    :class:`MegatronTrainingEngine` (``model``: a value-model or causal-LM HF folder).
    """

    metric_prefix = "critic"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, value_model=True, **kwargs)

    def _outputs(
        self, logits: torch.Tensor, inputs: Any, temperature: float, calculate_entropy: bool, entropy_grad: bool
    ) -> dict[str, torch.Tensor]:
        values = logits[..., 0].float().gather(1, inputs.score_index)
        return {"values": torch.where(inputs.response_valid, values, torch.zeros_like(values))}

    @torch.no_grad()
    def compute_values(self, data: Any) -> Any:
        """Values of ``data``'s responses (no grad): DataProto with ``values`` ``(bs, resp_len)`` float32, input
        row order, 0 on padding."""
        from verl.protocol import DataProto

        self.onload()
        s = self.settings
        plan = self._plan(
            data, use_dynamic=s.infer_use_dynamic_bsz, micro=s.infer_micro_batch_size, max_tokens=s.infer_max_token_len
        )
        micros = [data.batch[torch.tensor(rows)] for rows in plan]
        pad_to = self._pad_to(data.batch)

        def step(iterator: Iterator[Any], module: torch.nn.Module) -> Any:
            inputs = to_megatron_inputs(next(iterator), self.device, pad_to=pad_to)
            output, selected = self.mm.forward(module, inputs)
            if selected:  # the head ran on the scored positions: output column t scores response token t
                inputs = inputs.scored_in_place()

            def collect(out: torch.Tensor) -> Any:
                return out.new_zeros(()), {"values": self._outputs(out, inputs, 1.0, False, False)["values"].cpu()}

            return output, collect

        self.mm.module.train(False)
        outs = self._from_last_stage(self._run(micros, step, forward_only=True))
        return DataProto.from_dict(tensors={"values": restore_order(plan, [o["values"] for o in outs])})
