"""``engine_kwargs.sglang`` options: the ServerArgs field names read from source (both layouts, on synthetic
trees), the bundled snapshot, and what config load does with a typo, a plugin-set key and a bad value."""

from __future__ import annotations

import textwrap

import pytest
from verl_sglang import server_args_fields as saf
from verl_sglang.options import SET_BY, SGLangRolloutOptions, make_options_class, passthrough_arguments

from verl.config import ConfigError
from verl.config.engine_options import structure_options

KEY = "actor_rollout_ref.rollout.engine_kwargs.sglang"


def _write(root, rel, text):
    path = root.joinpath(*rel.split("/"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def test_reads_a_dataclass_server_args(tmp_path):
    # sglang <= 0.5.1x: fields in the class body (verl's dataclasses.fields).
    _write(
        tmp_path,
        "srt/server_args.py",
        """
        import dataclasses
        from typing import ClassVar, Optional

        @dataclasses.dataclass
        class ServerArgs:
            model_path: str
            tp_size: int = 1
            dtype: Optional[str] = "auto"
            VERSION: ClassVar[int] = 3
            plain = 4

            def method(self) -> int:
                return 1
        """,
    )
    assert saf.read_server_args_fields(tmp_path) == ("model_path", "tp_size", "dtype")


def test_reads_namespaced_msgspec_server_args(tmp_path):
    # sglang 0.5.2x: ServerArgs = msgspec.defstruct(namespace fields + its own annotations).
    _write(
        tmp_path,
        "srt/server_args.py",
        """
        from sglang.srt.arg_groups.fields.device import Device
        from sglang.srt.arg_groups.fields.model import (
            Model,
        )

        class ServerArgs:
            extra_flag: bool = False
            def __post_init__(self): ...

        _INPUT_NAMESPACES = [Model, Device]
        ServerArgs = msgspec.defstruct("ServerArgs", [])
        """,
    )
    _write(
        tmp_path,
        "srt/arg_groups/fields/model.py",
        """
        class Model(msgspec.Struct):
            _NS_PATH = "model"
            model_path: A[str, "path"] = None
            context_length: A[Optional[int], "ctx"] = None
        """,
    )
    _write(
        tmp_path,
        "srt/arg_groups/fields/device.py",
        """
        class Device(msgspec.Struct):
            _NS_PATH = "device"
            device: A[Optional[str], "which"] = None
            gpu_id = Derived(doc="set by the parent", default=None)
        """,
    )
    assert saf.read_server_args_fields(tmp_path) == ("model_path", "context_length", "device", "extra_flag")
    _write(tmp_path, "srt/server_args.py", "class ServerArgs:\n    pass\n_INPUT_NAMESPACES = [Missing]\n")
    with pytest.raises(ValueError, match="'Missing' of _INPUT_NAMESPACES is not imported"):
        saf.read_server_args_fields(tmp_path)
    _write(tmp_path, "srt/server_args.py", "X = 1\n")
    with pytest.raises(ValueError, match="no 'class ServerArgs'"):
        saf.read_server_args_fields(tmp_path)


def test_field_source_is_the_installed_tree_else_the_snapshot(tmp_path, monkeypatch):
    from verl_sglang import _server_args_snapshot as snapshot

    _write(tmp_path / "sglang", "srt/server_args.py", "class ServerArgs:\n    alpha: int = 1\n")
    saf.server_args_fields.cache_clear()
    try:
        monkeypatch.setattr(saf, "sglang_package_dir", lambda: tmp_path / "sglang")
        installed = saf.server_args_fields()
        assert installed.names == ("alpha",) and installed.source.startswith("installed sglang")
        saf.server_args_fields.cache_clear()
        monkeypatch.setattr(saf, "sglang_package_dir", lambda: None)
        fallback = saf.server_args_fields()
        assert fallback.names == snapshot.FIELDS and fallback.version == "0.5.23"
        saf.server_args_fields.cache_clear()
        # An unreadable install falls back to the snapshot and says why.
        monkeypatch.setattr(saf, "sglang_package_dir", lambda: tmp_path / "nowhere")
        assert "could not be read" in saf.server_args_fields().source
    finally:
        saf.server_args_fields.cache_clear()


def test_snapshot_holds_the_0_5_23_fields_we_rely_on():
    from verl_sglang._server_args_snapshot import FIELDS

    assert len(FIELDS) == len(set(FIELDS)) == 546
    for name in (
        "model_path",
        "skip_tokenizer_init",
        "mem_fraction_static",
        "cuda_graph_bs_decode",
        "enable_weights_cpu_backup",
    ):
        assert name in FIELDS
    assert "cuda_graph_bs" not in FIELDS  # renamed in 0.5.2x


def test_options_class_from_a_field_set():
    fields = saf.ServerArgsFields(("alpha", "tp_size", "_bookkeeping", "log_level", "beta"), "test fields", None)
    cls = make_options_class(fields)
    assert cls.passthrough == ("alpha", "beta") and cls.set_by_plugin == ("tp_size",)
    opts = cls(alpha=3)
    assert passthrough_arguments(opts) == {"alpha": 3}
    assert not hasattr(opts, "_bookkeeping") and "test fields" in cls.__doc__
    with pytest.raises(ValueError, match="tensor_model_parallel_size"):
        cls(tp_size=2)


def _structure(raw):
    return structure_options(SGLangRolloutOptions, raw, KEY, "sglang")


def test_config_load_passes_server_args_fields_through():
    opts = _structure({"chunked_prefill_size": 512, "enable_deterministic_inference": True, "log_level": "info"})
    assert passthrough_arguments(opts) == {"chunked_prefill_size": 512, "enable_deterministic_inference": True}
    assert (opts.log_level, opts.enable_weights_cpu_backup, opts.port) == ("info", True, None)


def test_config_load_refuses_typos_plugin_keys_and_bad_values():
    with pytest.raises(ConfigError, match=rf"Did you mean '{KEY}.mem_fraction_static'"):
        _structure({"mem_fraction_statc": 0.3})
    for key, value in (
        ("mem_fraction_static", 0.3),
        ("tp_size", 2),
        ("skip_tokenizer_init", False),
        ("model_path", "/x"),
    ):
        with pytest.raises(ConfigError, match=f"engine_kwargs.sglang.{key} is set by rollout engine 'sglang'"):
            _structure({key: value})
    with pytest.raises(ConfigError, match=r"set actor_rollout_ref\.rollout\.gpu_memory_utilization instead"):
        _structure({"mem_fraction_static": 0.3})
    with pytest.raises(ConfigError, match=r"skip_tokenizer_init is set by rollout engine 'sglang' \(always true"):
        _structure({"skip_tokenizer_init": False})
    with pytest.raises(ConfigError, match="log_level='loud'"):
        _structure({"log_level": "loud"})
    with pytest.raises(ConfigError, match="TCP port"):
        _structure({"port": 70000})


def test_every_plugin_set_key_names_where_to_set_it():
    assert set(SGLangRolloutOptions.set_by_plugin) <= set(SET_BY)
    for name in SGLangRolloutOptions.set_by_plugin:
        assert SET_BY[name].startswith(("from ", "(", "always")), name
