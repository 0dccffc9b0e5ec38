"""``verl config show``: resolved YAML on stdout (exit 0) or the config error on stderr (exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import verl.config.backend_options as backend_options
from verl.cli.main import main
from verl.config import load_config
from verl.config.yaml_io import load_yaml


class _AnyBackend:
    """Accepts every backend name, with no options (keeps these tests independent of installed plugins)."""

    def available(self, kind: str) -> dict:
        return {"any": None}

    def get(self, kind: str, name: str) -> SimpleNamespace:
        return SimpleNamespace(
            name=name, options_cls=None, devices=(), capabilities=frozenset({"data_parallel", "tensor_parallel"})
        )


class _AnyAlgorithm:
    @staticmethod
    def get_adv_estimator_fn(name: str) -> object:
        return len

    @staticmethod
    def get_policy_loss_fn(name: str) -> object:
        return len


@pytest.fixture(autouse=True)
def _isolated_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_options, "default_plugin_manager", lambda: _AnyBackend())
    monkeypatch.setattr(backend_options, "default_algorithm_registry", lambda: _AnyAlgorithm)


def test_show_schema_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--schema-defaults"]) == 0
    out = capsys.readouterr()
    tree = load_yaml(out.out)
    assert tree["actor_rollout_ref"]["rollout"]["name"] == "hf"
    assert tree["actor_rollout_ref"]["rollout"]["prompt_length"] == 512  # resolved from data.max_prompt_length
    assert tree["trainer"]["logger"] == ["console"]


def test_show_without_file_is_what_verl_train_runs(capsys: pytest.CaptureFixture[str]) -> None:
    # The embedded GSM8K / SmolLM2 CPU config (examples/gsm8k_grpo_smollm2_cpu.yaml).
    assert main(["config", "show"]) == 0
    tree = load_yaml(capsys.readouterr().out)
    assert tree["algorithm"]["adv_estimator"] == "grpo"
    assert tree["actor_rollout_ref"]["rollout"]["prompt_length"] == 256
    assert tree["actor_rollout_ref"]["model"]["path"] == "smollm2-135m-instruct"


def test_show_file_and_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("data:\n  train_batch_size: 16\nactor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 8\n")
    code = main(["config", "show", str(path), "actor_rollout_ref.rollout.n=4", "+algorithm.adv_estimator=grpo"])
    out = capsys.readouterr()
    assert code == 0, out.err
    shown = out.out
    dumped = tmp_path / "shown.yaml"
    dumped.write_text(shown)
    cfg = load_config(dumped)
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n, cfg.algorithm.adv_estimator) == (16, 4, "grpo")
    assert cfg == load_config(path, ["actor_rollout_ref.rollout.n=4", "algorithm.adv_estimator=grpo"])


def test_unknown_key_exits_2_with_message_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "algorithm.kl_ctrl.kl_coeff=0.5"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert "algorithm.kl_ctrl.kl_coeff" in out.err and "algorithm.kl_ctrl.kl_coef'" in out.err
    assert "Traceback" not in out.err


def test_validation_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "config",
            "show",
            "--schema-defaults",
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        ]
    )
    assert code == 2
    assert "mini-batch per GPU (2) must be >= and a multiple of micro-batch per GPU (4)" in capsys.readouterr().err


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", str(tmp_path / "absent.yaml")]) == 2
    assert "absent.yaml" in capsys.readouterr().err


def test_warnings_go_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["config", "show", "algorithm.use_kl_in_reward=true", "actor_rollout_ref.actor.use_kl_loss=true"])
    out = capsys.readouterr()
    assert code == 0
    assert out.err.startswith("warning: algorithm.use_kl_in_reward:")
    assert "warning" not in out.out


def test_bad_override_after_the_file_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "data.shuffle=true", "not-an-override"]) == 2
    assert "not of the form key=value" in capsys.readouterr().err


def test_real_process_prints_no_traceback() -> None:
    # Fails at the key check, before any plugin is consulted, so it does not depend on installed plugins.
    proc = subprocess.run(
        [sys.executable, "-m", "verl.cli.main", "config", "show", "+actor_rollout_ref.actor.ppo_epoch=4"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "actor_rollout_ref.actor.ppo_epochs" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_show_prints_the_resolved_rollout_dtype_and_layout(capsys: pytest.CaptureFixture[str]) -> None:
    """rollout.dtype auto resolves per device (float32 on this CPU); the summary is YAML comments."""
    args = [
        "trainer.device=cpu",
        "trainer.controller=ray",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.strategy=fsdp",
    ]
    assert main(["config", "show", "--schema-defaults", *args]) == 0
    out = capsys.readouterr().out
    assert load_yaml(out)["actor_rollout_ref"]["rollout"]["dtype"] == "auto"
    assert "#   actor_rollout_ref.rollout.dtype: float32  # from 'auto'" in out
    assert "#   rollout world: 2 ranks = 2 replicas x tensor_model_parallel_size 1" in out
    assert "#   actor_rollout_ref.rollout.placement: hybrid" in out
    assert "# resolved on this machine (platform cpu):" in out
    assert main(["config", "show", "--schema-defaults", "trainer.device=cpu"]) == 0  # reference + hf: shared module
    assert (
        "rollout.dtype: the trainer's (the hf rollout shares its module; 'auto' would be float32)"
        in capsys.readouterr().out
    )
