"""The ``sglang`` spec as core sees it: availability messages, ``verl plugins``, one clear error when selected
where it cannot run, and a cheap import."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
from verl_sglang import backend

INSTALLED = any(ep.value == "verl_sglang.plugin" for ep in importlib.metadata.entry_points(group="verl.plugins"))
needs_entry_point = pytest.mark.skipif(
    not INSTALLED, reason="verl-sglang is not installed in this venv (pip install -e ./plugins/verl-sglang --no-deps)"
)


def _only(present):
    return lambda name: name in present


@pytest.mark.parametrize(
    ("present", "expected"),
    [
        (set(), "SGLang is not installed: pip install './plugins/verl-sglang[cuda]'"),
        ({"sglang"}, "sgl_kernel missing: needs a CUDA GPU (pip install './plugins/verl-sglang[cuda]'"),
        ({"sglang", "torch_npu"}, "sgl_kernel missing: needs a CUDA GPU"),  # torch_npu without sgl_kernel_npu
        ({"sglang", "sgl_kernel"}, True),
        ({"sglang", "sglang_kernel"}, True),
        ({"sglang", "torch_npu", "sgl_kernel_npu"}, True),
    ],
)
def test_available_says_what_is_missing(monkeypatch, present, expected):
    monkeypatch.setattr(backend, "_found", _only(present))
    result = backend.sglang_available()
    if expected is True:
        assert result is True
    else:
        assert isinstance(result, str) and result.startswith(expected), result


def test_device_helpers():
    assert [backend.device_type(d) for d in ("cuda:1", "npu", "cpu")] == ["cuda", "npu", "cpu"]
    assert [backend.device_index(d) for d in ("cuda:3", "cuda", "npu:1")] == [3, None, 1]
    import torch

    assert backend.device_index(torch.device("cuda", 2)) == 2
    with pytest.raises(backend.UnsupportedDeviceError, match="supports: cuda, npu"):
        backend.device_type("mps")


def test_spec_declares_devices_capabilities_and_checks():
    from verl_sglang.plugin import verl_rollout_engines

    [spec] = verl_rollout_engines()
    assert (spec.name, spec.devices, set(spec.capabilities)) == ("sglang", ("cuda", "npu"), {"tensor_parallel"})
    assert spec.options_cls.__name__ == "SGLangRolloutOptions" and spec.check_config is not None


def test_importing_the_plugin_loads_neither_torch_nor_sglang():
    code = (
        "import sys, verl_sglang, verl_sglang.plugin; verl_sglang.plugin.verl_rollout_engines(); "
        "print(sorted(m for m in ('torch', 'sglang') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@needs_entry_point
def test_verl_plugins_lists_sglang_as_not_usable_with_the_reason(capsys, monkeypatch):
    from verl.cli.main import main
    from verl.plugins import reset_plugin_manager

    monkeypatch.setattr(backend, "_found", _only({"sglang"}))  # the sglang test venv's state, anywhere
    reset_plugin_manager()
    try:
        assert main(["plugins"]) == 0
    finally:
        reset_plugin_manager()
    # The rollout_engine table's row: NAME PLUGIN DISTRIBUTION USABLE WHY.
    line = next(
        ln for ln in capsys.readouterr().out.splitlines() if ln.split()[:3] == ["sglang", "sglang", "verl-sglang"]
    )
    assert " no " in line and "sgl_kernel missing: needs a CUDA GPU" in line


@needs_entry_point
def test_selecting_sglang_here_gives_one_clear_error(capsys, monkeypatch):
    from verl.cli.main import main
    from verl.plugins import reset_plugin_manager

    monkeypatch.setattr(backend, "_found", _only(set()))
    reset_plugin_manager()
    try:
        code = main(["config", "show", "actor_rollout_ref.rollout.name=sglang"])
    finally:
        reset_plugin_manager()
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert code != 0 and len(errors) == 1, err
    assert "rollout engine 'sglang' is installed but cannot run here: SGLang is not installed" in errors[0]
