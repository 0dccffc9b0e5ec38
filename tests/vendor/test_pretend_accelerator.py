"""The worked example of docs/platform-vendors.md: ``examples/pretend-accelerator`` as a vendor ships it.

The plugin (``verl-pretend-accelerator``, platform ``pretend``) is discovered through its entry point by the
process-wide plugin manager of a ``verl`` subprocess (pip-installed, or the stand-in install of conftest.py),
and trains 2 steps with core's engines selected by its own name. Expected values are written by hand from
the platform's documented behaviour (``VERL_PRETEND_DEVICES``, ``PRETEND_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from verl.testing.workspace import make_gsm8k_workspace


@pytest.fixture
def pretend(monkeypatch, pretend_site):
    """The example's ``verl_pretend.platform`` module, importable in this process (its src on ``sys.path``,
    but not the stand-in dist-info: this process's plugin manager keeps seeing only what is installed)."""
    monkeypatch.delenv("VERL_PRETEND_DEVICES", raising=False)
    monkeypatch.delenv("PRETEND_VISIBLE_DEVICES", raising=False)
    for entry in pretend_site:
        if not entry.endswith("dist-info") and Path(entry).name == "src":
            monkeypatch.syspath_prepend(entry)
    import verl_pretend.platform as module

    return module


def _verl(*argv: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "verl.cli.main", *argv], capture_output=True, text=True, env=env, timeout=timeout
    )


# ------------------------------------------------------------------------------------------- the class itself


def test_probe_no_without_the_variable_names_the_fix(pretend):
    answer = pretend.PretendPlatform.probe()
    assert not answer
    assert answer.reason == "VERL_PRETEND_DEVICES is not set; export VERL_PRETEND_DEVICES=<n> to pretend n devices"


@pytest.mark.parametrize(
    ("count", "visible", "available", "reason"),
    [
        ("3", None, True, "3 pretend device(s) in host memory"),
        ("0", None, False, "VERL_PRETEND_DEVICES=0: no pretend devices; set it to 1 or more"),
        (
            "two",
            None,
            False,
            "VERL_PRETEND_DEVICES='two' is not an integer; set it to the number of pretend devices, e.g. 2",
        ),
        ("4", "1,3", True, "2 of 4 pretend device(s) visible (PRETEND_VISIBLE_DEVICES=1,3)"),
        (
            "2",
            "0,5",
            False,
            "PRETEND_VISIBLE_DEVICES='0,5' names device(s) [5] outside [0, 2) (VERL_PRETEND_DEVICES=2)",
        ),
        ("2", "", False, "PRETEND_VISIBLE_DEVICES is empty: this process sees none of the 2 pretend device(s)"),
        ("2", "a", False, "PRETEND_VISIBLE_DEVICES='a' is not a comma-separated list of device indices, e.g. 0,1"),
    ],
)
def test_probe_answers_and_never_raises(pretend, monkeypatch, count, visible, available, reason):
    monkeypatch.setenv("VERL_PRETEND_DEVICES", count)
    if visible is not None:
        monkeypatch.setenv("PRETEND_VISIBLE_DEVICES", visible)
    answer = pretend.PretendPlatform.probe()
    assert (answer.available, answer.reason) == (available, reason)


def test_device_facts_follow_the_visible_devices(pretend, monkeypatch):
    import torch

    monkeypatch.setenv("VERL_PRETEND_DEVICES", "4")
    monkeypatch.setenv("PRETEND_VISIBLE_DEVICES", "1,3")
    platform = pretend.PretendPlatform()
    assert (platform.name, platform.device_type, platform.dist_backend) == ("pretend", "cpu", "gloo")
    assert platform.device_count() == 2
    assert platform.current_device() == 0
    platform.set_device(1)
    assert platform.current_device() == 1
    assert platform.device_name() == "Pretend Accelerator #3 (host memory)"  # visible index 1 = physical 3
    assert platform.device_name(0) == "Pretend Accelerator #1 (host memory)"
    assert platform.torch_device() == torch.device("cpu")
    with pytest.raises(
        ValueError,
        match=r"pretend device index 2 is out of range: 2 device\(s\) visible "
        r"\(PRETEND_VISIBLE_DEVICES='1,3'\)",
    ):
        platform.set_device(2)
    with pytest.raises(TypeError, match="device index must be an int"):
        platform.set_device("0")
    stats = platform.memory_stats()
    assert set(stats) == {"allocated_bytes", "reserved_bytes", "max_allocated_bytes", "max_reserved_bytes"}
    assert 0 < stats["allocated_bytes"] <= stats["max_allocated_bytes"]


def test_seeding_reproduces_host_random_streams(pretend, monkeypatch):
    import random

    import numpy as np
    import torch

    monkeypatch.setenv("VERL_PRETEND_DEVICES", "1")
    platform = pretend.PretendPlatform()
    draws = []
    for _ in range(2):
        platform.manual_seed(1234)
        draws.append((random.random(), float(np.random.rand()), torch.rand(3).tolist()))
    assert draws[0] == draws[1]


def test_ray_workers_reserve_the_custom_resource(pretend, monkeypatch):
    """The pool asks Ray for ``PRETEND`` (one per worker), which a run must declare (see the platform docstring)."""
    pytest.importorskip("ray")
    from verl.controller.ray import RayResourcePool

    monkeypatch.setenv("VERL_PRETEND_DEVICES", "2")
    pool = RayResourcePool([2], platform=pretend.PretendPlatform())
    assert pool.bundle() == {"PRETEND": 1.0, "CPU": 1.0}
    assert pool.actor_options() == {"num_cpus": 1.0, "resources": {"PRETEND": 1.0}}


