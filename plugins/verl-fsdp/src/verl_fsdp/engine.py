"""FSDP2 training engine: the reference engine's math, sharded over the default process group.

:class:`FSDPTrainingEngine` subclasses :class:`verl.engines.reference.training.ReferenceTrainingEngine`
(the numerical oracle) and overrides only what data parallelism changes (DESIGN §5):

* the module is sharded with ``fully_shard`` per decoder layer, then the root, on a DeviceMesh of
  the default group (``(world,)`` or, with ``fsdp_size``, an HSDP ``(world // fsdp_size, fsdp_size)``);
* loss normalisers are global: ``batch_num_tokens`` and ``global_batch_size`` are all-reduced (sum)
  and ``dp_size = world_size``, so FSDP's gradient *averaging* times ``dp_size`` gives the gradient
  of the global mini-batch loss (``verl.algorithms.agg_loss``);
* every rank runs the same number of micro-batches (FSDP collectives would deadlock otherwise):
  the plan length is all-reduced (max) and short plans are split further (verl's
  ``same_micro_num_in_dp``); a micro-batch without response tokens still runs the model;
* loss metrics (additive contributions) are all-reduced (sum): every rank returns the global value;
* the grad norm is the global norm of the sharded (DTensor) gradients.

Follows ``verl/workers/engine/fsdp/transformer_impl.py`` (FSDP2 path) in semantics.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from verl.engines.dtypes import resolve_dtype
from verl.engines.reference.critic import ReferenceCriticEngine
from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
from verl_fsdp import checkpoint as ckpt
from verl_fsdp.dist import all_reduce, ensure_process_group
from verl_fsdp.options import FSDPEngineOptions

logger = logging.getLogger(__name__)

DIST_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
_NOTICED: set[str] = set()


def notice_once(key: str, message: str, *args: Any) -> None:
    """``logger.warning`` ``message`` the first time ``key`` is seen in this process."""
    if key not in _NOTICED:
        _NOTICED.add(key)
        logger.warning(message, *args)


def build_mesh(device_type: str, world_size: int, fsdp_size: int) -> DeviceMesh:
    """1-D ``("fsdp",)`` mesh over all ranks, or 2-D HSDP ``("ddp", "fsdp")`` when ``1 <= fsdp_size < world``.

    Raises:
        ValueError: ``fsdp_size`` does not divide the world size.
    """
    if fsdp_size == -1 or fsdp_size >= world_size:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("fsdp",))
    if world_size % fsdp_size:
        raise ValueError(
            f"engine_kwargs.fsdp.fsdp_size={fsdp_size} must divide the world size {world_size} (or be -1 for all ranks)"
        )
    return init_device_mesh(device_type, (world_size // fsdp_size, fsdp_size), mesh_dim_names=("ddp", "fsdp"))


def _split_to(plan: list[list[int]], count: int) -> list[list[int]]:
    """Split the largest groups of ``plan`` in halves until it has ``count`` groups (a split never adds tokens)."""
    plan = [list(g) for g in plan]
    while len(plan) < count:
        big = max(range(len(plan)), key=lambda i: len(plan[i]))
        group = plan.pop(big)
        half = (len(group) + 1) // 2
        plan[big:big] = [group[:half], group[half:]]
    return plan


class FSDPTrainingEngine(ReferenceTrainingEngine):
    """A :class:`ReferenceTrainingEngine` whose module is FSDP2-sharded over all ranks of the default group.

    Every method that touches the model is collective: all ranks call it, in the same order, with
    equally many rows (the worker's DP dispatch splits batches evenly).

    Args:
        model: HF folder or a built ``PreTrainedModel`` (each rank loads the full model, then shards it).
        settings: per-rank batch settings (``mini_batch_size`` = global mini-batch / world size).
        options: :class:`FSDPEngineOptions`.
        optim: ``optim`` config section; ``None`` = forward-only (``ref`` role).
        total_training_steps: LR-schedule horizon.
        device: this rank's torch device (``cpu``, ``cuda:i``, ``npu:i``).
        bucket_megabytes: size of one all-gather bucket in :meth:`iter_weights` (MiB).
        backend: process-group backend if none is initialised yet (default: by device type).

    Raises:
        ValueError: bad ``fsdp_size``, unknown dtype, or a model that cannot be loaded.
    """

    def __init__(
        self,
        model: Any,
        settings: EngineSettings,
        *,
        options: FSDPEngineOptions | None = None,
        optim: Any = None,
        total_training_steps: int = 1,
        device: torch.device | str = "cpu",
        bucket_megabytes: int = 2048,
        backend: str | None = None,
    ) -> None:
        self.options = options or FSDPEngineOptions()
        device = torch.device(device)
        ensure_process_group(backend or DIST_BACKENDS.get(device.type, "gloo"))
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.mesh = build_mesh(device.type, self.world_size, self.options.fsdp_size)
        self.bucket_bytes = max(1, int(bucket_megabytes)) << 20
        self._norm: dict[str, Any] | None = None
        self._notices(device)
        super().__init__(
            model,
            settings,
            optim=optim,
            total_training_steps=total_training_steps,
            device=device,
            param_offload=self.options.param_offload and not self.options.offload_policy,
            optimizer_offload=self.options.optimizer_offload and not self.options.offload_policy,
        )

    def _notices(self, device: torch.device) -> None:
        opts = self.options
        if device.type == "cpu":
            for name in ("param_offload", "optimizer_offload", "offload_policy"):
                if getattr(opts, name):
                    notice_once(
                        name, "verl-fsdp: %s=true has no effect on the cpu device (weights already live there)", name
                    )
            if opts.mixed_precision.param_dtype not in (None, "auto", "float32", "fp32"):
                notice_once(
                    "cpu_mp",
                    "verl-fsdp: mixed_precision.param_dtype=%s on cpu: low-precision matmuls are several times slower "
                    "than float32 there",
                    opts.mixed_precision.param_dtype,
                )
        if opts.mixed_precision.buffer_dtype is not None:
            notice_once(
                "buffer_dtype",
                "verl-fsdp: mixed_precision.buffer_dtype=%s is an FSDP1 setting; FSDP2 keeps buffers in model_dtype",
                opts.mixed_precision.buffer_dtype,
            )

    # ------------------------------------------------------------------ sharding

    def _wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        opts = self.options
        mp = opts.mixed_precision.resolved(self.device.type)
        field = "actor_rollout_ref.actor.engine_kwargs.fsdp.mixed_precision"
        policy = MixedPrecisionPolicy(
            **{
                name: resolve_dtype(value, self.device, field=f"{field}.{name}") if value else None
                for name, value in mp.items()
            }
        )
        self.mixed_precision = {name: value for name, value in mp.items()}
        offload = CPUOffloadPolicy(pin_memory=True) if opts.offload_policy and self.device.type != "cpu" else None
        kwargs = {
            "mesh": self.mesh,
            "reshard_after_forward": opts.reshard_after_forward,
            "mp_policy": policy,
            "offload_policy": offload or OffloadPolicy(),
        }
        # Decoder layers (HF names them in _no_split_modules) are the FSDP units, like verl's wrap policy.
        layer_classes = set(getattr(model, "_no_split_modules", None) or ())
        layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
        for layer in layers:
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
        if opts.forward_prefetch:
            # verl's apply_fsdp2: each unit prefetches the next one (depth 1, FSDP1's forward_prefetch_limit).
            for layer, following in zip(layers, layers[1:], strict=False):
                layer.set_modules_to_forward_prefetch([following])
        return model

    def _mesh_full(self, tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, DTensor):
            return tensor
        if tensor.device.type != self.mesh.device_type:  # CPU-offloaded shards: gather on the device
            tensor = DTensor.from_local(
                tensor.to_local().to(self.device), tensor.device_mesh, tensor.placements, run_check=False
            )
        return tensor.full_tensor()

    # ------------------------------------------------------------------ data-parallel hooks

    def _plan(
        self, data: Any, *, use_dynamic: bool, micro: int | None, max_tokens: int, packed: bool = False
    ) -> list[list[int]]:
        if len(data) == 0:
            raise ValueError(f"rank {self.rank}: got an empty batch; every rank needs at least one row")
        plan = ReferenceTrainingEngine._plan(
            data, use_dynamic=use_dynamic, micro=micro, max_tokens=max_tokens, packed=packed
        )
        count = int(all_reduce([len(plan)], "max", self.device)[0])
        if count > len(data):
            raise ValueError(
                f"rank {self.rank} holds {len(data)} rows but another rank plans {count} micro-batches; "
                "ranks must receive equally many rows (dispatch the batch evenly over the data-parallel ranks)"
            )
        return _split_to(plan, count)

    def forward_micro_batch(
        self, batch: Any, temperature: float, *, calculate_entropy: bool = False, entropy_grad: bool = True
    ) -> dict[str, torch.Tensor]:
        out = super().forward_micro_batch(
            batch, temperature, calculate_entropy=calculate_entropy, entropy_grad=entropy_grad
        )
        resp_len = batch["responses"].shape[1]
        if bool(batch["attention_mask"][:, -resp_len:].any()):
            return out
        # No response token here: the reference skips the model, but the other ranks' FSDP all-gathers
        # (and, in training, reduce-scatters) need this rank to run it. A zero-weighted term keeps
        # the graph so backward runs too; it adds exactly 0 to every gradient.
        col = slice(-resp_len - 1, -resp_len)
        inputs = {
            "input_ids": batch["input_ids"][:, col].to(self.device),
            "position_ids": batch["position_ids"][:, col].to(self.device),
        }
        if self._fused:  # the fused forward scores no position here (select=0): an empty, still connected graph
            labels = inputs["input_ids"][:, :0]
            log_probs, entropy = self.model(**inputs, select=0, labels=labels, temperature=temperature)
            anchor = log_probs.sum() + entropy.sum()
        else:
            anchor = self.model(**inputs).logits.float().sum()
        if not torch.is_grad_enabled():
            return out
        zero = anchor * 0.0
        return {key: value + zero for key, value in out.items()}

    def _batch_norm(self, mb: Any) -> dict[str, Any]:
        mask = mb.batch["response_mask"]
        lens = mask.to(torch.float64).sum(-1)
        tokens, rows = all_reduce([float(lens.sum()), float((lens > 0).sum())], "sum", self.device)
        self._norm = {"dp_size": self.world_size, "batch_num_tokens": int(tokens), "global_batch_size": int(rows)}
        return dict(self._norm)

    def _reduce_metrics(self, summed: dict[str, float]) -> dict[str, float]:
        if self.world_size == 1:
            return summed
        names: list[Any] = [None] * self.world_size
        dist.all_gather_object(names, sorted(summed))
        keys = sorted({k for ks in names for k in ks})
        values = all_reduce([summed.get(k, 0.0) for k in keys], "sum", self.device)
        return dict(zip(keys, values, strict=True))

    def _clip_grad(self) -> torch.Tensor:
        if self._norm is not None and self._norm["batch_num_tokens"] == 0:
            # No token on any rank: the reference has no gradient at all (its optimizer step is a no-op);
            # here the zero-weighted graphs left zero gradients, which AdamW would still apply (decay,
            # momentum). Dropping them matches the reference.
            self.optimizer.zero_grad(set_to_none=True)
            return torch.tensor(0.0)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=self.settings.clip_grad)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        return norm.detach().cpu()

    # ------------------------------------------------------------------ weights & state

    def iter_weights(
        self, layout: Any = None, *, bucket_bytes: int | None = None, stats: Any = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield the weights for a rollout, in state-dict order (collective: every rank consumes it all).

        Args:
            layout: the rollout's :class:`~verl.engines.weight_sync.layout.WeightLayout` over this world.
                Given, every rank receives exactly its slice of each weight, resharded from the FSDP shards
                bucket by bucket (:func:`verl.engines.weight_sync.reshard.reshard_weights`): a rank never holds
                a whole tensor unless its rollout slice is the whole tensor. None: every rank gets the full
                tensors (shards all-gathered in buckets), e.g. for a standalone rollout fed by broadcast.
            bucket_bytes: bucket cap of the resharding; default ``bucket_megabytes``.
            stats: a :class:`~verl.engines.weight_sync.reshard.ReshardStats` filled in when ``layout`` is given.

        Tensors are on this rank's device, detached, in the parameter dtype; without a layout tied weights
        appear under both names (as ``state_dict()``), with one only the first name is sent.
        """
        self.onload()
        if layout is not None:
            from verl.engines.weight_sync.reshard import reshard_weights

            comm = torch.device("cpu") if self.mesh.device_type == "cpu" else self.device
            yield from reshard_weights(
                self._sync_items(),
                layout,
                bucket_bytes=int(bucket_bytes or self.bucket_bytes),
                device=comm,
                stats=stats,
            )
            return
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        # With LoRA, adapted weights come merged (gathered whole while the stream reaches them, in the same order
        # on every rank); the others stay shards and are gathered bucket by bucket.
        for name, tensor in self._sync_items():
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            if size >= self.bucket_bytes:
                yield from self._gather(bucket)
                bucket, size = [], 0
        yield from self._gather(bucket)

    def weight_manifest(self, layout: Any = None) -> list[tuple[str, tuple[int, ...]]]:
        """``(hf_name, shape)`` of what :meth:`iter_weights` (with ``layout``) yields on this rank; no communication."""
        from verl.engines.weight_sync.layout import local_shape
        from verl.engines.weight_sync.reshard import dedupe_tied

        items = self._sync_named_tensors()
        if layout is not None:  # the resharded stream sends tied weights once
            items, _ = dedupe_tied(items)
        return [(name, local_shape(layout, name, tuple(t.shape), self.rank)) for name, t in items]

    def _full_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._mesh_full(tensor)

    def _writes_files(self) -> bool:
        return self.rank == 0

    def state_options(self) -> Any:
        """DCP state-dict options: with LoRA the frozen base is left out (it is the model folder itself)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(ignore_frozen_params=True, strict=False) if self.lora else None

    def _gather(self, bucket: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        with torch.no_grad():
            return [(name, self._mesh_full(tensor).detach()) for name, tensor in bucket]

    def state_dict(self) -> dict[str, Any]:
        """This rank's *sharded* state: model and optimizer (DTensor shards), LR scheduler, counters.

        Loadable only by the same rank of an engine with the same world size and mesh
        (:meth:`load_state_dict`); use :meth:`save_checkpoint` for DCP checkpoints and :meth:`save_hf`
        or :func:`verl_fsdp.merge_dcp_to_hf` for full weights. Tensors are live references.
        """
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        self.onload()
        state: dict[str, Any] = {
            "model": ckpt.adapter_only(self, get_model_state_dict(self.model, options=self.state_options())),
            "lora": self.lora,
            "global_step": self.global_step,
            "skipped_steps": self.skipped_steps,
            "world_size": self.world_size,
            "rank": self.rank,
        }
        if self.trainable:
            state["optimizer"] = get_optimizer_state_dict(self.model, self.optimizer, options=self.state_options())
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output of the same rank (collective).

        Raises:
            ValueError: ``state`` was written with another world size or by another rank.
        """
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        self.onload()
        saved = (int(state.get("world_size", self.world_size)), int(state.get("rank", self.rank)))
        if saved != (self.world_size, self.rank):
            raise ValueError(
                f"sharded engine state of rank {saved[1]}/{saved[0]} cannot be loaded by rank "
                f"{self.rank}/{self.world_size}; resume with the same world size"
            )
        if bool(state.get("lora", False)) != self.lora:
            raise ValueError(
                f"sharded state {'with' if state.get('lora') else 'without'} a LoRA adapter cannot be loaded by an "
                f"engine with LoRA {'on' if self.lora else 'off'}: resume with the model.lora_rank it was saved with"
            )
        if self.lora:
            self._check_adapter_keys(state["model"])
        set_model_state_dict(self.model, state["model"], options=self.state_options())
        self.global_step = int(state.get("global_step", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        if self.trainable and "optimizer" in state:
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=self.state_options())
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])

    def save_checkpoint(self, folder: Any) -> None:
        """Sharded DCP checkpoint of model, optimizer, LR scheduler and counters (collective); see
        :mod:`verl_fsdp.checkpoint` for the layout."""
        self.onload()  # offloaded shards come back first: the collectives run on the device
        ckpt.save_dcp(self, folder)

    def load_checkpoint(self, folder: Any) -> None:
        """Restore :meth:`save_checkpoint` output (collective, same world size).

        Raises:
            FileNotFoundError: not a verl-fsdp checkpoint. ValueError: different world size.
        """
        self.onload()
        ckpt.load_dcp(self, folder)

    def save_hf(self, path: Any, tokenizer: Any = None) -> None:
        """Gather the full weights to rank 0 (CPU) and write a HF folder there (collective).

        The exported config has ``use_cache: true``.
        """
        self.onload()
        full = ckpt.full_state_dict_rank0(self.model)
        if self.lora:  # merged weights as a plain HF model, and the peft adapter in lora_adapter/
            if self.rank == 0:
                ckpt.write_hf_folder(self.model.config, dict(self.merged(full.items())), path)
            self.save_adapter(f"{path}/{self.adapter_dir}")
        elif self.rank == 0:
            ckpt.write_hf_folder(self.model.config, full, path)
        if self.rank == 0 and tokenizer is not None:
            tokenizer.save_pretrained(str(path))
        del full
        dist.barrier()

    def offload(self, *, keep_params: bool = False) -> dict[str, int]:
        """As the reference engine (weights under ``param_offload``, optimizer state under ``optimizer_offload``
        to host memory; ``Module.to`` moves the FSDP2 shards), except under ``offload_policy``, where FSDP's
        ``CPUOffloadPolicy`` already keeps everything on the host."""
        if self.options.offload_policy:
            return {"params_bytes": 0, "optimizer_bytes": 0}
        return super().offload(keep_params=keep_params)


class FSDPCriticEngine(FSDPTrainingEngine, ReferenceCriticEngine):
    """The critic (value model, :class:`ReferenceCriticEngine`) FSDP2-sharded like :class:`FSDPTrainingEngine`.

    MRO: the FSDP hooks (sharding, global normalisers, equal micro-batch counts, metric all-reduce, DCP
    checkpoints) over the critic's model loading and value forward; ``compute_values`` is collective.

    Args: as :class:`FSDPTrainingEngine`, plus ``trust_remote_code`` for loading the value model.
    """

    def __init__(self, *args: Any, trust_remote_code: bool = False, **kwargs: Any) -> None:
        self._trust_remote_code = trust_remote_code
        super().__init__(*args, **kwargs)
