"""Options of the ``sglang`` rollout engine: ``actor_rollout_ref.rollout.engine_kwargs.sglang``.

verl hands ``engine_kwargs.sglang`` straight to ``sglang.srt.server_args.ServerArgs(**kwargs)``
(``verl/workers/rollout/sglang_rollout/async_sglang_server.py``, ``**engine_kwargs`` last), so any
``ServerArgs`` field is a valid key there. The options class here keeps that promise and still fails a typo at
config load: :class:`SGLangRolloutOptions` has

* the plugin's own options (:class:`SGLangOwnOptions`, documented below);
* one field per ``ServerArgs`` field of the installed sglang (read from its source without importing it,
  :mod:`verl_sglang.server_args_fields`; the bundled 0.5.23 list where sglang is not installed), default null
  = SGLang's own default; a non-null value is passed to ``ServerArgs`` as is, and SGLang checks it when the
  engine starts;
* except the ``ServerArgs`` fields this plugin sets from verl's config (:data:`SET_BY`): those are refused
  with the key to use instead, so one setting has one place.

So ``engine_kwargs.sglang.mem_fraction_statc`` fails with core's "did you mean 'mem_fraction_static'", and
``engine_kwargs.sglang.mem_fraction_static`` fails with "set actor_rollout_ref.rollout.gpu_memory_utilization".
``ServerArgs``' private bookkeeping fields (leading underscore) are not options.
"""

from __future__ import annotations

from typing import Any

import attrs

from verl_sglang.server_args_fields import ServerArgsFields, server_args_fields

ROLLOUT = "actor_rollout_ref.rollout"
MODEL = "actor_rollout_ref.model"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

#: ``ServerArgs`` fields this plugin sets itself -> where their value comes from. Refused in engine_kwargs.sglang.
SET_BY: dict[str, str] = {
    "model_path": f"from {MODEL}.path",
    "skip_tokenizer_init": "always true: the engine takes the trainer's token ids and returns token ids",
    "tp_size": f"from {ROLLOUT}.tensor_model_parallel_size",
    "dp_size": f"from {ROLLOUT}.data_parallel_size",
    "pp_size": f"from {ROLLOUT}.pipeline_model_parallel_size",
    "ep_size": f"from {ROLLOUT}.expert_parallel_size",
    "nnodes": "(one engine per tensor-parallel group, on the node of the group's first rank)",
    "node_rank": "(one engine per tensor-parallel group, on the node of the group's first rank)",
    "dist_init_addr": "(one engine per tensor-parallel group, on the node of the group's first rank)",
    "base_gpu_id": "(from the worker's device: the GPU of the TP group's first rank)",
    "gpu_id_step": "(1: a group's ranks are consecutive GPUs)",
    "device": "from trainer.device",
    "dtype": f"from {ROLLOUT}.dtype",
    "mem_fraction_static": f"from {ROLLOUT}.gpu_memory_utilization",
    "disable_cuda_graph": f"from {ROLLOUT}.enforce_eager",
    "max_running_requests": f"from {ROLLOUT}.max_num_seqs",
    "max_prefill_tokens": f"from {ROLLOUT}.max_num_batched_tokens",
    "context_length": f"from {ROLLOUT}.max_model_len",
    "disable_radix_cache": f"from {ROLLOUT}.enable_prefix_caching",
    "cuda_graph_bs": f"from {ROLLOUT}.cudagraph_capture_sizes",
    "cuda_graph_bs_decode": f"from {ROLLOUT}.cudagraph_capture_sizes",
    "load_format": f"from {ROLLOUT}.load_format",
    "random_seed": f"from {ROLLOUT}.seed",
    "trust_remote_code": f"from {MODEL}.trust_remote_code",
    "json_model_override_args": f"from {MODEL}.override_config",
    "enable_memory_saver": "(true on accelerators: sleep() and wake_up() release and resume memory through it)",
}


def set_by_message(name: str, reason: str) -> str:
    """Why ``engine_kwargs.sglang.<name>`` is refused (``reason`` from :data:`SET_BY`), and the key to set instead
    when the value comes from one config key."""
    source = reason.removeprefix("from ")
    if source != reason and " " not in source:  # one config key: name it as the fix
        return (
            f"engine_kwargs.sglang.{name} is set by rollout engine 'sglang' from {source}; set {source} instead "
            "and remove it from engine_kwargs.sglang"
        )
    why = reason if reason.startswith("(") else f"({reason})"
    return f"engine_kwargs.sglang.{name} is set by rollout engine 'sglang' {why}; remove it from engine_kwargs.sglang"


