"""The hybrid-engine worker: actor, rollout and reference policy in one process per rank.

Engines are looked up by name in the plugin manager (``actor.strategy``, ``rollout.name``,
``rollout.checkpoint_engine.backend``), so the same worker drives the reference engines,
FSDP, vLLM or any third-party backend. The trainer calls the ``@register``-ed methods on a
worker group (:class:`verl.controller.LocalWorkerGroup` or the Ray group); data methods split a batch over
data-parallel replicas and join it back in order: the ``actor`` mesh (an engine with ``dispatch_info()``, e.g.
Megatron's TP x PP ranks, gets one chunk per replica) and the ``rollout`` mesh (TP rollout replicas).

Follows ``verl/workers/engine_workers.py:ActorRolloutRefWorker`` (roles ``actor``,
``rollout``, ``ref`` and their combinations).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from verl.controller import Dispatch, Worker, register
from verl.controller.mesh_dispatch import make_nd_compute_dataproto_dispatch_fn
from verl.engines.base import wake_up_tagged
from verl.workers.switching import PhasePeaks, measured

logger = logging.getLogger(__name__)

ROLES = ("actor", "rollout", "ref", "actor_ref", "actor_rollout", "actor_rollout_ref")


class ActorRolloutRefWorker(Worker):
    """One rank of the actor / rollout / reference roles.

    Args:
        config: :class:`verl.config.RootConfig`.
        role: one of ``actor``, ``rollout``, ``ref``, ``actor_ref``, ``actor_rollout``, ``actor_rollout_ref``
            (``actor_ref`` and ``rollout`` are the two pools of the colocated and standalone placements).

    Raises:
        ValueError: unknown role.
    """

    def __init__(self, config: Any, role: str = "actor_rollout_ref") -> None:
        super().__init__()
        if role not in ROLES:
            raise ValueError(f"ActorRolloutRefWorker role must be one of {ROLES}, got {role!r}")
        self.config = config
        self.role = role
        self._is_actor = "actor" in role
        self._is_rollout = "rollout" in role
        self._is_ref = role in ("ref", "actor_ref", "actor_rollout_ref")
        self.actor = self.rollout = self.ref = self.weight_sync = None
        self.tokenizer = None
        self.phases: PhasePeaks | None = None

    # ------------------------------------------------------------------ set-up

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int = 1) -> dict[str, Any]:
        """Resolve the model, build the engines of this worker's roles; returns a short summary."""
        from verl.config.engine_options import role_options
        from verl.config.placement import separate_rollout_pool
        from verl.models import load_tokenizer, resolve_model_path
        from verl.plugins import get_plugin_manager, resolve_platform

        cfg = self.config
        arr = cfg.actor_rollout_ref
        platform = resolve_platform(cfg.trainer.device)
        self.platform = platform
        if platform.device_count() > 0 and platform.name != "cpu":
            # Ray gives each actor one visible device (index 0); torchrun shows all and uses LOCAL_RANK.
            platform.set_device(self.local_rank % platform.device_count())
        self._init_process_group(platform)
        self.threads = platform.configure_threads(self.local_world_size)
        self.allocator = platform.configure_allocator()
        platform.manual_seed(cfg.trainer.seed + self.rank)
        device = platform.torch_device()
        model_path = resolve_model_path(arr.model.path)
        self.model_path = model_path
        self.tokenizer = load_tokenizer(
            arr.model.tokenizer_path or model_path, trust_remote_code=arr.model.trust_remote_code
        )
        pm = get_plugin_manager()
        if self._is_actor:
            spec = pm.get("training_engine", arr.actor.strategy)
            # Every factory gets the options config load validated, by the same rule (verl.config.engine_options).
            self.actor = spec.factory(
                cfg,
                role="actor",
                model=model_path,
                options=role_options(cfg, "actor", spec),
                total_training_steps=total_training_steps,
                device=device,
                world_size=self.world_size,
            )
        needs_ref = self._is_ref and (arr.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward)
        if needs_ref and getattr(self.actor, "lora", False):
            from verl.engines.lora import AdapterDisabledReference

            # verl: the reference policy of a LoRA actor is its own module with the adapters disabled.
            self.ref = AdapterDisabledReference(self.actor)
        elif needs_ref:
            spec = pm.get("training_engine", arr.ref.strategy or arr.actor.strategy)
            self.ref = spec.factory(
                cfg,
                role="ref",
                model=model_path,
                options=role_options(cfg, "ref", spec),
                device=device,
                world_size=self.world_size,
            )
        # A model-parallel engine (Megatron: TP x PP x CP ranks per replica) answers where this rank sits; its
        # replica's ranks then get the same rows and one of them returns them. Others are plain data parallel.
        trainer = self.actor if self.actor is not None else self.ref
        if trainer is not None and hasattr(trainer, "dispatch_info"):
            dp_rank, dp_size, is_collect = trainer.dispatch_info()
            self.register_dispatch_collect_info("actor", dp_rank=dp_rank, dp_size=dp_size, is_collect=is_collect)
        if self._is_rollout:
            spec = pm.get("rollout_engine", arr.rollout.name)
            train_spec = pm.get("training_engine", arr.actor.strategy) if self.actor is not None else None
            shared = (
                train_spec is not None
                and "share_module" in spec.capabilities
                and "share_module" in train_spec.capabilities
                and hasattr(self.actor, "model")
            )
            # Sharing the actor's module avoids a second copy of the weights (and makes sync free);
            # only when both sides declare it: a sharded (FSDP) module cannot be generated from
            # rank-locally, and only some rollout backends can drive a module they do not own.
            self.rollout = spec.factory(
                cfg,
                model=self.actor.model if shared else model_path,
                tokenizer=self.tokenizer,
                options=role_options(cfg, "rollout", spec),
                device=device,
            )
            # A rollout replica is tensor_model_parallel_size consecutive ranks: they share one chunk of every
            # generation batch, and the first of them returns it.
            tp = int(arr.rollout.tensor_model_parallel_size)
            self.register_dispatch_collect_info(
                "rollout", dp_rank=self.rank // tp, dp_size=self.world_size // tp, is_collect=self.rank % tp == 0
            )
        if (self.actor is not None and self.rollout is not None) or (
            separate_rollout_pool(cfg) and (self._is_actor or self._is_rollout)
        ):
            # Hybrid: hand-over inside this process. Colocated / standalone: this side of a cross-pool sync
            # group, joined later with init_weight_sync.
            backend = arr.rollout.checkpoint_engine.backend
            # The worker's platform is handed down: engines never resolve one themselves.
            sync_spec = pm.get("checkpoint_engine", backend)
            self.weight_sync = sync_spec.factory(
                cfg, options=role_options(cfg, "checkpoint", sync_spec), platform=platform
            )
        self.phases = PhasePeaks(platform)
        return {
            "rank": self.rank,
            "model_path": str(model_path),
            "device": str(device),
            "roles": self.role,
            "ref": self.ref is not None,
            "threads": self.threads,
            "allocator": self.allocator,
            "rollout_tp": int(arr.rollout.tensor_model_parallel_size) if self.rollout is not None else None,
        }

    def _init_process_group(self, platform: Any) -> None:
        """Join the group's ``torch.distributed`` world (world size > 1) over the platform's backend.

        The worker group sets ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` (Ray group, torchrun).
        The group's timeout is ``actor_rollout_ref.nccl_timeout`` seconds (verl's ``fsdp_workers`` passes it
        the same way, whatever the backend).

        Raises:
            RuntimeError: world size > 1 without a rendezvous address (e.g. an in-process group).
        """
        import torch.distributed as dist

        if self.world_size == 1 or dist.is_initialized():
            return
        addr, port = self.get_master_addr_port()
        if addr is None or port is None:
            raise RuntimeError(
                f"rank {self.rank} of {self.world_size}: no MASTER_ADDR/MASTER_PORT to join torch.distributed; "
                "run world size > 1 under trainer.controller=ray (or torchrun), not in-process"
            )
        from verl.platform.network import init_process_group

        # Rank 0's store listens on MASTER_ADDR only: loopback for a group on one node (issue #36).
        init_process_group(
            platform.dist_backend,
            addr,
            int(port),
            self.rank,
            self.world_size,
            timeout_s=int(self.config.actor_rollout_ref.nccl_timeout),
        )

    # ------------------------------------------------------------------ rollout

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("rollout"))
    def generate_sequences(self, prompts: Any) -> Any:
        """Generate one response per row (rows already repeated ``n`` times); verl's output keys.

        Dispatched per rollout replica: the ``tensor_model_parallel_size`` ranks of a replica get the same
        chunk (they generate it together) and the first returns it.
        """
        self._need(self.rollout, "rollout")
        start = time.perf_counter()
        if self.config.actor_rollout_ref.rollout.mode == "async":
            out = self._agent_loop_manager().generate_sequences(prompts)
        else:
            out = self.rollout.generate(prompts)
        out.meta_info.setdefault("timing", {})["generate_sequences"] = time.perf_counter() - start
        return out

    def _agent_loop_manager(self) -> Any:
        """The agent-loop manager of ``rollout.mode=async`` over this worker's engine's server (built once)."""
        manager = getattr(self, "_agents", None)
        if manager is None:
            from verl.agents.setup import build_agent_loop_manager

            manager = self._agents = build_agent_loop_manager(self.config, [self.rollout.server()], self.tokenizer)
        return manager

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_weights(self) -> dict[str, Any]:
        """Push the actor's weights into the rollout engine through the checkpoint engine (collective).

        Returns this rank's ``weight_sync/<key>`` metrics (tensors, bytes, resharding buckets and buffer
        peak, seconds) and the peak memory of the sync (``memory/update_weights/peak_*_gb``).
        """
        self._need(self.actor, "actor")
        self._need(self.rollout, "rollout")
        metrics = self.weight_sync.sync(self.actor, self.rollout)
        out = {f"weight_sync/{k}": float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        out.update(self.phases.close("update_weights"))
        return out

    # ------------------------------------------------------------------ mode switches (hybrid engine)

    def _rollout_switches(self) -> bool:
        """Whether this worker's rollout sleeps between generations: verl's ``free_cache_engine``, and never in
        standalone placement (its rollout has devices of its own)."""
        from verl.config.placement import rollout_placement

        rollout = self.config.actor_rollout_ref.rollout
        return self.rollout is not None and rollout.free_cache_engine and rollout_placement(self.config) != "standalone"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep_rollout(self) -> dict[str, float]:
        """After generation: read the generation's memory peak, then let the rollout free its memory."""
        out = self.phases.close("gen")
        if self._rollout_switches():
            out.update(measured(self.platform, "sleep", self.rollout.sleep))
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def wake_up_rollout(self, tags: list[str]) -> dict[str, float]:
        """Give the rollout back its memory for ``tags`` (``["weights"]`` before the sync, ``["kv_cache"]`` after).

        Waking the weights closes the training phase (``memory/train/peak_*_gb``); waking the KV cache
        starts the generation phase.
        """
        out: dict[str, float] = {}
        if "weights" in tags:
            out.update(self.phases.close("train"))
        if self._rollout_switches():
            name = "wake_up_" + "_".join(tags)
            out.update(measured(self.platform, name, lambda: wake_up_tagged(self.rollout, tags)))
        if "kv_cache" in tags:
            self.phases.restart()
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def offload_trainer(self) -> dict[str, float]:
        """Before generation: move the actor's (and ref's) weights / optimizer state to host memory as their
        options say (``param_offload``, ``optimizer_offload``; nothing on CPU)."""
        out: dict[str, float] = {}
        for name, engine in (("actor", self.actor), ("ref", self.ref)):
            if engine is not None and hasattr(engine, "offload"):
                out.update(measured(self.platform, f"offload_{name}", lambda e=engine: self._offload(e)))
        return out

    def _offload(self, engine: Any) -> Any:
        """``engine.offload()``; an engine whose module the rollout generates from keeps its weights on the
        device (only its optimizer state can move), whatever ``param_offload`` says."""
        from verl.engines.reference.offload import HostOffload
        from verl.engines.weight_sync.colocated import shares_module

        if self.rollout is not None and shares_module(engine, self.rollout):
            return engine.offload(keep_params=True) if isinstance(engine, HostOffload) else None
        return engine.offload()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def onload_trainer(self) -> dict[str, float]:
        """After generation: bring the actor's (and ref's) offloaded state back to the device."""
        out: dict[str, float] = {}
        for name, engine in (("actor", self.actor), ("ref", self.ref)):
            if engine is not None and hasattr(engine, "onload"):
                out.update(measured(self.platform, f"onload_{name}", engine.onload))
        return out

    # ------------------------------------------------------------------ standalone weight sync

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def weight_sync_address(self, spans_nodes: bool = False) -> tuple[str, int]:
        """``(address, free port)`` where the trainer's sender hosts the sync group on this rank's node.

        ``127.0.0.1`` when the trainer and rollout pools share this node (``spans_nodes`` False), else this node's
        address in the Ray cluster (pools on several nodes are Ray pools); the sync group's store and sockets bind
        it (:mod:`verl.platform.network`).
        """
        from verl.platform.network import LOOPBACK_HOST, free_port

        if spans_nodes:
            import ray

            host = ray.util.get_node_ip_address()
        else:
            host = LOOPBACK_HOST
        return host, free_port(host)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_weight_sync(self, master_addr: str, master_port: int, rollout_world_size: int) -> None:
        """Join the trainer -> rollout sync group of standalone mode (call on both pools at once).

        Sync ranks: the actor's rank 0 is the sender (0); other actor ranks only take part in the
        weight gather; rollout rank ``r`` is ``1 + r``.
        """
        self._need(self.weight_sync, "weight sync (set actor_rollout_ref.rollout.placement=colocated or standalone)")
        if self._is_actor:
            rank = 0 if self.rank == 0 else None
        else:
            rank = 1 + self.rank
        self.weight_sync.init_group(
            master_addr=master_addr, master_port=master_port, rank=rank, world_size=1 + rollout_world_size
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def sync_weights(self) -> dict[str, Any]:
        """Standalone / colocated placement: the actor pool sends its weights, the rollout pool receives them
        (call both); returns this rank's ``weight_sync/<key>`` metrics."""
        self._need(self.weight_sync, "weight sync")
        out: dict[str, float] = {}
        if self._is_actor:
            out.update(self.phases.close("train"))  # a pool without a rollout: its training phase ends here
            metrics = self.weight_sync.sync(self.actor, None)
        else:
            metrics = self.weight_sync.sync(None, self.rollout)
        out.update({f"weight_sync/{k}": float(v) for k, v in metrics.items() if isinstance(v, int | float)})
        out.update(self.phases.close("update_weights"))
        return out

    # ------------------------------------------------------------------ actor / ref

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def compute_log_prob(self, data: Any) -> Any:
        """``old_log_probs`` and ``entropys`` ``(bs, resp_len)`` under the current actor weights."""
        self._need(self.actor, "actor")
        return self.actor.compute_log_prob(data, calculate_entropy=True)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def compute_ref_log_prob(self, data: Any) -> Any:
        """``ref_log_prob`` ``(bs, resp_len)`` under the frozen reference policy."""
        self._need(self.ref, "ref (enable actor.use_kl_loss or algorithm.use_kl_in_reward)")
        out = self.ref.compute_log_prob(data, calculate_entropy=False)
        out.rename("old_log_probs", "ref_log_prob")
        return out

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def update_actor(self, data: Any) -> Any:
        """One training step of the actor on ``data``; returns metrics in ``meta_info["metrics"]``."""
        from verl.workers.losses import make_ppo_loss

        self._need(self.actor, "actor")
        start = time.perf_counter()
        # Without a separate old_log_prob pass, actor/entropy is measured in the update's own forward.
        source = data.meta_info.get("old_log_prob_source", "recompute")
        loss_fn = make_ppo_loss(
            self.config.actor_rollout_ref.actor,
            entropy_metric=source != "recompute",
            rollout_correction=self.config.algorithm.rollout_correction,
        )
        metrics = self.actor.train_batch(data, loss_fn)
        metrics["perf/update_actor_s"] = [time.perf_counter() - start]
        return _metrics_proto(metrics)

    # ------------------------------------------------------------------ checkpoints

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> dict[str, Any]:
        """Write this rank's actor state (model, optimizer, scheduler) under ``path``.

        The reference engine writes :mod:`verl.engines.reference.checkpoint_files` (safetensors, weights-only
        optimizer file, JSON); a sharded engine its own format (e.g. DCP).

        Returns:
            ``{"rank": int, "nonfinite": [names of parameters holding NaN/inf on this rank]}``, the checkpoint's
            health as this rank saw it.
        """
        from verl.engines.reference.checkpoint_files import save_engine_state
        from verl.engines.safe_files import engine_nonfinite_state

        self._need(self.actor, "actor")
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        if hasattr(self.actor, "save_checkpoint"):  # sharded engines write their own format (e.g. DCP)
            self.actor.save_checkpoint(folder)
        else:
            save_engine_state(folder, self.actor.state_dict(), self.world_size, self.rank)
        if getattr(self.actor, "lora", False):  # the adapter as a peft folder, for `verl export` (collective)
            from verl.engines.lora import ADAPTER_DIR

            self.actor.save_adapter(folder / ADAPTER_DIR)
        if self.rank == 0:
            self._write_export_info(folder)
        return {"rank": self.rank, "nonfinite": engine_nonfinite_state(self.actor)[0]}

    def _write_export_info(self, folder: Path) -> None:
        """``huggingface/`` (config + tokenizer) and ``checkpoint.json`` (engine, world size) for ``verl export``.

        The config is the one the actor was built from: ``model.override_config`` applied.
        """
        from verl.engines.reference.export import write_export_info

        model = self.config.actor_rollout_ref.model
        write_export_info(
            folder,
            model_path=self.model_path,
            tokenizer=self.tokenizer,
            strategy=self.config.actor_rollout_ref.actor.strategy,
            world_size=self.world_size,
            lora=bool(getattr(self.actor, "lora", False)),
            trust_remote_code=model.trust_remote_code,
            override_config=model.override_config,
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote, refuse non-finite state, then re-sync the rollout weights.

        Raises:
            LegacyCheckpointError: the old pickle format (names ``verl checkpoint convert``).
            CheckpointFileError: a file missing (another world size?), truncated or corrupt (names the file).
            NonFiniteCheckpointError: loaded parameters or optimizer state hold NaN/inf (names them and ``path``).
        """
        from verl.engines.reference.checkpoint_files import load_engine_state
        from verl.engines.safe_files import NonFiniteCheckpointError, engine_nonfinite_state

        self._need(self.actor, "actor")
        if hasattr(self.actor, "load_checkpoint"):
            self.actor.load_checkpoint(Path(path))
        else:
            self.actor.load_state_dict(load_engine_state(path, self.world_size, self.rank))
        params, optim = engine_nonfinite_state(self.actor)
        if params or optim:
            raise NonFiniteCheckpointError(path, params or optim, "parameters" if params else "optimizer state")
        if self.rollout is not None:
            self.weight_sync.sync(self.actor, self.rollout)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> str:
        """Write the actor as a HF folder (weights + tokenizer) loadable by ``from_pretrained``.

        Every rank calls it: a sharded engine gathers the full weights collectively and rank 0 writes.
        """
        self._need(self.actor, "actor")
        self.actor.save_hf(path, self.tokenizer)
        return str(path)

    @staticmethod
    def _need(engine: Any, name: str) -> None:
        if engine is None:
            raise RuntimeError(f"this worker has no {name} engine (call init_model first, or check its role)")


def _metrics_proto(metrics: dict[str, list[float]]) -> Any:
    from verl.protocol import DataProto

    # An empty batch carrying only meta_info: DP_COMPUTE_PROTO concat merges the metrics of every rank.
    return DataProto(batch=None, non_tensor_batch={}, meta_info={"metrics": metrics})
