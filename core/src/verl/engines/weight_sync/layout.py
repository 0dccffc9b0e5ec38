"""The rollout's weight layout: which slice of each HF weight every rank of the rollout holds.

A tensor-parallel rollout splits the world of ``W`` ranks into ``W / T`` groups of ``T`` consecutive ranks
(``trainer world = DP_rollout x TP_rollout``, verl's ``rollout.tensor_model_parallel_size``): rank ``r`` is TP
rank ``r % T`` of replica ``r // T``. Inside a group, each linear layer is split Megatron-style:

* column-parallel (``colwise``: q/k/v/gate/up projections, the LM head): weight rows (dim 0) and bias split;
* row-parallel (``rowwise``: o/down projections): weight columns (dim 1) split, bias replicated;
* vocab-parallel embedding: embedding rows (dim 0, the vocabulary) split;
* everything else (norms, q/k-norms, biases of row-parallel layers) replicated.

Which layer is which comes from transformers' own tensor-parallel plan of the model
(``config.base_model_tp_plan``, the plan ``from_pretrained(tp_plan="auto")`` uses), plus the vocab-parallel
embedding and the column-parallel LM head. A :class:`WeightLayout` answers, for any rank and any weight,
which slice it holds, so the trainer can send every rank exactly its slices
(:mod:`verl.engines.weight_sync.reshard`) without gathering whole tensors.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

TP_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"

# transformers' plan style names -> ours. Styles not listed (packed/local/sequence-parallel/MoE kernels) are
# refused: their weights are not plain row or column splits.
_HF_STYLES = {
    "colwise": "colwise",
    "colwise_gather_output": "colwise",
    "colwise_rep": "colwise",
    "rowwise": "rowwise",
    "rowwise_rep": "rowwise",
    "replicated_with_grad_allreduce": "replicate",
    "replicate": "replicate",
}
STYLES = ("colwise", "rowwise", "vocab", "replicate")


class UnsupportedLayoutError(ValueError):
    """The model has no tensor-parallel plan this layout can express (or a style it does not know)."""


@attrs.frozen
class ShardSlice:
    """The part of a full tensor one rank holds: ``full.narrow(dim, start, stop - start)``."""

    dim: int
    start: int
    stop: int

    @property
    def length(self) -> int:
        """Rows (or columns) in the slice along ``dim``."""
        return self.stop - self.start

    def shape_of(self, full_shape: Sequence[int]) -> tuple[int, ...]:
        """Shape of this slice of a tensor of ``full_shape``."""
        shape = list(full_shape)
        shape[self.dim] = self.length
        return tuple(shape)


@runtime_checkable
class WeightLayout(Protocol):
    """Where every weight lives across the ranks of a rollout (answers for any rank, not only this one)."""

    world_size: int

    def slice_for(self, name: str, shape: Sequence[int], rank: int) -> ShardSlice | None:
        """The slice of weight ``name`` (full shape ``shape``) rank ``rank`` holds; None = the whole tensor."""
        ...

    def describe(self) -> str:
        """A stable one-line description; ranks compare digests of it before a sync."""
        ...


def local_shape(layout: WeightLayout | None, name: str, shape: Sequence[int], rank: int) -> tuple[int, ...]:
    """Shape of what ``rank`` holds of weight ``name``: its slice's shape, or ``shape`` (no layout / replicated)."""
    piece = None if layout is None else layout.slice_for(name, shape, rank)
    return tuple(shape) if piece is None else piece.shape_of(shape)


def layout_digest(layout: WeightLayout | None, names_and_shapes: Sequence[tuple[str, Sequence[int]]]) -> str:
    """A short digest of a layout over a list of weights (every rank must compute the same one)."""
    h = hashlib.sha1((layout.describe() if layout is not None else "full").encode())
    for name, shape in names_and_shapes:
        h.update(f"{name}:{tuple(shape)};".encode())
    return h.hexdigest()[:16]


def _pattern(module_pattern: str) -> re.Pattern[str]:
    # "model.layers.*.self_attn.q_proj" matches "model.layers.3.self_attn.q_proj" (one path component per *).
    return re.compile("^" + re.escape(module_pattern).replace(r"\*", r"[^.]+") + "$")