def _set_by_us(reason: str) -> Any:
    def check(inst: object, attribute: attrs.Attribute, value: Any) -> None:
        if value is not None:
            raise ValueError(set_by_message(attribute.name, reason))

    return check


def _port(inst: object, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536):
        raise ValueError(f"engine_kwargs.sglang.port must be a TCP port (1-65535) or null, got {value!r}")


def _log_level(inst: object, attribute: attrs.Attribute, value: Any) -> None:
    if value not in LOG_LEVELS:
        raise ValueError(f"engine_kwargs.sglang.log_level={value!r} is not one of {list(LOG_LEVELS)}")


def _optional_str(inst: object, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"engine_kwargs.sglang.{attribute.name} must be a non-empty string or null, got {value!r}")


@attrs.frozen(kw_only=True)
class SGLangOwnOptions:
    """The plugin's own options, each also a ``ServerArgs`` field, given a hybrid-mode value here.

    Attributes:
        enable_weights_cpu_backup: SGLang keeps a host copy of the weights while they are released by
            ``sleep()``, so waking them restores the last synced weights even if a sync is skipped (verl sets it
            in hybrid mode, ``async_sglang_server.py``); false saves one model's host memory, and then every wake
            must be followed by a full weight sync. Not passed to a sglang without that field.
        log_level: SGLang's log level (verl: ``error``; ``info`` prints its periodic decode throughput).
        port: the engine's port (its ZMQ/NCCL ports are derived from it); null = a free port of this host, so
            several engines on one node do not collide.
        attention_backend: SGLang's attention kernel (``flashinfer``, ``fa3``, ``triton``, ...); null = verl's
            choice: ``flashinfer`` on CUDA with sglang >= 0.5.12 (FA3 CUDA-graph capture is broken there,
            sglang#22800), ``fa3`` on older sglang, ``aiter`` on ROCm, SGLang's own choice on NPU.
    """

    enable_weights_cpu_backup: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    log_level: str = attrs.field(default="error", validator=_log_level)
    port: int | None = attrs.field(default=None, validator=_port)
    attention_backend: str | None = attrs.field(default=None, validator=_optional_str)


OWN_OPTIONS: tuple[str, ...] = tuple(a.name for a in attrs.fields(SGLangOwnOptions))


def option_names(fields: ServerArgsFields) -> tuple[list[str], list[str]]:
    """``(pass-through names, names set by the plugin)`` among ``fields``' ``ServerArgs`` names (sorted; the
    plugin's own options and private ``_`` fields left out)."""
    public = sorted(n for n in fields.names if not n.startswith("_") and n not in OWN_OPTIONS)
    return [n for n in public if n not in SET_BY], [n for n in public if n in SET_BY]


def make_options_class(fields: ServerArgsFields) -> type:
    """The options class for one set of ``ServerArgs`` field names (see the module docstring).

    Returns:
        A frozen, keyword-only attrs subclass of :class:`SGLangOwnOptions` named ``SGLangRolloutOptions``,
        with the class attributes ``passthrough`` (names handed to ``ServerArgs`` when not null),
        ``set_by_plugin`` and ``server_args_source`` (where the names came from).
    """
    passthrough, reserved = option_names(fields)
    body: dict[str, Any] = {"__annotations__": {}, "__module__": __name__, "__qualname__": "SGLangRolloutOptions"}
    for name in passthrough:
        body["__annotations__"][name] = Any
        body[name] = attrs.field(default=None)
    for name in reserved:
        body["__annotations__"][name] = Any
        body[name] = attrs.field(default=None, validator=_set_by_us(SET_BY[name]), repr=False)
    body["__doc__"] = (
        "Options of the ``sglang`` rollout engine (``actor_rollout_ref.rollout.engine_kwargs.sglang.<key>``).\n\n"
        f"The fields of :class:`SGLangOwnOptions`, plus one field per ``ServerArgs`` field of {fields.source} "
        f"({len(passthrough)} pass-through fields, null = SGLang's default; {len(reserved)} set by the plugin and "
        "refused here, see :data:`verl_sglang.options.SET_BY`)."
    )
    cls = attrs.frozen(kw_only=True)(type("SGLangRolloutOptions", (SGLangOwnOptions,), body))
    cls.passthrough = tuple(passthrough)
    cls.set_by_plugin = tuple(reserved)
    cls.server_args_source = fields.source
    return cls


SGLangRolloutOptions = make_options_class(server_args_fields())


def passthrough_arguments(options: Any) -> dict[str, Any]:
    """``ServerArgs`` keyword arguments of the non-null pass-through options (what the user wrote)."""
    return {name: getattr(options, name) for name in type(options).passthrough if getattr(options, name) is not None}
