"""Options of the ``megatron`` training engine: ``actor_rollout_ref.actor.engine_kwargs.megatron``.

Config load structures them per role (:func:`verl.config.role_options`: the reference policy's
``ref.engine_kwargs.megatron`` over the actor's, the critic's ``critic.engine_kwargs.megatron`` alone) and the
worker hands the instance to :func:`verl_megatron.builder.build_megatron_training_engine` as ``options``.
verl's own sections (``actor_rollout_ref.actor.megatron.*``, ``actor_rollout_ref.ref.megatron.*``,
``critic.megatron.*``) are moved here before the check (:mod:`verl.config.aliases`).

Keys are verl's ``McoreEngineConfig`` (``verl/workers/config/engine.py``, ``verl/trainer/config/engine/
megatron.yaml``). A key either does what verl's does or is accepted only at the value meaning "off" and refused
otherwise with the reason; an unknown key is a config error naming it. What is checked here is static (types,
ranges, enums, combinations of these options); what needs the world size, the model or the device is checked
by the factory through :meth:`MegatronEngineOptions.check_device`, the ``resolved_*`` methods and
:meth:`MegatronEngineOptions.check_override_names`. Only attrs and the standard library are imported at module
level, so listing plugins stays cheap.
"""

from __future__ import annotations

import difflib
import logging
from typing import Any

import attrs

#: Where the actor's options are written; errors raised outside config load name keys under it (a caller
#: building another role passes that role's section).
SECTION = "actor_rollout_ref.actor.engine_kwargs.megatron"
AUTO = "auto"
_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}
TRANSFORMER_IMPLS = (AUTO, "local", "transformer_engine")
#: Megatron's ``AttnBackend`` member names (``megatron.core.transformer.enums``): verl writes the name in YAML and
#: converts it with ``AttnBackend[name]`` (``verl/utils/megatron_utils.py``); so does
#: :meth:`MegatronEngineOptions.transformer_config_overrides`.
ATTENTION_BACKENDS = ("flash", "fused", "unfused", "local", "auto")
#: TransformerConfig / DDP-config fields that these options set: overriding them there would disagree with the
#: parallel state (set up from the options) or with the optimizer, so they are refused with the key to use.
_OWN_TRANSFORMER_FIELDS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "sequence_parallel",
)
_OWN_DDP_FIELDS = ("use_distributed_optimizer",)


class MegatronOptionError(ValueError):
    """A bad value of one option. ``args == (message, attribute)``: config load's converter reads the attribute
    and names the key where the value was written (``<role section>.engine_kwargs.megatron.<name>``); ``str()``
    names it under :data:`SECTION` for a direct caller."""

    def __init__(self, message: str, attribute: attrs.Attribute) -> None:
        super().__init__(message, attribute)

    def __str__(self) -> str:
        return f"{SECTION}.{self.args[1].name}: {self.args[0]}"