class TensorParallelLayout:
    """Tensor-parallel groups of ``tp_size`` consecutive ranks over ``world_size`` ranks, split per module style.

    Args:
        world_size: ranks of the rollout world (``DP_rollout x tp_size``).
        tp_size: ranks per rollout replica (``rollout.tensor_model_parallel_size``).
        module_styles: ``{module path pattern: style}``, style one of :data:`STYLES`; ``*`` matches one path
            component (``model.layers.*.mlp.up_proj``). A weight ``<module>.weight`` / ``<module>.bias``
            follows its module's style; unmatched weights are replicated.

    Raises:
        ValueError: ``tp_size`` not >= 1 or not dividing ``world_size``; an unknown style.
    """

    def __init__(self, world_size: int, tp_size: int, module_styles: Mapping[str, str]) -> None:
        if tp_size < 1 or world_size < 1 or world_size % tp_size:
            raise ValueError(
                f"{TP_KEY}={tp_size} must be >= 1 and divide the rollout world size {world_size} "
                f"(world = data-parallel replicas x tensor-parallel size); valid: {divisors(world_size)}"
            )
        bad = {p: s for p, s in module_styles.items() if s not in STYLES}
        if bad:
            raise ValueError(f"tensor-parallel styles must be one of {STYLES}, got {bad}")
        self.world_size = int(world_size)
        self.tp_size = int(tp_size)
        self.module_styles = dict(module_styles)
        self._rules = [(_pattern(p), s) for p, s in self.module_styles.items()]
        self._cache: dict[str, tuple[str, int | None]] = {}

    # ------------------------------------------------------------------ ranks
    @property
    def dp_size(self) -> int:
        """Number of rollout replicas (data-parallel groups)."""
        return self.world_size // self.tp_size

    def tp_rank(self, rank: int) -> int:
        """``rank``'s position inside its tensor-parallel group, ``0 .. tp_size - 1``."""
        return rank % self.tp_size

    def dp_rank(self, rank: int) -> int:
        """Which rollout replica ``rank`` belongs to, ``0 .. dp_size - 1``."""
        return rank // self.tp_size

    def group(self, rank: int) -> list[int]:
        """The global ranks of ``rank``'s tensor-parallel group."""
        first = self.dp_rank(rank) * self.tp_size
        return list(range(first, first + self.tp_size))

    # ------------------------------------------------------------------ weights
    def style_of(self, name: str) -> tuple[str, int | None]:
        """``(style, split dim)`` of weight ``name``; dim None = replicated."""
        cached = self._cache.get(name)
        if cached is not None:
            return cached
        module, _, leaf = name.rpartition(".")
        style = next((s for rule, s in self._rules if rule.match(module)), "replicate")
        dim: int | None
        if style in ("colwise", "vocab"):
            dim = 0 if leaf in ("weight", "bias") else None
        elif style == "rowwise":
            dim = 1 if leaf == "weight" else None
        else:
            dim = None
        self._cache[name] = (style, dim)
        return style, dim

    def slice_for(self, name: str, shape: Sequence[int], rank: int) -> ShardSlice | None:
        """The slice of ``name`` rank ``rank`` holds; None when it holds the whole tensor.

        Raises:
            ValueError: the split dimension is not divisible by ``tp_size`` (names the weight and sizes).
        """
        style, dim = self.style_of(name)
        if dim is None or self.tp_size == 1 or dim >= len(shape):
            return None
        size = int(shape[dim])
        if size % self.tp_size:
            raise ValueError(
                f"{TP_KEY}={self.tp_size}: {name!r} ({style}, dim {dim} of shape {tuple(shape)}) has {size} "
                f"rows/columns, not divisible by {self.tp_size}"
            )
        part = size // self.tp_size
        start = self.tp_rank(rank) * part
        return ShardSlice(dim, start, start + part)

    def describe(self) -> str:
        """``tp<T>/world<W>[pattern=style,...]``: equal on every rank that built the same layout."""
        styles = ",".join(f"{p}={s}" for p, s in sorted(self.module_styles.items()))
        return f"tp{self.tp_size}/world{self.world_size}[{styles}]"

    def __repr__(self) -> str:
        return f"TensorParallelLayout(world_size={self.world_size}, tp_size={self.tp_size})"

    @classmethod
    def for_model(cls, hf_config: Any, world_size: int, tp_size: int) -> TensorParallelLayout:
        """The layout of a HF causal LM from transformers' plan (``base_model_tp_plan``) + embedding and head.

        Raises:
            UnsupportedLayoutError: ``tp_size > 1`` and the model type has no plan, or a style this layout
                cannot express (packed, local, MoE kernels).
            ValueError: as the constructor.
        """
        return cls(world_size, tp_size, model_module_styles(hf_config) if tp_size > 1 else {})


