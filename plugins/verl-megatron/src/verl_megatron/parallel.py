"""Megatron's parallel state: the process layout (TP x CP x EP x DP x PP) checked, set up once per process.

The actor and the reference policy of one worker share it, as in verl
(``verl/workers/engine/megatron/transformer_impl.py``: ``initialize_model_parallel`` is skipped when already
initialised); a second engine asking for another layout is an error naming the keys.
"""

from __future__ import annotations

from typing import Any

import attrs

KEY = "actor_rollout_ref.actor.engine_kwargs.megatron"


@attrs.frozen(kw_only=True)
class ParallelLayout:
    """Sizes of one Megatron layout over ``world_size`` ranks; ``dp`` is what is left.

    Attributes:
        tp, pp, cp, ep: tensor / pipeline / context / expert model-parallel sizes.
        vpp: virtual pipeline stages per rank (None = no interleaving).
        etp: expert tensor-parallel size (None = tp).
        world_size: ranks of the default process group.
    """

    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    world_size: int = 1

    @property
    def dp(self) -> int:
        """Data-parallel size: ``world_size // (tp * pp * cp)``."""
        return self.world_size // (self.tp * self.pp * self.cp)

    @classmethod
    def from_options(cls, options: Any, world_size: int) -> ParallelLayout:
        """The layout of :class:`~verl_megatron.options.MegatronEngineOptions` over ``world_size`` ranks."""
        sizes = options.parallel_sizes()
        return cls(
            tp=int(sizes["tp"]),
            pp=int(sizes["pp"]),
            vpp=sizes["vpp"],
            cp=int(sizes["cp"]),
            ep=int(sizes["ep"]),
            etp=sizes["etp"],
            world_size=int(world_size),
        )


def layout_problems(layout: ParallelLayout, shape: Any, *, device_type: str, sequence_parallel: bool) -> list[str]:
    """Why ``layout`` cannot train the model ``shape`` (a :class:`~verl_megatron.model_config.ModelShape`) here.

    Returns one message per problem, each naming its ``engine_kwargs.megatron`` key and the valid choices;
    empty when the layout works.
    """
    out: list[str] = []
    model_parallel = layout.tp * layout.pp * layout.cp
    if layout.world_size % model_parallel:
        out.append(
            f"{KEY}.tensor_model_parallel_size={layout.tp} x pipeline_model_parallel_size={layout.pp} x "
            f"context_parallel_size={layout.cp} = {model_parallel} must divide the {layout.world_size} training ranks "
            "(trainer.nnodes x trainer.n_gpus_per_node); the rest is data parallelism"
        )
    for name, count in (
        ("num_attention_heads", shape.num_attention_heads),
        ("num_key_value_heads", shape.num_query_groups),
        ("intermediate_size", shape.ffn_hidden_size),
    ):
        if count % layout.tp:
            out.append(
                f"{KEY}.tensor_model_parallel_size={layout.tp} must divide the model's {name} ({count}): "
                f"choose one of {[d for d in range(1, count + 1) if count % d == 0 and d <= layout.world_size]}"
            )
    stages = layout.pp * (layout.vpp or 1)
    if shape.num_layers % stages:
        out.append(
            f"{KEY}.pipeline_model_parallel_size={layout.pp} x virtual_pipeline_model_parallel_size="
            f"{layout.vpp} = {stages} stages must divide the model's {shape.num_layers} layers"
        )
    if layout.vpp is not None and layout.pp == 1:
        out.append(
            f"{KEY}.virtual_pipeline_model_parallel_size={layout.vpp} needs pipeline_model_parallel_size > 1 "
            "(interleaved stages of one pipeline); set it to null"
        )
    if layout.ep != 1 or layout.etp not in (None, layout.tp):
        out.append(
            f"{KEY}.expert_model_parallel_size={layout.ep}, expert_tensor_parallel_size={layout.etp}: "
            f"{shape.architecture} is a dense model (no experts); leave them at 1 and null"
        )
    if device_type == "cpu":
        if sequence_parallel:
            out.append(
                f"{KEY}.sequence_parallel=true: on the cpu device Megatron's local layer spec has no "
                "sequence-parallel norms (they need Transformer Engine or Apex); set it to false"
            )
        if layout.cp > 1:
            out.append(
                f"{KEY}.context_parallel_size={layout.cp}: context parallelism needs Transformer Engine's "
                "attention (a CUDA device); set it to 1 on cpu"
            )
    return out


def initialize(layout: ParallelLayout) -> None:
    """``parallel_state.initialize_model_parallel`` for ``layout`` once per process (collective on first call).

    Raises:
        ValueError: Megatron is already initialised with other sizes (actor and ref must share one layout).
    """
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        have = (
            ps.get_tensor_model_parallel_world_size(),
            ps.get_pipeline_model_parallel_world_size(),
            ps.get_context_parallel_world_size(),
        )
        want = (layout.tp, layout.pp, layout.cp)
        if have != want:
            raise ValueError(
                f"Megatron's parallel state of this process is already (tp, pp, cp) = {have}, another engine asks "
                f"for {want}: the actor, reference policy and critic of one worker share one layout; set the same "
                f"{KEY}.* sizes for every role"
            )
        return
    ps.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp,
    )


@attrs.frozen
class Place:
    """This rank's coordinates in the initialised layout."""

    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    dp_rank: int
    dp_size: int
    cp_rank: int

    @property
    def is_collect(self) -> bool:
        """Whether this rank returns its data-parallel chunk's results (TP rank 0, CP rank 0, last PP stage)."""
        return self.tp_rank == 0 and self.cp_rank == 0 and self.pp_rank == self.pp_size - 1


def place() -> Place:
    """:class:`Place` of this rank (parallel state must be initialised)."""
    from megatron.core import parallel_state as ps

    return Place(
        tp_rank=ps.get_tensor_model_parallel_rank(),
        tp_size=ps.get_tensor_model_parallel_world_size(),
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        pp_size=ps.get_pipeline_model_parallel_world_size(),
        dp_rank=ps.get_data_parallel_rank(),
        dp_size=ps.get_data_parallel_world_size(),
        cp_rank=ps.get_context_parallel_rank(),
    )


def ensure_process_group(backend: str) -> None:
    """Join the default process group (:func:`verl.platform.network.join_default_group`): from
    ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` when set (torchrun, the Ray worker group), rank 0's
    store listening on that address only, else a 1-rank group on loopback (one plain process).

    Raises:
        RuntimeError: only some of the rendezvous variables are set.
    """
    from verl.platform.network import join_default_group

    join_default_group(backend, owner="verl-megatron")
