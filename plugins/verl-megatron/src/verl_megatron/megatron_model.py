"""One rank's Megatron model: parallel state, GPTModel built and loaded from HF, DDP, optimizer, weights out.

:class:`MegatronModel` is what :class:`verl_megatron.engine.MegatronTrainingEngine` drives; it owns every call
into Megatron-core that needs the CPU shims (:mod:`verl_megatron.cpu_compat`, entered through :meth:`compat`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from verl_megatron import cpu_compat, parallel, value_head
from verl_megatron import weights as wmap
from verl_megatron.model_config import (
    ModelShape,
    build_transformer_config,
    gpt_model_kwargs,
    layer_spec,
    padded_vocab_size,
)
from verl_megatron.weights_out import HFWeightsOut

logger = logging.getLogger(__name__)
DIST_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
_NOTICED: set[str] = set()


def notice_once(key: str, message: str, *args: Any) -> None:
    """``logger.warning`` once per process and ``key``."""
    if key not in _NOTICED:
        _NOTICED.add(key)
        logger.warning(message, *args)


def _torch_params(inner: Any) -> list[Any]:
    torch_opt = getattr(inner, "optimizer", None)
    return [p for g in getattr(torch_opt, "param_groups", []) for p in g["params"]]


def _torch_steps(inner: Any) -> list[Any]:
    """The torch optimizer's ``state[p]["step"]`` of each parameter of a Megatron optimizer (None where unset)."""
    state = getattr(getattr(inner, "optimizer", None), "state", {})
    return [state[p]["step"].clone() if p in state and "step" in state[p] else None for p in _torch_params(inner)]


def _set_torch_steps(inner: Any, steps: list[Any]) -> None:
    state = inner.optimizer.state
    for p, step in zip(_torch_params(inner), steps, strict=True):
        if step is not None and p in state:
            state[p]["step"] = step.clone()


