"""The critic worker: a value model trained for GAE, driven by the single controller.

The training engine is looked up by name (``critic.strategy``, null = the actor's strategy) and
built with ``role="critic"``, so the same worker drives the reference engine, FSDP or any
backend whose factory accepts that role. Data methods use ``DP_COMPUTE_PROTO``: a batch is split
over data-parallel ranks and joined back in order.

Follows verl's legacy ``verl/workers/fsdp_workers.py:CriticWorker`` (``init_model``,
``compute_values``, ``update_critic``, ``save_checkpoint``, ``load_checkpoint``) and
``verl/workers/critic/dp_critic.py``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from verl.controller import Dispatch, Worker, register
from verl.controller.mesh_dispatch import make_nd_compute_dataproto_dispatch_fn


def resolve_model_folder(path: Any) -> Path:
    """An existing local folder as is (any architecture: a value or reward model), else
    :func:`verl.models.resolve_model_path` (built-in names, cached hub ids; causal LMs only).

    Raises:
        ModelResolutionError (ValueError): ``path`` is not a folder and ``resolve_model_path`` cannot resolve it
            (``ModelNotFoundError`` when it does not exist).
    """
    from verl.models import resolve_model_path

    folder = Path(str(path)).expanduser()
    return folder if folder.is_dir() else resolve_model_path(path)


def load_critic_tokenizer(cfg: Any, model_path: Any) -> Any:
    """The critic's tokenizer (verl loads ``critic.model.tokenizer_path`` for the value model).

    ``critic.model.tokenizer_path`` null follows the actor's tokenizer (``load_config`` fills it), else the
    critic's model folder. The critic scores the token ids the actor's tokenizer produced, so a different
    tokenizer must have the same vocabulary (token -> id); verl does not check this, and a mismatch would
    train the value model on ids it reads as other tokens.

    Raises:
        ValueError: the critic's tokenizer maps tokens to ids differently from the actor's (the message names
            ``critic.model.tokenizer_path`` and how many entries differ).
    """
    from verl.models import load_tokenizer

    critic, actor = cfg.critic.model, cfg.actor_rollout_ref.model
    path = critic.tokenizer_path or actor.tokenizer_path or model_path
    tokenizer = load_tokenizer(path, trust_remote_code=critic.trust_remote_code)
    actor_path = actor.tokenizer_path or actor.path
    if str(path) == str(actor_path):
        return tokenizer
    reference = load_tokenizer(actor_path, trust_remote_code=actor.trust_remote_code)
    ours, theirs = tokenizer.get_vocab(), reference.get_vocab()
    if ours != theirs:
        differ = len(set(ours.items()) ^ set(theirs.items()))
        raise ValueError(
            f"critic.model.tokenizer_path={str(path)!r} maps tokens to ids differently from the actor's tokenizer "
            f"{str(actor_path)!r} ({len(ours)} vs {len(theirs)} entries, {differ} (token, id) pairs differ): the "
            "critic reads the actor's token ids, so it needs the same vocabulary; leave "
            "critic.model.tokenizer_path null (= the actor's) or point it at a tokenizer with the same vocabulary"
        )
    return tokenizer


class CriticWorker(Worker):
    """One rank of the critic role.

    Args:
        config: :class:`verl.config.RootConfig` with ``critic.*`` resolved (``load_config`` fills the null
            keys from the actor's).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.critic = None
        self.tokenizer = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int = 1) -> dict[str, Any]:
        """Resolve ``critic.model.path`` and build the critic engine; returns a short summary.

        Raises:
            UnknownPluginError: ``critic.strategy`` names no training engine.
            ValueError: the model cannot be loaded as a value model, or the engine does not support the
                ``critic`` role.
        """
        from verl.config.engine_options import role_options
        from verl.plugins import get_plugin_manager, resolve_platform

        cfg = self.config
        platform = resolve_platform(cfg.trainer.device)
        if platform.device_count() > 0 and platform.name != "cpu":
            platform.set_device(self.local_rank % platform.device_count())
        self._init_process_group(platform)
        platform.configure_threads(self.local_world_size)
        platform.configure_allocator()
        platform.manual_seed(cfg.trainer.seed + self.rank)
        device = platform.torch_device()
        strategy = cfg.critic.strategy or cfg.actor_rollout_ref.actor.strategy
        model_path = resolve_model_folder(cfg.critic.model.path or cfg.actor_rollout_ref.model.path)
        self.tokenizer = load_critic_tokenizer(cfg, model_path)
        spec = get_plugin_manager().get("training_engine", strategy)
        self.critic = spec.factory(
            cfg,
            role="critic",
            model=model_path,
            # critic.engine_kwargs.<strategy> only: the critic does not inherit the actor's options (verl).
            options=role_options(cfg, "critic", spec),
            total_training_steps=total_training_steps,
            device=device,
            world_size=self.world_size,
        )
        if not hasattr(self.critic, "compute_values"):
            raise ValueError(
                f"critic.strategy={strategy!r}: its engine for role='critic' has no compute_values (not a value "
                "model engine); use critic.strategy=reference or fsdp"
            )
        if hasattr(self.critic, "dispatch_info"):  # model-parallel replicas (Megatron): one chunk per replica
            dp_rank, dp_size, is_collect = self.critic.dispatch_info()
            self.register_dispatch_collect_info("critic", dp_rank=dp_rank, dp_size=dp_size, is_collect=is_collect)
        self.strategy = strategy
        self._platform = platform
        return {"rank": self.rank, "model_path": str(model_path), "device": str(device), "strategy": strategy}

    def _init_process_group(self, platform: Any) -> None:
        """Join ``torch.distributed`` for world size > 1 (same rendezvous as the actor worker)."""
        from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

        ActorRolloutRefWorker._init_process_group(self, platform)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def offload_trainer(self) -> dict[str, float]:
        """Before generation: the critic's weights / optimizer state to host memory as its options say
        (``critic.engine_kwargs.<strategy>.param_offload`` / ``optimizer_offload``; nothing on CPU)."""
        from verl.workers.switching import measured

        self._need()
        return (
            measured(self._platform, "offload_critic", self.critic.offload) if hasattr(self.critic, "offload") else {}
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def onload_trainer(self) -> dict[str, float]:
        """After generation: bring the critic's offloaded state back."""
        from verl.workers.switching import measured

        self._need()
        return measured(self._platform, "onload_critic", self.critic.onload) if hasattr(self.critic, "onload") else {}

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("critic"))
    def compute_values(self, data: Any) -> Any:
        """``values`` ``(bs, resp_len)`` float32 of the responses under the current critic (0 on padding)."""
        self._need()
        return self.critic.compute_values(data)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("critic"))
    def update_critic(self, data: Any) -> Any:
        """One training step of the critic on ``data`` (needs ``values``, ``returns``, ``response_mask``).

        Returns:
            an empty DataProto whose ``meta_info["metrics"]`` holds lists of ``critic/vf_loss``,
            ``critic/vf_clipfrac``, ``critic/vpred_mean`` (per mini-batch), ``critic/grad_norm``, ``critic/lr``
            (per optimizer step), ``critic/skipped_steps`` and ``perf/update_critic_s``.
        """
        from verl.workers.actor_rollout_ref import _metrics_proto
        from verl.workers.losses import make_value_loss

        self._need()
        start = time.perf_counter()
        metrics = self.critic.train_batch(data, make_value_loss(self.config.critic))
        metrics["perf/update_critic_s"] = [time.perf_counter() - start]
        return _metrics_proto(metrics)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> dict[str, Any]:
        """Write this rank's critic state (model, optimizer, scheduler) under ``path`` (``global_step_N/critic``):
        :mod:`verl.engines.reference.checkpoint_files` for the reference engine, a sharded engine's own format.

        Returns:
            ``{"rank": int, "nonfinite": [critic parameters holding NaN/inf on this rank]}``.
        """
        from verl.engines.reference.checkpoint_files import save_engine_state
        from verl.engines.safe_files import engine_nonfinite_state

        self._need()
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        if hasattr(self.critic, "save_checkpoint"):  # sharded engines write their own format (e.g. DCP)
            self.critic.save_checkpoint(folder)
        else:
            save_engine_state(folder, self.critic.state_dict(), self.world_size, self.rank)
        if self.rank == 0 and self.tokenizer is not None:  # verl keeps the critic's tokenizer in huggingface/
            self.tokenizer.save_pretrained(str(folder / "huggingface"))
        return {"rank": self.rank, "nonfinite": [f"critic:{n}" for n in engine_nonfinite_state(self.critic)[0]]}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote and refuse non-finite state.

        Raises:
            FileNotFoundError: ``path`` does not exist (saved without a critic, or the part was pruned by
                ``trainer.max_critic_ckpt_to_keep``).
            LegacyCheckpointError: the old pickle format (names ``verl checkpoint convert``).
            CheckpointFileError: no critic state for this rank and world size, or a truncated / corrupt file.
            NonFiniteCheckpointError: loaded parameters or optimizer state hold NaN/inf (names them and ``path``).
        """
        from verl.engines.reference.checkpoint_files import load_engine_state
        from verl.engines.safe_files import NonFiniteCheckpointError, engine_nonfinite_state

        self._need()
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(
                f"critic checkpoint {folder} not found (saved without a critic, or its critic part was removed by "
                "trainer.max_critic_ckpt_to_keep)"
            )
        if hasattr(self.critic, "load_checkpoint"):
            self.critic.load_checkpoint(folder)
        else:
            self.critic.load_state_dict(load_engine_state(folder, self.world_size, self.rank))
        params, optim = engine_nonfinite_state(self.critic)
        if params or optim:
            raise NonFiniteCheckpointError(path, params or optim, "parameters" if params else "optimizer state")

    def _need(self) -> None:
        if self.critic is None:
            raise RuntimeError("this worker has no critic engine: call init_model first")