def _fail(attribute: attrs.Attribute, message: str) -> None:
    raise MegatronOptionError(message, attribute)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _size(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if not _is_int(value) or value < 1:
        _fail(attribute, f"must be an int >= 1, got {value!r}")


def _optional_size(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if value is not None and (not _is_int(value) or value < 1):
        _fail(attribute, f"must be an int >= 1 or null, got {value!r}")


def _bool(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, bool):
        _fail(attribute, f"must be true or false, got {value!r}")


def _optional_bool(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if value is not None and not isinstance(value, bool):
        _fail(attribute, f"must be true, false or null, got {value!r}")


def _int(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if not _is_int(value):
        _fail(attribute, f"must be an int, got {value!r}")


def _choice(choices: tuple[str, ...]) -> Any:
    def check(inst: object, attribute: attrs.Attribute, value: object) -> None:
        if value not in choices:
            _fail(attribute, f"must be one of {list(choices)}, got {value!r}")

    return check


def _mapping(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        _fail(attribute, f"must be a mapping of field name -> value, got {value!r}")


def _yaml(value: object) -> str:
    """``value`` as it is written in YAML / an override (``null``, ``true``, ``""``)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return '""' if value == "" else repr(value)


def _only(off: object, reason: str) -> Any:
    """A verl key this engine does not build: only its "off" value ``off`` is accepted, else ``reason``."""

    def check(inst: object, attribute: attrs.Attribute, value: object) -> None:
        # `off is False` must not accept 0 (== False), nor `off == {}` accept None: compare the types too.
        if type(value) is type(off) and value == off:
            return
        _fail(attribute, f"{_yaml(value)} is not accepted: {reason}; set it to {_yaml(off)} or remove it")

    return check


def _as_dict(value: Any) -> Any:
    return {} if value is None else (dict(value) if hasattr(value, "keys") else value)


_NOT_DIST_CKPT_INIT = (
    "loading the initial weights from a Megatron dist checkpoint is not built; the weights load from the HF "
    "folder actor_rollout_ref.model.path (the checkpoints a run writes are dist_checkpointing ones anyway, and "
    "resume reads them)"
)


@attrs.frozen(kw_only=True)
class MegatronEngineOptions:
    """Options of the ``megatron`` engine, read from ``actor_rollout_ref.actor.engine_kwargs.megatron`` (verl's
    ``actor_rollout_ref.actor.megatron``; same names, verl's defaults unless said otherwise).

    Attributes:
        tensor_model_parallel_size / pipeline_model_parallel_size / context_parallel_size /
            expert_model_parallel_size: Megatron's parallel sizes (``parallel_state.initialize_model_parallel``),
            ints >= 1; data parallelism is what is left of the world (``world // (tp * pp * cp)``), checked by
            the factory. ``context_parallel_size > 1`` needs Transformer Engine's attention (refused on cpu).
        virtual_pipeline_model_parallel_size: model chunks per pipeline rank (interleaved schedule), or null
            (none). Megatron accepts an int >= 1 and only with ``pipeline_model_parallel_size > 1``.
        expert_tensor_parallel_size: TP size of the experts of a MoE layer; null = ``tensor_model_parallel_size``
            (Megatron's ``ModelParallelConfig``).
        sequence_parallel: split the activations outside attention/MLP over the TP group. null (the default) =
            on when ``tensor_model_parallel_size > 1`` on an accelerator (verl's default ``true``, which verl turns
            off at TP 1), off on cpu (Megatron's local layer spec has no sequence-parallel norms there).
            ``true`` with TP 1 resolves to off with a warning, as verl's ``McoreEngineConfig`` does (verl's YAML
            default is ``true`` at any TP). See :meth:`resolved_sequence_parallel`.
        use_distributed_optimizer: shard the optimizer state over the DP group (ZeRO-1,
            ``DistributedDataParallelConfig.use_distributed_optimizer``); default true like verl.
        param_offload / grad_offload / optimizer_offload: move the DDP parameter buffers / gradient buffers /
            optimizer state to host memory between phases (verl's ``offload_megatron_*``); nothing moves on cpu.
        transformer_impl: layer spec: ``local`` (Megatron's own modules; runs on cpu), ``transformer_engine``
            (TE-fused modules; cuda with Transformer Engine installed) or ``auto`` (the default: TE on cuda when
            it imports, else local). See :meth:`resolved_transformer_impl`.
        dtype: parameter dtype of the forward/backward (Megatron keeps fp32 main parameters in its optimizer);
            ``auto`` (default) = ``bfloat16`` on accelerators (verl's default) and ``float32`` on cpu, where bf16
            matmuls are several times slower; else one of float32/fp32/bfloat16/bf16/float16/fp16.
        seed: Megatron's seed (``model_parallel_cuda_manual_seed`` on cuda, its RNG tracker on cpu); verl's 42.
        override_transformer_config: ``TransformerConfig`` field -> value, applied over what the engine derives
            from the HF config (verl's ``override_transformer_config``; its YAML default holds ``recompute_*`` and
            ``attention_backend``, accepted). ``attention_backend`` is written by name (``flash``, ``fused``,
            ``unfused``, ``local``, ``auto``: Megatron's ``AttnBackend``). Names are checked by
            :meth:`check_override_names` (the factory calls it; it imports megatron).
        override_ddp_config: ``DistributedDataParallelConfig`` field -> value (verl's ``override_ddp_config``).
        use_mbridge: on cuda with ``mbridge`` installed, translate the HF config to a ``TransformerConfig`` with
            mbridge's ``AutoBridge`` (verl's default true), else with this plugin's own converter (Llama, Qwen2,
            Qwen3). On cpu the own converter is always used; both give the same config for those families.
        pad_bshd_to_minibatch_max: pad every micro-batch of a mini-batch to the mini-batch's longest row instead
            of each micro-batch to its own longest row (verl's BSHD knob: fewer distinct shapes for cuDNN).
            Results do not depend on it (padding is masked out). Default false here (verl: true): on cpu the
            extra padding only costs time.
        pad_to_length_bucket: verl's bucket of ``pad_to_length``; only read when ``pad_to_length`` is true, which is
            refused here: only verl's default 512 is accepted (so verl's YAML loads), any other value is refused.
        entropy_from_logits_with_chunking / entropy_from_logits_chunk_size: verl's engine-level copies of the
            role's keys of the same name; null = the role's key, a value here wins for this engine
            (:meth:`token_stats_overrides`).
        use_dist_checkpointing / dist_checkpointing_path / dist_checkpointing_prefix: initial weights from a
            Megatron dist checkpoint: not built, only false / null / "" are accepted.
        dist_ckpt_optim_fully_reshardable / distrib_optim_fully_reshardable_mem_efficient: the fully reshardable
            optimizer checkpoint format: not built (checkpoints resume on the same parallel layout), only false.
        use_megatron_fsdp: Megatron-FSDP (ZeRO-3): not built, only false.
        dynamic_context_parallel / max_seqlen_per_dp_cp_rank: verl's dynamic CP scheduling of packed sequences:
            not built, only false / null.
        override_mcore_model_config: keyword arguments of verl's model provider (GPTModel): not built, only {}.
        vanilla_mbridge: verl's choice between Megatron-Bridge (false) and the legacy mbridge (true) as the model
            builder. This engine builds the model itself from its layer spec and uses a bridge only for the config
            (``use_mbridge``), so only false (verl's default) is accepted; true is refused with that reason.
        pad_to_length: round packed (THD) micro-batches up to a bucket: not built (this engine runs padded BSHD
            micro-batches), only false.
    """

    tensor_model_parallel_size: int = attrs.field(default=1, validator=_size)
    pipeline_model_parallel_size: int = attrs.field(default=1, validator=_size)
    virtual_pipeline_model_parallel_size: int | None = attrs.field(default=None, validator=_optional_size)
    context_parallel_size: int = attrs.field(default=1, validator=_size)
    expert_model_parallel_size: int = attrs.field(default=1, validator=_size)
    expert_tensor_parallel_size: int | None = attrs.field(default=None, validator=_optional_size)
    sequence_parallel: bool | None = attrs.field(default=None, validator=_optional_bool)
    use_distributed_optimizer: bool = attrs.field(default=True, validator=_bool)
    param_offload: bool = attrs.field(default=False, validator=_bool)
    grad_offload: bool = attrs.field(default=False, validator=_bool)
    optimizer_offload: bool = attrs.field(default=False, validator=_bool)
    transformer_impl: str = attrs.field(default=AUTO, validator=_choice(TRANSFORMER_IMPLS))
    dtype: str = attrs.field(default=AUTO, validator=_choice((AUTO, *_DTYPES)))
    seed: int = attrs.field(default=42, validator=_int)
    override_transformer_config: dict[str, Any] = attrs.field(factory=dict, converter=_as_dict, validator=_mapping)
    override_ddp_config: dict[str, Any] = attrs.field(factory=dict, converter=_as_dict, validator=_mapping)
    use_mbridge: bool = attrs.field(default=True, validator=_bool)
    pad_bshd_to_minibatch_max: bool = attrs.field(default=False, validator=_bool)
    pad_to_length_bucket: int = attrs.field(
        default=512,
        validator=[
            _size,
            _only(512, "it is the bucket of pad_to_length, which is not built (only false is accepted)"),
        ],
    )
    entropy_from_logits_with_chunking: bool | None = attrs.field(default=None, validator=_optional_bool)
    entropy_from_logits_chunk_size: int | None = attrs.field(default=None, validator=_optional_size)
    # verl keys not built here: only the value meaning "off".
    use_dist_checkpointing: bool = attrs.field(default=False, validator=_only(False, _NOT_DIST_CKPT_INIT))
    dist_checkpointing_path: str | None = attrs.field(default=None, validator=_only(None, _NOT_DIST_CKPT_INIT))
    dist_checkpointing_prefix: str = attrs.field(default="", validator=_only("", _NOT_DIST_CKPT_INIT))
    dist_ckpt_optim_fully_reshardable: bool = attrs.field(
        default=False,
        validator=_only(
            False,
            "the fully reshardable optimizer checkpoint format (resume on another TP/PP/EP layout) is not built; "
            "checkpoints of this engine resume on the parallel layout that wrote them",
        ),
    )
    distrib_optim_fully_reshardable_mem_efficient: bool = attrs.field(
        default=False,
        validator=_only(
            False,
            "it tunes the fully reshardable optimizer checkpoint format (dist_ckpt_optim_fully_reshardable), "
            "which is not built",
        ),
    )
    use_megatron_fsdp: bool = attrs.field(
        default=False,
        validator=_only(
            False,
            "Megatron-FSDP (ZeRO-3 parameter sharding) is not built; use_distributed_optimizer shards the "
            "optimizer state (ZeRO-1), or use strategy=fsdp for parameter sharding",
        ),
    )
    dynamic_context_parallel: bool = attrs.field(
        default=False,
        validator=_only(False, "verl's dynamic context-parallel scheduling of packed sequences is not built"),
    )
    max_seqlen_per_dp_cp_rank: int | None = attrs.field(
        default=None,
        validator=_only(None, "it is read only by dynamic_context_parallel, which is not built"),
    )
    override_mcore_model_config: dict[str, Any] = attrs.field(
        factory=dict,
        converter=_as_dict,
        validator=_only(
            {},
            "extra GPTModel arguments of verl's model provider are not built; this engine builds GPTModel from "
            "its layer spec (TransformerConfig fields go in override_transformer_config)",
        ),
    )
    vanilla_mbridge: bool = attrs.field(
        default=False,
        validator=_only(
            False,
            "it makes verl build the model with the deprecated legacy mbridge; this engine builds the model from "
            "its own layer spec and uses a bridge only to translate the HF config (use_mbridge)",
        ),
    )
    pad_to_length: bool = attrs.field(
        default=False,
        validator=_only(
            False, "it pads packed (THD) micro-batches to a bucket; this engine runs padded BSHD micro-batches"
        ),
    )

    def __attrs_post_init__(self) -> None:
        fields = attrs.fields(type(self))
        if self.virtual_pipeline_model_parallel_size is not None and self.pipeline_model_parallel_size == 1:
            _fail(
                fields.virtual_pipeline_model_parallel_size,
                f"{self.virtual_pipeline_model_parallel_size} needs pipeline_model_parallel_size > 1 (it is 1): the "
                "interleaved schedule splits each pipeline stage into model chunks (Megatron refuses it without "
                "pipeline parallelism); set it to null",
            )

    # ------------------------------------------------------------------ resolved values (need the device)

    def parallel_sizes(self) -> dict[str, int | None]:
        """``{"tp", "pp", "vpp", "cp", "ep", "etp"}``: the sizes as given (``vpp``/``etp`` may be None)."""
        return {
            "tp": self.tensor_model_parallel_size,
            "pp": self.pipeline_model_parallel_size,
            "vpp": self.virtual_pipeline_model_parallel_size,
            "cp": self.context_parallel_size,
            "ep": self.expert_model_parallel_size,
            "etp": self.expert_tensor_parallel_size,
        }

    def model_parallel_size(self) -> int:
        """Ranks per model replica, ``tp * pp * cp``: config load counts verl's per-GPU batch keys over
        ``world // model_parallel_size()`` data-parallel ranks (``verl.config.backend_options.role_data_parallel_size``)."""
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size * self.context_parallel_size

    def check_device(self, device_type: str, *, section: str = SECTION) -> None:
        """Refuse what cannot run on ``device_type`` (a torch device type: ``"cpu"``, ``"cuda"``).

        Raises:
            ValueError: naming ``<section>.<key>``, on cpu: ``sequence_parallel=true`` (the local spec has no
                sequence-parallel norms: Transformer Engine or Apex), ``context_parallel_size > 1`` (context
                parallel attention is Transformer Engine's), ``transformer_impl=transformer_engine``.
        """
        if device_type != "cpu":
            return
        problems = []
        if self.sequence_parallel is True:
            problems.append(
                f"{section}.sequence_parallel=true cannot run on cpu: Megatron's sequence-parallel norms come from "
                "Transformer Engine or Apex, which the cpu's local layer spec does not have; set it to null or false"
            )
        if self.context_parallel_size > 1:
            problems.append(
                f"{section}.context_parallel_size={self.context_parallel_size} cannot run on cpu: Megatron's "
                "context-parallel attention is Transformer Engine's; set it to 1"
            )
        if self.transformer_impl == "transformer_engine":
            problems.append(self._te_on_cpu(section))
        if problems:
            raise ValueError("; ".join(problems))

    def resolved_sequence_parallel(self, device_type: str, *, section: str = SECTION) -> bool:
        """Whether sequence parallelism is on for ``device_type`` (``auto`` resolved; see the attribute).

        Raises:
            ValueError: ``sequence_parallel=true`` on cpu, naming ``<section>.sequence_parallel``.
        """
        if self.sequence_parallel is None:
            return self.tensor_model_parallel_size > 1 and device_type != "cpu"
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            # verl (McoreEngineConfig.__post_init__): "set sequence parallel to false as TP size is 1".
            logging.getLogger(__name__).warning(
                "%s.sequence_parallel=true with tensor_model_parallel_size=1: off (nothing to split), as in verl",
                section,
            )
            return False
        if self.sequence_parallel and device_type == "cpu":
            self.check_device(device_type, section=section)  # raises with the reason
        return self.sequence_parallel

    def resolved_transformer_impl(self, device_type: str, te_available: bool, *, section: str = SECTION) -> str:
        """``"local"`` or ``"transformer_engine"``: the layer spec on ``device_type`` (``auto`` resolved).

        Args:
            device_type: torch device type of this rank.
            te_available: whether ``transformer_engine.pytorch`` imports here (the caller checks it).

        Raises:
            ValueError: ``transformer_engine`` asked on a device other than cuda, or without Transformer Engine
                installed, naming ``<section>.transformer_impl``.
        """
        if self.transformer_impl == AUTO:
            return "transformer_engine" if device_type == "cuda" and te_available else "local"
        if self.transformer_impl == "transformer_engine":
            if device_type != "cuda":
                raise ValueError(self._te_on_cpu(section, device_type))
            if not te_available:
                raise ValueError(
                    f"{section}.transformer_impl=transformer_engine, but Transformer Engine does not import here: "
                    "install the build matching your CUDA and torch (pip install --no-build-isolation "
                    "'transformer_engine[pytorch]'), or set it to local or auto"
                )
        return self.transformer_impl

    def resolved_dtype(self, device_type: str) -> str:
        """The canonical torch dtype name (``"float32"``, ``"bfloat16"``, ``"float16"``) on ``device_type``."""
        if self.dtype == AUTO:
            return "float32" if device_type == "cpu" else "bfloat16"
        return _DTYPES[self.dtype]

    def token_stats_overrides(self) -> dict[str, Any]:
        """The :class:`~verl.engines.reference.training.EngineSettings` fields set here (``null`` ones left out)."""
        names = ("entropy_from_logits_with_chunking", "entropy_from_logits_chunk_size")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    # ------------------------------------------------------------------ checks that import megatron

    def check_override_names(self, *, section: str = SECTION) -> None:
        """Check the keys of ``override_transformer_config`` / ``override_ddp_config`` against Megatron's
        ``TransformerConfig`` / ``DistributedDataParallelConfig`` fields (imports megatron-core).

        Also refused: fields these options set (parallel sizes, ``sequence_parallel``, ``use_distributed_optimizer``:
        the parallel state is set up from the options) and an ``attention_backend`` that is not an ``AttnBackend``
        name.

        Raises:
            ValueError: one sentence per bad key, naming ``<section>.override_transformer_config.<key>`` (or
                ``override_ddp_config``), with the closest field name when one is close.
        """
        import dataclasses

        from megatron.core.distributed.distributed_data_parallel_config import DistributedDataParallelConfig
        from megatron.core.transformer.transformer_config import TransformerConfig

        problems: list[str] = []
        for name, overrides, cls, own in (
            (
                "override_transformer_config",
                self.override_transformer_config,
                TransformerConfig,
                _OWN_TRANSFORMER_FIELDS,
            ),
            ("override_ddp_config", self.override_ddp_config, DistributedDataParallelConfig, _OWN_DDP_FIELDS),
        ):
            fields = [f.name for f in dataclasses.fields(cls)]
            for key in overrides:
                where = f"{section}.{name}.{key}"
                if key in own:
                    problems.append(f"{where}: set by these options; write it as {section}.{key}")
                elif key not in fields:
                    close = difflib.get_close_matches(key, fields, n=1)
                    hint = f"; did you mean {close[0]!r}?" if close else ""
                    problems.append(f"{where}: {cls.__name__} has no field {key!r}{hint}")
        backend = self.override_transformer_config.get("attention_backend")
        if backend is not None and not (isinstance(backend, str) and backend in ATTENTION_BACKENDS):
            problems.append(
                f"{section}.override_transformer_config.attention_backend={backend!r}: must be one of "
                f"{list(ATTENTION_BACKENDS)} (the name of a megatron.core.transformer.enums.AttnBackend member)"
            )
        if problems:
            raise ValueError("; ".join(problems))

    def transformer_config_overrides(self) -> dict[str, Any]:
        """``override_transformer_config`` as ``TransformerConfig`` keyword arguments: ``attention_backend``'s
        name made an ``AttnBackend`` member, as verl does (imports megatron-core; call
        :meth:`check_override_names` first)."""
        out = dict(self.override_transformer_config)
        if isinstance(out.get("attention_backend"), str):
            from megatron.core.transformer.enums import AttnBackend

            out["attention_backend"] = AttnBackend[out["attention_backend"]]
        return out

    @staticmethod
    def _te_on_cpu(section: str, device_type: str = "cpu") -> str:
        return (
            f"{section}.transformer_impl=transformer_engine cannot run on {device_type}: Transformer Engine's "
            "modules are CUDA kernels; set it to local or auto (auto = local there)"
        )
