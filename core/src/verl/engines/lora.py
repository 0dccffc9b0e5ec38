"""LoRA adapters through ``peft`` for the training engines (``actor_rollout_ref.model.lora_rank > 0``).

What verl does (``verl/workers/fsdp_workers.py``, ``verl/utils/fsdp_utils.py``), and what is built here:

* the actor's HF module gets peft LoRA layers in place (:func:`apply_lora`, ``get_peft_model`` with
  ``r=lora_rank``, ``lora_alpha``, ``target_modules``, ``exclude_modules``, ``bias="none"``, no dropout),
  or the adapter of ``lora_adapter_path`` (``PeftModel.from_pretrained(..., is_trainable=True)``); the base
  weights are frozen, so only adapter parameters reach the optimizer, the grad norm and the checkpoint;
* peft initialises ``B = 0``, so before the first update the adapted model computes exactly the base model;
* the reference policy is the same module under peft's ``disable_adapter()`` (:class:`AdapterDisabledReference`):
  no second model in memory;
* the rollout receives merged weights under the base model's names, ``W + (lora_alpha / r) * B @ A``
  (:func:`merged_weights`), computed from the live tensors without touching the training module;
* the adapter is written as a peft folder (``adapter_config.json`` + ``adapter_model.safetensors``,
  :func:`save_adapter`) that ``PeftModel.from_pretrained`` loads.

Shapes: for a target ``nn.Linear`` with weight ``W (out, in)``, ``A = lora_A.weight (r, in)``,
``B = lora_B.weight (out, r)``; the merged weight has ``W``'s shape and dtype (the product runs in float32).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
import torch

logger = logging.getLogger(__name__)

ADAPTER_NAME = "default"
ADAPTER_DIR = "lora_adapter"
_BASE = ".base_layer."
_LORA_KEYS = (".lora_A.", ".lora_B.")


def _names(value: Any) -> Any:
    return tuple(value) if isinstance(value, list | tuple) else value


@attrs.frozen(kw_only=True)
class LoraSettings:
    """The actor's LoRA keys (``actor_rollout_ref.model.*``).

    Attributes:
        rank: ``lora_rank`` r (> 0).
        alpha: ``lora_alpha``; the update is scaled by ``alpha / rank``.
        target_modules: ``"all-linear"`` (peft: every linear layer except the output head), one regex, or names.
        exclude_modules: names or one regex never adapted; None = none.
        adapter_path: ``lora_adapter_path``: a peft adapter folder to continue from (its own r/alpha/targets).
        base_model: name or path of the base model, written as the adapter's ``base_model_name_or_path``.
    """

    rank: int
    alpha: float = 16
    target_modules: Any = attrs.field(default="all-linear", converter=_names)
    exclude_modules: Any = attrs.field(default=None, converter=_names)
    adapter_path: str | None = None
    base_model: str | None = None


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """Sorted distinct last name parts of ``model``'s ``nn.Linear`` modules (``q_proj``, ``lm_head``, ...)."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def apply_lora(model: torch.nn.Module, settings: LoraSettings) -> Any:
    """Give ``model`` peft LoRA layers in place (its base weights frozen); return the ``PeftModel`` wrapper.

    ``model`` itself stays the module to run (its class, config and forward signature unchanged); the wrapper
    is kept for ``disable_adapter()`` and the adapter's config.

    Raises:
        ValueError: ``target_modules`` / ``exclude_modules`` leave nothing to adapt (the message lists the model's
            linear module names); ``adapter_path`` has no ``adapter_config.json``, is not a LoRA adapter, or
            does not fit the model (its ``base_model_name_or_path`` and the model's path are both named).
    """
    from peft import LoraConfig, PeftModel, get_peft_model

    if settings.adapter_path is not None:
        return _load_adapter(model, settings)
    config = LoraConfig(
        r=int(settings.rank),
        lora_alpha=settings.alpha,
        target_modules=_as_peft(settings.target_modules),
        exclude_modules=_as_peft(settings.exclude_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as exc:
        if "not found" not in str(exc) and "No modules were targeted" not in str(exc):
            raise
        raise ValueError(
            f"actor_rollout_ref.model.target_modules={settings.target_modules!r} (exclude_modules="
            f"{settings.exclude_modules!r}) matches no module of {type(model).__name__}; its linear modules are "
            f"{linear_module_names(model)} (or use 'all-linear')"
        ) from exc
    if settings.base_model is not None:
        peft_model.peft_config[ADAPTER_NAME].base_model_name_or_path = str(settings.base_model)
    assert isinstance(peft_model, PeftModel)
    return peft_model


def _as_peft(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _load_adapter(model: torch.nn.Module, settings: LoraSettings) -> Any:
    from peft import PeftModel

    folder = Path(str(settings.adapter_path)).expanduser()
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise ValueError(
            f"actor_rollout_ref.model.lora_adapter_path={str(folder)!r} has no adapter_config.json (not a peft "
            "adapter folder)"
        )
    saved = json.loads(config_file.read_text())
    if saved.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"lora_adapter_path {folder}: peft_type={saved.get('peft_type')!r}, only LORA is built")
    adapter_base = saved.get("base_model_name_or_path")
    ours = settings.base_model or getattr(getattr(model, "config", None), "name_or_path", None)
    try:
        peft_model = PeftModel.from_pretrained(model, str(folder), is_trainable=True)
    except (RuntimeError, ValueError, KeyError) as exc:
        raise ValueError(
            f"the LoRA adapter {folder} (trained on base model {adapter_base!r}) does not fit the model "
            f"actor_rollout_ref.model.path={ours!r}: {str(exc).splitlines()[0][:300]}"
        ) from exc
    if settings.base_model is not None:  # the adapter written from here on belongs to this base
        peft_model.peft_config[ADAPTER_NAME].base_model_name_or_path = str(settings.base_model)
    if adapter_base and ours and Path(str(adapter_base)).name.lower() != Path(str(ours)).name.lower():
        # Same shapes, different names: a local copy of the same model often has another path, so only warn.
        logger.warning(
            "LoRA adapter %s was trained on %r; loading it on %r (the shapes fit)", folder, adapter_base, ours
        )
    return peft_model


def lora_modules(model: torch.nn.Module) -> dict[str, Any]:
    """``{module name: peft LoraLayer}`` of ``model`` (names as in ``model.state_dict()``)."""
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def is_adapter_key(name: str) -> bool:
    """Whether a state-dict key of an adapted module is an adapter weight (``...lora_A.default.weight``)."""
    return any(part in name for part in _LORA_KEYS)


def merged_weights(
    items: Iterable[tuple[str, torch.Tensor]],
    modules: dict[str, Any],
    full: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's state dict with every adapted weight merged: ``W + (alpha / r) * B @ A``.

    Args:
        items: ``(name, tensor)`` of the adapted module's state dict, in order (tensors may be DTensor shards).
        modules: :func:`lora_modules` of that module.
        full: turns a (sharded) tensor into the whole tensor; called for ``A`` of each adapted layer (and ``W``,
            ``B`` unless they are row-sharded alike) in state-dict order (collective under FSDP: every rank calls it
            in the same order).

    Yields:
        ``(base name, tensor)``: adapter keys dropped, ``<layer>.base_layer.<p>`` renamed ``<layer>.<p>``; merged
        weights are new tensors in ``W``'s dtype and device (for FSDP's row-sharded ``W`` and ``B``: a DTensor
        with ``W``'s sharding, each rank merging its own rows), the others are passed through unchanged.

    Raises:
        ValueError: an adapted layer whose weight is not a plain linear one (fan_in_fan_out / DoRA).
    """
    state = dict(items)
    for name, tensor in state.items():
        if is_adapter_key(name):
            continue
        if _BASE not in name:
            yield name, tensor
            continue
        prefix, param = name.split(_BASE, 1)
        base_name = f"{prefix}.{param}"
        layer = modules.get(prefix)
        if param != "weight" or layer is None or ADAPTER_NAME not in layer.lora_A:
            yield base_name, tensor
            continue
        if getattr(layer, "fan_in_fan_out", False) or layer.use_dora.get(ADAPTER_NAME, False):
            raise ValueError(f"LoRA layer {prefix}: only plain linear adapters are merged (no fan_in_fan_out / DoRA)")
        scale = float(layer.scaling[ADAPTER_NAME])
        a = full(state[f"{prefix}.lora_A.{ADAPTER_NAME}.weight"])
        b = state[f"{prefix}.lora_B.{ADAPTER_NAME}.weight"]
        with torch.no_grad():
            if _same_rows(tensor, b):
                # Row-sharded W and B (FSDP's Shard(0) of two tensors with the same row count): each rank merges
                # its own rows, W_rows + scale * B_rows @ A, and the result keeps W's sharding (no whole W).
                from torch.distributed.tensor import DTensor

                w_local, b_local = tensor.to_local(), b.to_local()
                merged = w_local.float() + (b_local.float() @ a.float().to(b_local.device)) * scale
                yield (
                    base_name,
                    DTensor.from_local(
                        merged.to(w_local.dtype),
                        tensor.device_mesh,
                        tensor.placements,
                        run_check=False,
                        shape=tensor.shape,
                        stride=tensor.stride(),
                    ),
                )
                continue
            b, w = full(b), full(tensor)
            delta = (b.float() @ a.float()) * scale
            yield base_name, (w.detach().float() + delta.to(w.device)).to(w.dtype)


def _same_rows(w: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``w`` and ``b`` are DTensors split the same way along rows only (so their local rows match)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not (isinstance(w, DTensor) and isinstance(b, DTensor)):
        return False
    rows_only = all(isinstance(p, Replicate) or p == Shard(0) for p in w.placements)
    return (
        rows_only
        and tuple(w.placements) == tuple(b.placements)
        and w.device_mesh == b.device_mesh
        and w.shape[0] == b.shape[0]
        and w.to_local().shape[0] == b.to_local().shape[0]
        and w.to_local().device == b.to_local().device
    )


def base_name(name: str) -> str:
    """The base model's name of a state-dict key of an adapted module (``q_proj.base_layer.weight`` ->
    ``q_proj.weight``); other names unchanged."""
    return name.replace(_BASE, ".", 1) if _BASE in name else name


def adapter_state(items: Iterable[tuple[str, torch.Tensor]], peft_model: Any) -> dict[str, torch.Tensor]:
    """The adapter in peft's file format (``base_model.model.<...>.lora_A.weight``) from the module's state dict."""
    from peft import get_peft_model_state_dict

    prefixed = {f"base_model.model.{k}": v for k, v in items if is_adapter_key(k)}
    return get_peft_model_state_dict(peft_model, state_dict=prefixed, adapter_name=ADAPTER_NAME)


def save_adapter(folder: str | Path, state: dict[str, torch.Tensor], peft_model: Any) -> Path:
    """Write ``state`` (:func:`adapter_state`, whole CPU tensors) and the adapter config as a peft folder.

    Returns the folder: ``adapter_config.json`` + ``adapter_model.safetensors``, loadable with
    ``PeftModel.from_pretrained(base_model, folder)``.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    peft_model.peft_config[ADAPTER_NAME].save_pretrained(str(folder))
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(folder / "adapter_model.safetensors"))
    return folder


def write_merged_hf(config: Any, weights: Iterable[tuple[str, torch.Tensor]], folder: str | Path) -> Path:
    """Write merged base-model weights (``(name, whole tensor)``) with HF ``config`` as a plain HF folder.

    The skeleton is built on the meta device and the tensors assigned into it (no second copy); tied weights
    are re-tied. Raises ValueError when a parameter is missing or a name is unknown.
    """
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    state = {k: v.detach().cpu() for k, v in weights}
    result = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"merged LoRA weights do not fit {type(model).__name__}: missing {missing[:5]}, "
            f"unexpected {list(result.unexpected_keys)[:5]}"
        )
    model.config.use_cache = True
    model.save_pretrained(str(folder))
    return Path(folder)


