"""``load_sft_config``: SFT schema defaults <- YAML file <- dotted overrides, then structure and validate.

The same layering, override syntax and error style as :func:`verl.config.load_config` (one
:class:`~verl.config.errors.ConfigError` listing every problem), over :class:`verl.config.schema.sft.SFTConfig`.
Keys verl's SFT trainer has but this one cannot honour are refused with the reason (:data:`REFUSED_KEYS`), so
a verl run script fails loudly instead of silently training something else.
"""

from __future__ import annotations

import copy
import difflib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from verl.config.converter import structure
from verl.config.dump import to_dict
from verl.config.errors import ConfigError, ConfigIssue, IssueCollector
from verl.config.keys import _field_types, section_class
from verl.config.loader import read_mapping, strip_targets
from verl.config.overrides import apply_override, deep_merge, parse_override
from verl.config.schema.sft import SFTConfig

#: verl ``sft_trainer_engine.yaml`` keys that are not built here -> why, and what to do instead.
REFUSED_KEYS: dict[str, str] = {
    "data.tools_key": "tool schemas in SFT rows are not rendered here; drop the key (rows must not carry tools)",
    "data.enable_thinking_key": "per-row enable_thinking is not built; use data.apply_chat_template_kwargs",
    "data.enable_thinking_default": "not built; use data.apply_chat_template_kwargs.enable_thinking",
    "data.custom_cls": "custom dataset classes are not loaded; convert the rows to messages or prompt/response",
    "data.use_shm": "shared-memory model loading is not built; drop the key",
    "data.balance_dp_token": "token balancing across data-parallel ranks is not built: each rank trains a contiguous, "
    "equal share of the step's rows; drop the key",
    "data.num_workers": "rows are tokenised once when the dataset is built; no loader workers to start",
    "data.ignore_input_ids_mismatch": "turns are tokenised as prefixes of the whole conversation, which must "
    "tokenise consistently (an error names the row otherwise); there is no mismatch to ignore",
    "trainer.default_hdfs_dir": "HDFS upload is not built; copy trainer.default_local_dir yourself",
    "trainer.balance_batch": "batch balancing across data-parallel ranks is not built; drop the key",
    "trainer.profile_interval": "the profiler is not built for SFT",
    "profiler": "the profiler is not built for SFT",
}


def load_sft_config(path: str | os.PathLike[str] | None = None, overrides: Sequence[str] = ()) -> SFTConfig:
    """Build a validated :class:`SFTConfig` from the schema defaults, a YAML file and ``key=value`` overrides.

    Args:
        path: YAML file (verl's ``sft_trainer_engine.yaml`` layout), or None for the defaults alone.
        overrides: Hydra-style dotted overrides, e.g. ``["data.max_length=512", "optim.lr=1e-5"]``.

    Returns:
        The frozen config, ``trainer.default_local_dir`` filled in
        (``checkpoints/<project_name>/<experiment_name>`` when null, verl's default).

    Raises:
        ConfigError: unreadable file, bad override, unknown key (with did-you-mean), refused verl key (with the
            reason), wrong type, or a failed rule of :func:`validate_sft_config`; all issues at once.
    """
    tree = to_dict(SFTConfig())
    if path is not None:
        data = read_mapping(path)
        for key in ("defaults", "hydra"):
            if key in data:
                # Silently dropping a composition list would train with other settings than the file names.
                raise ConfigError(
                    f"{key}: SFT config files are not composed (no Hydra defaults list / search path); write the "
                    f"keys into {path} itself",
                    key=key,
                )
        deep_merge(tree, copy.deepcopy(strip_targets(data)))
    for text in overrides:
        override = parse_override(text)
        if override.path == ("engine",) and isinstance(override.value, str):
            # verl picks the engine with its Hydra group (`engine=fsdp`): that is the strategy key here.
            override = parse_override(f"engine.strategy={override.value}")
        apply_override(tree, override)
    issues = _flat_engine_options(tree)
    issues += _unknown_keys(tree, SFTConfig, "")
    if issues:
        raise ConfigError(issues)
    cfg = structure(tree, SFTConfig)
    validate_sft_config(cfg)
    from verl.trainer.sft_engine import actor_run_config

    actor_run_config(cfg)  # the engine, its options and LoRA, checked as the RL actor's (errors under SFT keys)
    if cfg.trainer.default_local_dir is None:
        import attrs

        run_dir = os.path.join("checkpoints", cfg.trainer.project_name, cfg.trainer.experiment_name)
        cfg = attrs.evolve(cfg, trainer=attrs.evolve(cfg.trainer, default_local_dir=run_dir))
    return cfg


def _flat_engine_options(tree: dict[str, Any]) -> list[ConfigIssue]:
    """verl writes an engine's options flat (``engine.param_offload``): move every ``engine.*`` key that is not
    ``strategy`` / ``model_dtype`` into ``engine.options``, which the engine's plugin checks."""
    engine = tree.get("engine")
    if not isinstance(engine, dict):
        return []
    options = engine.get("options")
    if options:
        return [ConfigIssue("engine.options", "engine.options: write the engine's keys flat, as engine.<key>=value")]
    own = set(_field_types(section_class(_field_types(SFTConfig)["engine"])))
    engine["options"] = {k: engine.pop(k) for k in [k for k in engine if k not in own]}
    return []


