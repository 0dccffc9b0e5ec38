"""``verl plugins`` and ``verl config show`` with the plugin installed and TensorRT-LLM absent (the real CLI)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorrt_llm") is not None, reason="TensorRT-LLM is installed: the engine is usable"
)
INSTALL = "pip install --extra-index-url https://pypi.nvidia.com './plugins/verl-trtllm[cuda]'"


def _verl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verl.cli.main", *args], capture_output=True, text=True, timeout=300)


def test_verl_plugins_lists_trtllm_as_not_usable_with_the_install_command():
    done = _verl("plugins", "--json")
    assert done.returncode == 0, done.stderr
    rows = [s for s in json.loads(done.stdout)["specs"]["rollout_engine"] if s["name"] == "trtllm"]
    assert len(rows) == 1 and rows[0]["distribution"] == "verl-trtllm" and rows[0]["usable"] is False
    assert INSTALL in rows[0]["reason"] and rows[0]["devices"] == ["cuda"]


def test_selecting_trtllm_is_one_config_error():
    done = _verl("config", "show", "actor_rollout_ref.rollout.name=trtllm", "trainer.device=cuda")
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2, done.stderr
    assert len(errors) == 1 and "rollout engine 'trtllm' is installed but cannot run here" in errors[0]
    assert INSTALL in errors[0]