def model_module_styles(hf_config: Any) -> dict[str, str]:
    """``{module pattern: style}`` of a HF causal LM (decoder under ``model.``, ``lm_head`` on top).

    Raises:
        UnsupportedLayoutError: no ``base_model_tp_plan`` for this model type, or an unsupported style.
    """
    plan = dict(getattr(hf_config, "base_model_tp_plan", None) or {})
    model_type = getattr(hf_config, "model_type", type(hf_config).__name__)
    if not plan:
        raise UnsupportedLayoutError(
            f"{TP_KEY} > 1: transformers has no tensor-parallel plan for model type {model_type!r} "
            "(config.base_model_tp_plan is empty); use tensor_model_parallel_size=1 or another rollout engine"
        )
    styles: dict[str, str] = {"model.embed_tokens": "vocab", "lm_head": "colwise"}
    for pattern, hf_style in plan.items():
        ours = _HF_STYLES.get(str(hf_style))
        if ours is None:
            raise UnsupportedLayoutError(
                f"{TP_KEY} > 1: {model_type!r} uses tensor-parallel style {hf_style!r} for {pattern!r}, which the "
                f"hf rollout does not support (supported: {sorted(_HF_STYLES)}); use tensor_model_parallel_size=1"
            )
        styles[f"model.{pattern}"] = ours
    return styles


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order."""
    return [d for d in range(1, n + 1) if n % d == 0]


def tensor_parallel_problems(hf_config: Any, tp_size: int, world_size: int, *, engine: str = "hf") -> list[str]:
    """Why ``tp_size`` cannot split this model over this world (empty when it can).

    Checked for every engine: ``tp_size`` divides the rollout world size, the attention heads and the MLP
    width. The ``hf`` engine (DTensor, transformers' plan) also needs the key/value heads, the vocabulary and a
    tensor-parallel plan to split evenly; other engines (vLLM, SGLang) replicate key/value heads when the TP
    size is a multiple of their count and pad the vocabulary themselves. Each message names :data:`TP_KEY`,
    the sizes and the valid choices.

    Args:
        hf_config: the model's ``PretrainedConfig``.
        tp_size: ``rollout.tensor_model_parallel_size``.
        world_size: ranks of the rollout world.
        engine: the rollout engine's name (``rollout.name``).
    """
    if tp_size == 1:
        return []
    strict = engine == "hf"
    heads = getattr(hf_config, "num_attention_heads", None)
    sizes = {
        "rollout world size": world_size,
        "num_attention_heads": heads,
        "intermediate_size": getattr(hf_config, "intermediate_size", None),
    }
    if strict:
        sizes["num_key_value_heads"] = getattr(hf_config, "num_key_value_heads", None) or heads
        sizes["vocab_size"] = getattr(hf_config, "vocab_size", None)
    known = {k: int(v) for k, v in sizes.items() if isinstance(v, int) and v > 0}
    valid = divisors(math.gcd(*known.values()) if known else 1)
    problems = [
        f"{TP_KEY}={tp_size} does not divide {what} ({value}); valid sizes for this model and world: {valid}"
        for what, value in known.items()
        if value % tp_size
    ]
    kv = getattr(hf_config, "num_key_value_heads", None) or heads
    if not strict and isinstance(kv, int) and kv > 0 and kv % tp_size and tp_size % kv:
        problems.append(
            f"{TP_KEY}={tp_size}: num_key_value_heads ({kv}) must be divisible by it or divide it "
            f"(rollout engine {engine!r} replicates key/value heads only then)"
        )
    if strict:
        try:
            model_module_styles(hf_config)
        except UnsupportedLayoutError as exc:
            problems.append(str(exc))
    return problems