def _unknown_keys(raw: Mapping[str, Any], cls: type, parent: str) -> list[ConfigIssue]:
    fields = _field_types(cls)
    issues: list[ConfigIssue] = []
    for key, value in raw.items():
        full = f"{parent}.{key}" if parent else str(key)
        if full in REFUSED_KEYS:
            issues.append(ConfigIssue(full, f"{full}: verl's key is not built here: {REFUSED_KEYS[full]}"))
            continue
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=3, cutoff=0.6)
            hint = (" Did you mean " + " or ".join(f"'{_join(parent, c)}'" for c in close) + "?") if close else ""
            issues.append(ConfigIssue(full, f"unknown config key '{full}' of the SFT trainer.{hint}"))
            continue
        sub = section_class(fields[key])
        if sub is not None and isinstance(value, Mapping):
            issues.extend(_unknown_keys(value, sub, full))
    return issues


def _join(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def validate_sft_config(cfg: SFTConfig) -> None:
    """Cross-field rules of an SFT config.

    Raises:
        ConfigError: every violated rule, each naming its key and the fix.
    """
    r = IssueCollector()
    d, t, e = cfg.data, cfg.trainer, cfg.engine
    if (d.prompt_key is None) != (d.response_key is None):
        r.error(
            "data.prompt_key" if d.prompt_key is None else "data.response_key",
            "single-turn rows need both data.prompt_key and data.response_key (or neither: multi-turn rows "
            f"from data.messages_key={d.messages_key!r})",
        )
    for key, value in (
        ("data.max_length", d.max_length),
        ("data.train_batch_size", d.train_batch_size),
        ("data.micro_batch_size_per_gpu", d.micro_batch_size_per_gpu),
        ("data.max_token_len_per_gpu", d.max_token_len_per_gpu),
        ("trainer.total_epochs", t.total_epochs),
    ):
        if value < 1:
            r.error(key, f"={value}: must be >= 1")
    if t.total_training_steps is not None and t.total_training_steps < 1:
        r.error("trainer.total_training_steps", f"={t.total_training_steps}: must be >= 1 or null (epochs x batches)")
    if d.use_dynamic_bsz and d.max_token_len_per_gpu < d.max_length:
        r.error(
            "data.max_token_len_per_gpu",
            f"={d.max_token_len_per_gpu} is below data.max_length={d.max_length}: a full-length row would not fit "
            "one micro-batch; raise it or lower data.max_length",
        )
    if not d.train_files:
        r.error("data.train_files", "is required: the training parquet/jsonl file(s)")
    for key, value in (("trainer.nnodes", t.nnodes), ("trainer.n_gpus_per_node", t.n_gpus_per_node)):
        if value < 1:
            r.error(key, f"={value}: must be >= 1")
    if e.strategy == "reference" and t.nnodes * t.n_gpus_per_node > 1:
        r.error(
            "engine.strategy",
            f"=reference is one process, but trainer.nnodes x trainer.n_gpus_per_node = {t.nnodes * t.n_gpus_per_node}"
            "; use engine.strategy=fsdp (data parallel) or megatron for several processes",
        )
    if t.device not in ("cpu", "cuda"):
        r.error("trainer.device", f"={t.device!r}: use cpu or cuda")
    if t.resume_mode == "resume_path" and not t.resume_from_path:
        r.error(
            "trainer.resume_from_path", "resume_mode=resume_path needs trainer.resume_from_path=<dir>/global_step_N"
        )
    if t.max_ckpt_to_keep is not None and t.max_ckpt_to_keep < 0:
        r.error("trainer.max_ckpt_to_keep", f"={t.max_ckpt_to_keep}: must be >= 0 or null (keep all)")
    o = cfg.optim
    if o.total_training_steps != -1:
        r.error(
            "optim.total_training_steps",
            f"={o.total_training_steps}: the schedule length is the run's step count; set trainer.total_training_steps",
        )
    if o.min_lr is not None and o.min_lr_ratio:
        r.error("optim.min_lr", "set optim.min_lr or optim.min_lr_ratio, not both")
    built = ("model", "optimizer", "extra")
    for key in ("save_contents", "load_contents"):
        value = getattr(cfg.checkpoint, key)
        if value is not None and sorted(value) != sorted(built):
            r.error(
                f"checkpoint.{key}",
                f"={list(value)}: only {list(built)} is built (exact resume needs all three); the final HF folder "
                "is always written to <default_local_dir>/final_hf",
            )
    if not cfg.checkpoint.strict:
        r.error("checkpoint.strict", "=false: no checkpoint here holds HF weights to check loosely; drop the key")
    r.raise_if_errors()