def merge_adapter_folder(base_model: str | Path, adapter: str | Path, out: str | Path) -> Path:
    """Load ``base_model`` (a HF folder), apply the peft ``adapter`` folder, merge it and save a plain HF folder.

    Used by ``verl export`` for LoRA checkpoints. Raises ValueError when the adapter does not fit the base.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(base_model), dtype=torch.float32)
    try:
        merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    except (RuntimeError, ValueError, KeyError) as exc:
        raise ValueError(f"LoRA adapter {adapter} does not fit base model {base_model}: {exc}") from exc
    merged.config.use_cache = True
    merged.save_pretrained(str(out))
    return Path(out)


class AdapterDisabledReference:
    """The reference policy of a LoRA run: the actor's own module with its adapters switched off.

    verl (``fsdp_workers.py:compute_ref_log_prob``) runs the actor under peft's ``disable_adapter()`` instead of
    loading a second model: base weights are frozen, so this is exactly the initial policy (the base model, also
    when training continued from ``lora_adapter_path``). Collective when the actor engine is.

    Args:
        actor: a training engine with LoRA on (``actor.peft_model`` set).
    """

    def __init__(self, actor: Any) -> None:
        if getattr(actor, "peft_model", None) is None:
            raise ValueError("AdapterDisabledReference needs an actor engine with LoRA on (model.lora_rank > 0)")
        self.actor = actor

    def compute_log_prob(self, data: Any, *, calculate_entropy: bool = False) -> Any:
        """``old_log_probs`` ``(bs, resp_len)`` float32 of the base model (adapters disabled), as the actor's."""
        with self.actor.peft_model.disable_adapter():
            return self.actor.compute_log_prob(data, calculate_entropy=calculate_entropy)


def adapter_param_count(model: torch.nn.Module, settings: LoraSettings) -> dict[str, int]:
    """Parameter counts of a LoRA run on ``model`` (built on the meta device is enough): for docs/lora.md.

    Returns ``{"base": all base parameters, "adapter": trainable adapter parameters}``; tied weights counted once.
    """
    base = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    peft_model = apply_lora(model, attrs.evolve(settings, adapter_path=None))
    adapter = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    return {"base": int(base), "adapter": int(adapter)}