def _embedding_padding_idx(embedding: torch.nn.Module, padding_idx: int) -> None:
    """Give Megatron's vocab-parallel embedding HF's ``nn.Embedding(padding_idx=pad_token_id)`` semantics.

    HF decoders (``LlamaModel.embed_tokens``) never update the pad token's row from its lookups; Megatron's
    embedding has no padding index, so a response that samples the pad id (SmolLM2's pad is a real token) would
    get another gradient than the reference and FSDP engines. The lookup output at those positions is detached:
    the forward is unchanged, the row gets no gradient from them (a tied LM head still trains it, as in HF).
    """

    def hook(module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        tokens = args[0]
        if tuple(output.shape[:-1]) != tuple(tokens.shape):
            # Sequence parallel reduce-scatters the lookup (output no longer lines up with the tokens).
            notice_once("pad_sp", "verl-megatron: pad-token embedding gradients not masked under sequence_parallel")
            return output
        hit = (tokens == padding_idx).unsqueeze(-1)
        if not bool(hit.any()):
            return output
        return torch.where(hit, output.detach(), output)

    embedding.register_forward_hook(hook)


def _te_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformer_engine") is not None


class MegatronModel(HFWeightsOut):
    """Build this rank's pipeline stage of the model and everything Megatron needs to train it.

    Args: see :class:`verl_megatron.engine.MegatronTrainingEngine` (``model`` is the HF folder).

    Raises:
        verl.config.ConfigError: the layout does not fit (names the ``engine_kwargs.megatron`` keys).
        ValueError: an override key that is not a TransformerConfig / DDP config field.
    """

    def __init__(
        self,
        model: Any,
        *,
        settings: Any,
        options: Any,
        optim: Any,
        device: torch.device,
        world_size: int,
        load_weights: bool = True,
        value_model: bool = False,
    ) -> None:
        from verl.config import ConfigError, ConfigIssue
        from verl.engines.dtypes import resolve_dtype
        from verl.models.hf_config import load_hf_config

        self.device = device
        self.on_cpu = device.type == "cpu"
        self.options = options
        self.settings = settings
        self.model_path = model
        self.load_weights = load_weights
        self.value_model = value_model  # the critic: a one-output value head instead of the vocabulary head
        self.hf_config = load_hf_config(
            model, trust_remote_code=settings.trust_remote_code, override_config=settings.override_config
        )
        self.shape = ModelShape.from_hf_config(self.hf_config)
        self.layout = parallel.ParallelLayout.from_options(options, world_size)
        sp = options.resolved_sequence_parallel(device.type)
        problems = parallel.layout_problems(self.layout, self.shape, device_type=device.type, sequence_parallel=sp)
        if self.layout.vpp is not None:
            problems.append(
                f"{parallel.KEY}.virtual_pipeline_model_parallel_size={self.layout.vpp}: interleaved pipeline stages "
                "are not built in this engine yet (one model chunk per stage); set it to null"
            )
        if problems:
            raise ConfigError([ConfigIssue(parallel.KEY, p) for p in problems])
        options.check_override_names()
        parallel.ensure_process_group(DIST_BACKENDS.get(device.type, "gloo"))
        if dist.get_world_size() != world_size:
            raise ValueError(
                f"megatron training engine: world_size={world_size} but the process group has "
                f"{dist.get_world_size()} ranks; the worker group and torch.distributed must agree"
            )
        self.comm_device = torch.device("cpu") if dist.get_backend() == "gloo" else device
        dtype_name = options.resolved_dtype(device.type)
        self.dtype = resolve_dtype(dtype_name, device, field=f"{parallel.KEY}.dtype")
        impl = options.resolved_transformer_impl(device.type, _te_available())
        self.impl = impl
        self.trainable = optim is not None
        overrides = dict(options.override_transformer_config or {})
        if settings.gradient_checkpointing and self.trainable and "recompute_granularity" not in overrides:
            # verl maps enable_gradient_checkpointing to Megatron's full, uniform recompute of every layer.
            overrides.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
        if self.on_cpu and self.dtype is not torch.float32:
            notice_once("cpu_dtype", "verl-megatron: dtype %s on cpu: low-precision matmuls are slow there", dtype_name)
        with self.compat():
            parallel.initialize(self.layout)
            cpu_compat.init_rng_tracker(int(options.seed), on_cpu=self.on_cpu)
            self.place = parallel.place()
            self.padded_vocab = padded_vocab_size(self.shape.vocab_size, self.layout.tp)
            self.vocab_start = self.place.tp_rank * (self.padded_vocab // self.layout.tp)
            from megatron.core import parallel_state as ps

            cfg = build_transformer_config(
                self.shape,
                tp=self.layout.tp,
                pp=self.layout.pp,
                vpp=self.layout.vpp,
                cp=self.layout.cp,
                ep=self.layout.ep,
                etp=self.layout.etp,
                sequence_parallel=sp,
                params_dtype=self.dtype,
                device_type=device.type,
                overrides=overrides,
            )
            self.config = cfg
            self.base = self._build(cfg, ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage())
            self.module: torch.nn.Module = self.base
            self.optimizer = None
            if self.trainable:
                self._wrap_for_training(cfg, optim)
            else:
                self.base.requires_grad_(False)
        self.base.train(False)

    # ------------------------------------------------------------------ set-up

    @contextlib.contextmanager
    def compat(self, *, optimizer: bool = False) -> Iterator[None]:
        """The CPU shims around a call into Megatron (nothing on accelerators); ``optimizer`` adds the CUDA-device
        argument mapping that the optimizer, DDP and grad-norm code need."""
        if optimizer:
            with cpu_compat.cuda_tensors_on_cpu(self.on_cpu):
                yield
        else:
            with cpu_compat.current_device_is_cpu(self.on_cpu):
                yield

    def _build(self, cfg: Any, first: bool, last: bool) -> torch.nn.Module:
        from megatron.core.models.gpt import GPTModel

        kwargs = gpt_model_kwargs(self.shape, self.padded_vocab)
        if self.value_model:
            kwargs["share_embeddings_and_output_weights"] = False
        model = GPTModel(
            config=cfg,
            transformer_layer_spec=layer_spec(self.shape, self.impl),
            pre_process=first,
            post_process=last,
            **kwargs,
        )
        head = None
        if self.value_model and last:
            head = value_head.attach(model, self.shape.hidden_size, self.dtype, "cpu")
        self._head_rows: torch.Tensor | None = None
        self.head_selects = last and not cfg.sequence_parallel
        if self.head_selects:
            self._select_head_rows(model.output_layer)
        pad = getattr(self.hf_config, "pad_token_id", None)
        if first and pad is not None:
            _embedding_padding_idx(model.embedding.word_embeddings, int(pad))
        layers = list(model.decoder.layers)
        self.layer_offset = int(layers[0].layer_number) - 1 if layers else 0
        self.num_local_layers = len(layers)
        if not self.load_weights:
            return model.to(self.device)
        if head is not None:
            value_head.load(
                head,
                self.model_path,
                seed=int(self.options.seed),
                initializer_range=float(getattr(self.hf_config, "initializer_range", 0.02)),
            )
        wanted = [
            k
            for k in model.state_dict()
            if "_extra_state" not in k and not (self.value_model and k.startswith("output_layer."))
        ]
        shard = wmap.load_hf_shard(
            self.model_path,
            wanted,
            self.shape,
            tp_size=self.layout.tp,
            tp_rank=self.place.tp_rank,
            layer_offset=self.layer_offset,
            padded_vocab=self.padded_vocab,
            dtype=self.dtype,
        )
        missing = sorted(set(wanted) - set(shard))
        if missing:
            raise ValueError(f"weights for {missing[:5]} were not produced from {self.model_path}")
        model.load_state_dict(shard, strict=False)
        return model.to(self.device)

    def _select_head_rows(self, layer: torch.nn.Module) -> None:
        """Run the output layer (vocabulary or value head) on the scored positions only.

        With a 49k vocabulary the head costs about as much as the rest of a small model, and only the positions
        that score a response token are read (the reference engine's ``logits_to_keep``). While
        :meth:`forward` has rows set, the layer gets ``hidden[rows]`` ``(R, b, h)`` instead of ``(s, b, h)``.
        The instance's ``forward`` is wrapped, so the state-dict names stay Megatron's.
        """
        inner = layer.forward

        def forward(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            rows = self._head_rows
            if rows is not None:
                index = rows.t().unsqueeze(-1).expand(-1, -1, hidden.shape[-1])  # (R, b, h)
                hidden = hidden.gather(0, index)
            return inner(hidden, *args, **kwargs)

        layer.forward = forward

    def forward(self, module: torch.nn.Module, inputs: Any) -> tuple[torch.Tensor, bool]:
        """``module`` (this stage, DDP-wrapped or not) on ``inputs``; returns ``(output, selected)``: on the last
        stage the logits ``(b, R, V_local)`` of the scored positions only when ``selected``, else ``(b, s, ...)``
        (hidden states on earlier stages)."""
        self._head_rows = inputs.score_index if self.head_selects else None
        try:
            return module(inputs.input_ids, inputs.position_ids, inputs.attention_mask), self.head_selects
        finally:
            self._head_rows = None

    def _wrap_for_training(self, cfg: Any, optim: Any) -> None:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        cfg.finalize_model_grads_func = finalize_model_grads  # DP all-reduce, tied-embedding sync across PP
        opts = self.options
        ddp_kwargs = {
            "grad_reduce_in_fp32": True,
            "overlap_grad_reduce": False,
            "use_distributed_optimizer": bool(opts.use_distributed_optimizer),
            **dict(opts.override_ddp_config or {}),
        }
        name = str(getattr(optim, "optimizer", "AdamW"))
        if name not in ("AdamW", "Adam"):
            raise ValueError(
                f"actor_rollout_ref.actor.optim.optimizer={name!r}: the megatron engine builds AdamW or Adam"
            )
        betas = tuple(getattr(optim, "betas", (0.9, 0.999)))
        with self.compat(optimizer=True):
            self.module = DistributedDataParallel(
                config=cfg, ddp_config=DistributedDataParallelConfig(**ddp_kwargs), module=self.base
            )
            ocfg = OptimizerConfig(
                optimizer="adam",
                lr=float(optim.lr),
                weight_decay=float(getattr(optim, "weight_decay", 0.01)),
                adam_beta1=float(betas[0]),
                adam_beta2=float(betas[1]),
                adam_eps=1e-8,
                decoupled_weight_decay=name == "AdamW",
                clip_grad=float(self.settings.clip_grad),
                use_distributed_optimizer=bool(opts.use_distributed_optimizer),
                params_dtype=self.dtype,
                bf16=self.dtype is torch.bfloat16,
                fp16=self.dtype is torch.float16,
            )
            # config_overrides={}: weight decay on every parameter, as the reference engine's AdamW (Megatron's
            # default skips biases and norms).
            self.optimizer = get_megatron_optimizer(ocfg, [self.module], config_overrides={})

    def layout_key(self) -> dict[str, int]:
        """What a saved state depends on: sizes and this rank's place."""
        p = self.place
        return {
            "world": dist.get_world_size(),
            "tp": p.tp_size,
            "pp": p.pp_size,
            "dp": p.dp_size,
            "rank": dist.get_rank(),
        }

    # ------------------------------------------------------------------ training step

    def zero_grad(self) -> None:
        """Clear the DDP gradient buffers and the optimizer's gradients before a mini-batch."""
        self.module.zero_grad_buffer()
        self.optimizer.zero_grad()

    def optimizer_step(self, lr: float, *, skip_if_no_tokens: bool) -> float:
        """Set ``lr``, compute the global grad norm, step unless it is non-finite; returns the norm before clipping.

        With no response token on any rank the reference engine has no gradient at all: the step is skipped
        and 0.0 returned (an AdamW step on zero gradients would still decay the weights and move the moments).
        """
        with self.compat(optimizer=True):
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            if skip_if_no_tokens:
                self.optimizer.zero_grad()
                return 0.0
            self.optimizer.prepare_grads()
            norm = float(self.optimizer.get_grad_norm())
            if not torch.isfinite(torch.tensor(norm)):
                self.optimizer.zero_grad()
                return norm
            ok, stepped_norm, _ = self.optimizer.step()
            if not ok:
                return float("nan")
        return float(stepped_norm) if stepped_norm is not None else norm

    def _inner_optimizers(self) -> list[Any]:
        return list(getattr(self.optimizer, "chained_optimizers", None) or [self.optimizer])

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state: Megatron's ``state_dict()`` plus, for the distributed optimizer (whose
        ``state_dict()`` holds only the param groups), each instance's main params and moments
        (``get_parameter_state_dp_reshardable``: this rank's shard, live tensors)."""
        with self.compat(optimizer=True):
            out: dict[str, Any] = {"state_dict": self.optimizer.state_dict()}
            out["param_state"] = [
                o.get_parameter_state_dp_reshardable() if hasattr(o, "get_parameter_state_dp_reshardable") else None
                for o in self._inner_optimizers()
            ]
        # Adam's per-parameter step counts (bias correction): Megatron's state dicts fold them into one
        # "common step" and the distributed optimizer's parameter state leaves them out.
        out["steps"] = [_torch_steps(o) for o in self._inner_optimizers()]
        for param_state in out["param_state"]:
            # Megatron's loader expects each element to say whether it is bucket padding; the getter omits it.
            for key, by_dtype in (param_state or {}).items():
                if isinstance(key, int):
                    for buckets in by_dtype.values():
                        for bucket in buckets:
                            for elem in bucket:
                                elem.setdefault("padding", False)
        return out

    @torch.no_grad()
    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`optimizer_state` of the same rank and layout."""
        with self.compat(optimizer=True):
            self.optimizer.load_state_dict(state["state_dict"])
            for inner, param_state in zip(self._inner_optimizers(), state["param_state"], strict=True):
                if param_state is not None:
                    inner.load_parameter_state_from_dp_reshardable(param_state)
            for inner, steps in zip(self._inner_optimizers(), state.get("steps", []), strict=False):
                _set_torch_steps(inner, steps)

    def optimizer_reload(self) -> None:
        """After loading optimizer state: Megatron's fp32 main params back into the model (mixed precision)."""
        reload = getattr(self.optimizer, "reload_model_params", None)
        if reload is not None:
            with self.compat(optimizer=True):
                reload()

    # ------------------------------------------------------------------ offload

    def offload(self, *, keep_params: bool = False) -> dict[str, int]:
        """Move weights / gradient buffers / optimizer state to host memory (accelerators only)."""
        opts = self.options
        wanted = {
            "params": opts.param_offload and not keep_params,
            "grads": opts.grad_offload and self.trainable,
            "optimizer": opts.optimizer_offload and self.trainable,
        }
        if self.on_cpu:
            for what, on in wanted.items():
                if on:
                    notice_once(
                        f"off_{what}", "verl-megatron: %s offload has no effect on cpu (already in host memory)", what
                    )
            return {"params_bytes": 0, "grads_bytes": 0, "optimizer_bytes": 0}
        from verl_megatron import offload as off

        self._offloaded = wanted
        return off.offload(self, **wanted)

    def onload(self) -> dict[str, int]:
        """Bring back what :meth:`offload` moved."""
        if self.on_cpu or not getattr(self, "_offloaded", None):
            return {}
        from verl_megatron import offload as off

        wanted, self._offloaded = self._offloaded, None
        return off.onload(self, **wanted)
