"""LoRA keys (``actor_rollout_ref.model.lora_*``, verl's fsdp LoRA; docs/lora.md), run by ``validate_config``.

Whether the training engine can train adapters is its ``lora`` capability, checked with the engine spec in
:mod:`verl.config.backend_options`. Here: ranges and shapes of the keys, and verl's LoRA-adjacent keys whose
feature is not built (``use_shm``, ``target_parameters``, the Megatron ``model.lora`` section, critic LoRA),
refused off verl's default with the reason. ``model.lora.merge`` (verl: false = the rollout serves the adapter,
true = merged weights) picks the sync (:func:`serves_lora_adapters`, checked against the rollout engine's
``lora_adapters`` capability by :func:`check_lora_serving`).
"""

from __future__ import annotations

from typing import Any

from verl.config.errors import IssueCollector
from verl.config.schema import RootConfig

MODEL = "actor_rollout_ref.model"


def _check_names(report: IssueCollector, key: str, value: Any, *, allow_none: bool) -> None:
    """A module-name selector: one non-blank string (``all-linear`` or a peft regex) or a non-empty list."""
    if value is None and allow_none:
        return
    if isinstance(value, str):
        if not value.strip():
            report.error(key, "is blank; give 'all-linear', one regex, or a list of module names")
        return
    if isinstance(value, list | tuple) and value and all(isinstance(x, str) and x.strip() for x in value):
        return
    report.error(key, f"must be 'all-linear', one regex, or a non-empty list of module names, got {value!r}")


def check_lora(cfg: RootConfig, report: IssueCollector) -> None:
    """Add the LoRA key errors of a resolved config to ``report``."""
    model = cfg.actor_rollout_ref.model
    if model.lora_rank < 0:
        report.error(f"{MODEL}.lora_rank", f"must be >= 0 (0 = full fine-tuning), got {model.lora_rank}")
    if model.lora_rank > 0:
        if not model.lora_alpha > 0:
            report.error(f"{MODEL}.lora_alpha", f"must be > 0 (scale = lora_alpha / lora_rank), got {model.lora_alpha}")
        _check_names(report, f"{MODEL}.target_modules", model.target_modules, allow_none=False)
        _check_names(report, f"{MODEL}.exclude_modules", model.exclude_modules, allow_none=True)
    if model.lora_adapter_path is not None and model.lora_rank <= 0:
        report.error(
            f"{MODEL}.lora_adapter_path",
            f"={model.lora_adapter_path!r} is read only with LoRA on: set {MODEL}.lora_rank > 0 (the adapter's own "
            "rank, alpha and targets are then used, as verl's PeftModel.from_pretrained does)",
        )
    if model.use_shm:
        report.error(
            f"{MODEL}.use_shm",
            "=true: shared-memory loading (verl copies the model folder to /dev/shm first) is not built; models load "
            "from their folder or the local cache; set use_shm=false",
        )
    if model.target_parameters is not None:
        report.error(
            f"{MODEL}.target_parameters",
            f"={model.target_parameters!r}: LoRA on bare nn.Parameters (peft target_parameters, MoE experts) is not "
            "built; set it to null and use target_modules",
        )
    merge = (model.lora or {}).get("merge")
    if merge is not None and not isinstance(merge, bool):
        report.error(f"{MODEL}.lora.merge", f"must be true or false (or unset), got {merge!r}")
    megatron_rank = (model.lora or {}).get("rank", 0)
    if megatron_rank not in (0, None):
        report.error(
            f"{MODEL}.lora.rank",
            f"={megatron_rank}: model.lora is verl's Megatron LoRA section, and the megatron engine here has no "
            f"LoRA; use {MODEL}.lora_rank with actor.strategy=reference or fsdp",
        )
    if cfg.critic.model.lora_rank != 0:
        report.error(
            "critic.model.lora_rank",
            f"={cfg.critic.model.lora_rank}: critic LoRA is not built (only the actor trains adapters); set it to 0",
        )


def serves_lora_adapters(cfg: Any, capabilities: Any, device: Any = None) -> bool:
    """Whether the rollout serves the actor's LoRA as an adapter (verl's ``model.lora.merge=false`` path).

    True when LoRA is on (``model.lora_rank > 0``), the rollout engine declares the ``lora_adapters`` capability
    (vLLM: ``LoRARequest``s), the rollout runs in the trainer's processes (``rollout.placement`` hybrid), and
    ``model.lora.merge`` is false, or unset on an accelerator: then only the adapter moves at each sync. Otherwise
    the rollout gets merged weights ``W + (alpha / r) * B @ A`` (verl's ``merge=true``; the only way for engines
    without the capability).

    ``merge`` unset on a ``cpu`` device (``device``: the rollout's torch device or its type) means merged weights:
    vLLM's CPU LoRA layers generate 2.7-2.9x slower than the merged model (``benchmarks/lora_rollout.py``), far more
    than the full-weight sync costs there. ``merge=false`` still serves the adapter on a CPU.
    """
    from verl.config.placement import rollout_placement

    model = cfg.actor_rollout_ref.model
    merge = (model.lora or {}).get("merge")
    if model.lora_rank <= 0 or merge is True:
        return False
    if merge is None and device is not None and (getattr(device, "type", None) or str(device).split(":")[0]) == "cpu":
        return False
    return "lora_adapters" in frozenset(capabilities or ()) and rollout_placement(cfg) == "hybrid"


def check_lora_serving(cfg: Any, rollout_name: str, capabilities: Any, report: IssueCollector) -> None:
    """``model.lora.merge=false`` set explicitly where the rollout cannot serve adapters: an error with the fix.

    Unset, the choice is automatic (adapters where :func:`serves_lora_adapters`, else merged weights)."""
    from verl.config.placement import rollout_placement

    model = cfg.actor_rollout_ref.model
    if model.lora_rank <= 0 or (model.lora or {}).get("merge") is not False:
        return
    if "lora_adapters" not in frozenset(capabilities or ()):
        report.error(
            f"{MODEL}.lora.merge",
            f"=false serves the LoRA adapter to the rollout, but rollout engine {rollout_name!r} cannot serve "
            "adapters (capability 'lora_adapters': vllm); set lora.merge=true (merged weights) or leave it unset",
        )
    elif rollout_placement(cfg) != "hybrid":
        report.error(
            f"{MODEL}.lora.merge",
            f"=false: adapter serving is built for rollout.placement=hybrid only; with placement="
            f"{rollout_placement(cfg)} the rollout pool gets merged weights: set lora.merge=true or leave it unset",
        )
