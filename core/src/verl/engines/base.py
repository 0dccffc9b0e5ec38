"""The three engine protocols every backend implements (DESIGN §6).

Tensor layout (DESIGN §5, verl's numerical contract), for a batch of ``bs`` rows:

* ``prompts``: ``(bs, prompt_len)`` int64, left-padded with the pad id.
* ``responses``: ``(bs, resp_len)`` int64, right-padded with the pad id.
* ``input_ids = cat([prompts, responses], -1)``: ``(bs, prompt_len + resp_len)``.
* ``attention_mask``: same shape, 1 on real tokens (prompt and response, EOS included).
* ``position_ids = clip(cumsum(attention_mask, -1) - 1, min=0)``.
* ``response_mask``: ``(bs, resp_len)`` = ``attention_mask[:, prompt_len:]`` for plain
  generation (EOS included, padding excluded).
* log-probs / entropy / values: ``(bs, resp_len)`` float32, position ``t`` scores
  ``responses[:, t]`` (logits at input position ``prompt_len - 1 + t``).

Engines exchange :class:`verl.protocol.DataProto` objects with the controller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from verl.protocol import DataProto

# A loss function for TrainingEngine.train_batch: ``loss_fn(micro, outputs, norm)`` gets one
# micro-batch (DataProto), the model outputs for it (``log_probs``, ``entropys``) and the
# mini-batch normalisers (``verl.algorithms.compute_global_batch_info``), and returns
# (loss tensor to backprop, metrics). The engine sums the micro-batch losses (globally
# normalised, DESIGN §5) and sums the metrics, which are additive contributions.
LossFn = Callable[["DataProto", dict[str, "torch.Tensor"], dict[str, Any]], tuple["torch.Tensor", dict[str, float]]]


@runtime_checkable
class TrainingEngine(Protocol):
    """Owns a model (+ optimizer and LR schedule when trainable) on one data-parallel rank.

    Optional: ``weight_manifest(layout=None) -> [(hf_name, shape)]``, what :meth:`iter_weights` (with
    ``layout``) yields on this rank, without moving data; the weight sync lets the rollout check an update
    against it before anything is written.

    Optional: ``nonfinite_state() -> (parameter names, optimizer-state names)``, the tensors of this rank holding
    NaN/inf, for an engine whose module or optimizer is not at ``.model`` / ``.optimizer`` as a
    ``torch.optim.Optimizer`` (:func:`verl.engines.safe_files.engine_nonfinite_state` asks it first; the workers
    report it with every checkpoint and refuse a loaded checkpoint that has any).
    """

    def compute_log_prob(self, data: DataProto, *, calculate_entropy: bool = False) -> DataProto:
        """Return ``old_log_probs`` (and ``entropys``) ``(bs, resp_len)`` float32 for ``data``.

        Logits are divided by ``data.meta_info["temperature"]`` before the log-softmax.
        """
        ...

    def train_batch(self, data: DataProto, loss_fn: LossFn) -> dict[str, Any]:
        """Run mini-batches x micro-batches x epochs of updates on ``data``; return metrics."""
        ...

    def iter_weights(
        self, layout: Any = None, *, bucket_bytes: int | None = None, stats: Any = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(hf_parameter_name, tensor)`` pairs for weight sync to a rollout engine.

        Without ``layout``: full tensors. With the rollout's
        :class:`~verl.engines.weight_sync.layout.WeightLayout` (hybrid mode, collective over the world): this
        rank's slice of each weight, streamed in buckets of ``bucket_bytes``
        (:func:`verl.engines.weight_sync.reshard.reshard_weights`), counting into ``stats``.
        """
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: model, optimizer, LR scheduler, step counters."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        ...

    def save_hf(self, path: Any, tokenizer: Any = None) -> None:
        """Write the full (unsharded) weights and ``tokenizer`` as a HF folder for ``from_pretrained``."""
        ...

    def offload(self) -> Any:
        """Move to host memory what the engine's options say (``param_offload``: weights,
        ``optimizer_offload``: optimizer state) while the rollout generates; no-op where meaningless (CPU).
        Every method that needs the weights onloads them first."""
        ...

    def onload(self) -> Any:
        """Undo :meth:`offload` (no-op when nothing is offloaded)."""
        ...


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates responses for a batch of left-padded prompts.

    Optional (used by the hybrid engine's weight sync when present):

    * ``weight_layout()``: the :class:`~verl.engines.weight_sync.layout.WeightLayout` its weights follow
      across the world (which slice each rank holds), or None (one process holds everything);
    * ``check_weights(specs)``: refuse an update of these ``(hf_name, shape)`` pairs before anything is
      written (KeyError / ValueError naming the weight); the sync calls it on every rank first.
    """

    def generate(self, prompts: DataProto) -> DataProto:
        """Generate for every row of ``prompts`` (already repeated ``n`` times by the trainer).

        Input batch keys: ``input_ids``, ``attention_mask``, ``position_ids`` ``(bs, prompt_len)``.
        ``meta_info`` may override sampling (``do_sample``, ``temperature``, ``top_p``, ``top_k``,
        ``validate``). Output batch keys: ``prompts, responses, response_mask, input_ids,
        attention_mask, position_ids`` (+ ``rollout_log_probs`` when configured).
        """
        ...

    def update_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Load ``(hf_name, tensor)`` pairs into the live model; later generations use them.

        Each tensor is the full weight or exactly the slice :meth:`weight_layout` says this rank holds;
        consumers copy each tensor before asking for the next (the sender may free or reuse it).
        """
        ...

    def sleep(self) -> None:
        """Release memory between generations (hybrid mode): KV cache, and weights the engine owns, as its
        options say (sleep level); no-op where meaningless (e.g. a CPU engine sharing the trainer's module)."""
        ...

    def wake_up(self, tags: Any = None) -> None:
        """Undo :meth:`sleep` for ``tags``: ``["weights"]`` before the weight sync, ``["kv_cache"]`` after it
        (verl's order); None = both. After a sleep that discarded the weights, a sync must fill them."""
        ...


@runtime_checkable
class CheckpointEngine(Protocol):
    """Moves trainer weights into a rollout engine (weight sync, not disk checkpoints)."""

    def sync(self, trainer: TrainingEngine, rollout: RolloutEngine) -> dict[str, Any]:
        """Push the trainer's current weights into the rollout engine; return metrics
        (e.g. ``bytes``, ``tensors``, seconds)."""
        ...


def wake_up_tagged(engine: Any, tags: list[str]) -> None:
    """``engine.wake_up(tags=tags)``; an engine written before tags existed (``wake_up()`` without arguments)
    wakes fully when the weights are asked for, and its ``kv_cache`` wake-up is a no-op."""
    import inspect

    try:
        takes_tags = "tags" in inspect.signature(engine.wake_up).parameters
    except (TypeError, ValueError):  # a builtin or C method: no signature to inspect
        takes_tags = False
    if takes_tags:
        engine.wake_up(tags=list(tags))
    elif "weights" in tags:
        engine.wake_up()