# ------------------------------------------------------------------------------ through the installed plugin


def test_verl_plugins_lists_pretend_usable_and_chooses_it(pretend_env):
    listing = _verl("plugins", "--json", env=pretend_env(devices=2))
    assert listing.returncode == 0, listing.stderr
    report = json.loads(listing.stdout)
    assert report["failures"] == []
    (plugin,) = [p for p in report["plugins"] if p["distribution"] == "verl-pretend-accelerator"]
    assert (plugin["module"], plugin["provides"]) == ("verl_pretend.plugin", {"platform": ["pretend"]})
    (spec,) = [s for s in report["specs"]["platform"] if s["name"] == "pretend"]
    assert (spec["usable"], spec["accelerator"], spec["reason"]) == (True, True, "2 pretend device(s) in host memory")
    # The only accelerator answering yes on a CPU machine: the automatic choice.
    assert report["platform"] == {"name": "pretend", "device_type": "cpu", "error": None}

    text = _verl("plugins", env=pretend_env(devices=2))
    assert text.returncode == 0, text.stderr
    assert "Platform of this machine (automatic choice): pretend" in text.stdout


def test_verl_plugins_without_the_device(pretend_env):
    listing = _verl("plugins", "--json", env=pretend_env(devices=None))
    assert listing.returncode == 0, listing.stderr
    report = json.loads(listing.stdout)
    (spec,) = [s for s in report["specs"]["platform"] if s["name"] == "pretend"]
    assert spec["usable"] is False
    assert "export VERL_PRETEND_DEVICES=<n>" in spec["reason"]
    if report["platform"]["name"] != "cuda":  # a GPU machine resolves to cuda; a CPU one falls back
        assert report["platform"]["name"] == "cpu"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    return make_gsm8k_workspace(tmp_path_factory.mktemp("pretend"), train=4, test=2)


def _train_args(ws: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--run-dir",
        str(run_dir),
        f"data.train_files=[{ws['train']}]",
        f"data.val_files=[{ws['test']}]",
        "data.max_prompt_length=320",
        "data.max_response_length=8",
        "data.train_batch_size=2",
        f"actor_rollout_ref.model.path={ws['model']}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.rollout.n=2",
        f"custom_reward_function.path={ws['reward']}",
        "trainer.total_training_steps=2",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[console,file]",
        *extra,
    ]


def test_trains_two_steps_with_core_engines_selected_by_name(pretend_env, workspace, tmp_path):
    """``trainer.device=pretend`` with the reference actor, hf rollout and colocated weight sync, in a subprocess."""
    run_dir = tmp_path / "run"
    args = _train_args(
        workspace,
        run_dir,
        "trainer.device=pretend",
        "actor_rollout_ref.actor.strategy=reference",
        "actor_rollout_ref.rollout.name=hf",
        "trainer.controller=local",
    )
    done = _verl(*args, env=pretend_env(devices=2))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["step"] > 0] == [1, 2]
    assert "verl train: done, 2 steps" in done.stdout + done.stderr
    assert "device: pretend" in (run_dir / "config.yaml").read_text()
    # The start-up lines name the platform, its plugin and why, and core's engines.
    out = done.stdout + done.stderr
    assert (
        "verl train: platform: pretend (device type cpu) [verl-pretend-accelerator 0.1.0]: named by "
        "trainer.device; probe: 2 pretend device(s) in host memory"
    ) in out
    for line in (
        "verl train: actor: training engine reference [verl-core ",
        "verl train: rollout: rollout engine hf [verl-core ",
        "verl train: checkpoint: checkpoint engine colocated [verl-core ",
    ):
        assert line in out, line


def test_named_but_absent_device_is_refused_with_the_probe_reason(pretend_env, workspace, tmp_path):
    done = _verl(*_train_args(workspace, tmp_path / "run", "trainer.device=pretend"), env=pretend_env(devices=None))
    assert done.returncode != 0
    assert "device 'pretend' requested but not available" in done.stderr
    assert "VERL_PRETEND_DEVICES is not set" in done.stderr


@pytest.mark.slow
def test_ray_run_declares_the_custom_resource(pretend_env, workspace, tmp_path):
    """With ``trainer.controller=ray`` the worker reserves ``PRETEND``, declared through ``ray_kwargs.ray_init``."""
    pytest.importorskip("ray")
    run_dir = tmp_path / "run"
    extra = ("trainer.device=pretend", "trainer.controller=ray", "ray_kwargs.ray_init.resources={PRETEND: 1}")
    done = _verl(*_train_args(workspace, run_dir, *extra), env=pretend_env(devices=1))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["step"] > 0] == [1, 2]


def _kit(env: dict[str, str]) -> subprocess.CompletedProcess:
    # A fresh pytest: the kit gets the platform from the process-wide plugin manager, which must see the plugin
    # (this process's manager must not: other tests count the installed plugins).
    kit = Path(__file__).resolve().parents[2] / "examples" / "pretend-accelerator" / "tests"
    return subprocess.run(
        [sys.executable, "-m", "pytest", str(kit), "-q", "-rs", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_platform_kit_passes_on_pretend(pretend_env):
    """verl.testing.conformance.PlatformTests on ``pretend`` with 2 devices: every test runs and passes."""
    done = _kit(pretend_env(devices=2))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "skipped" not in summary and "failed" not in summary, done.stdout[-3000:]


def test_platform_kit_without_the_device_skips_with_the_probe_reason(pretend_env):
    done = _kit(pretend_env(devices=None))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "platform 'pretend' is not available here: VERL_PRETEND_DEVICES is not set" in done.stdout
    assert "2 passed" in done.stdout.strip().splitlines()[-1]  # the two probe tests run anyway
