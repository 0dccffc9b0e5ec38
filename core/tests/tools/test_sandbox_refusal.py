"""When no box can be built, the code interpreter refuses to run (at construction, and ``verl train`` before any
model loads) with an error naming what is missing and the fixes; ``isolation: unsafe_none`` opts out by name;
``verl train`` prints the isolation in force.

A missing ``bwrap`` is made real by an empty ``PATH``; a refused ``unshare`` by a stand-in for
``_sandbox_ns.py`` that fails the way the kernel's refusal reaches the real child (the probe, the child's
report and the error text are the real ones); the sysctls by a stand-in ``/proc/sys`` tree.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
from pathlib import Path

import pytest
import yaml

import verl.tools
from verl.cli.main import main
from verl.tools import _box_launch, _box_layout, _sandbox_ns, code_interpreter, isolation
from verl.tools.code_interpreter import CodeInterpreterTool
from verl.tools.config import describe_isolation, load_tools
from verl.tools.isolation import IsolationUnavailableError, diagnose_user_namespaces, resolve_isolation

CONFIGS = Path(verl.tools.__file__).with_name("configs")
REFUSED_NS = """
class BoxError(OSError):
    pass


def unavailable_reason():
    return None


def enter(layout, uid, gid, report_failure):
    raise BoxError(1, "unshare(CLONE_NEWNS|CLONE_NEWPID|CLONE_NEWNET|CLONE_NEWIPC|CLONE_NEWUTS): Operation not permitted")


def join_session_keyring():
    return False
"""


@pytest.fixture
def fresh_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation, "_cache", {})


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh_probes: None) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


@pytest.fixture
def refused_unshare(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh_probes: None) -> None:
    stand_in = tmp_path / "_sandbox_ns.py"
    stand_in.write_text(REFUSED_NS)
    monkeypatch.setattr(_box_launch, "NS", stand_in)
    proc_sys = tmp_path / "proc-sys"
    (proc_sys / "user").mkdir(parents=True)
    (proc_sys / "user" / "max_user_namespaces").write_text("0\n")
    monkeypatch.setattr(isolation, "_PROC_SYS", str(proc_sys))


def test_missing_bwrap_is_named_with_the_package_to_install(no_bwrap):
    with pytest.raises(IsolationUnavailableError) as err:
        resolve_isolation("bubblewrap", None)
    text = str(err.value)
    assert "cannot isolate model-written code on this machine (isolation: bubblewrap)" in text
    assert "bubblewrap: bwrap not found on PATH (install bubblewrap: apt-get install bubblewrap" in text
    assert "isolation: unsafe_none" in text and "SandboxFusionTool" in text


@pytest.mark.skipif(_sandbox_ns.unavailable_reason() is not None, reason="namespaces box unavailable on this arch")
def test_refused_unshare_is_named_with_the_sysctl_that_refuses_it(refused_unshare):
    with pytest.raises(IsolationUnavailableError) as err:
        resolve_isolation("namespaces", None)
    text = str(err.value)
    assert "namespaces: SandboxSetupError: the code interpreter's box could not be set up, nothing ran: " in text
    assert "unshare(CLONE_NEWNS|CLONE_NEWPID|CLONE_NEWNET|CLONE_NEWIPC|CLONE_NEWUTS): Operation not permitted" in text
    assert "user namespaces are disabled by user.max_user_namespaces = 0: sysctl -w user.max_user_namespaces" in text


@pytest.mark.skipif(_sandbox_ns.unavailable_reason() is not None, reason="namespaces box unavailable on this arch")
def test_auto_with_neither_box_refuses_at_construction_naming_both(no_bwrap, refused_unshare):
    with pytest.raises(IsolationUnavailableError) as err:
        CodeInterpreterTool({"timeout": 5})
    lines = str(err.value).splitlines()
    assert lines[0] == "code_interpreter: cannot isolate model-written code on this machine (isolation: auto):"
    assert lines[1].startswith("  - bubblewrap: bwrap not found on PATH")
    assert lines[2].startswith("  - namespaces: SandboxSetupError: ") and "max_user_namespaces = 0" in lines[2]
    with pytest.raises(ValueError, match=r"tools\[0\] \(CodeInterpreterTool\): IsolationUnavailableError: "):
        load_tools(CONFIGS / "code_interpreter_config.yaml")


def _tool_file(tmp_path: Path, **config) -> Path:
    path = tmp_path / "tools.yaml"
    entry = {"class_name": "verl.tools.code_interpreter.CodeInterpreterTool", "config": {"type": "native", **config}}
    path.write_text(yaml.safe_dump({"tools": [entry]}))
    return path


def _train(tmp_path: Path, capsys: pytest.CaptureFixture, tools: Path) -> tuple[int, list[str], str]:
    missing = tmp_path / "no-such-train.parquet"  # the run stops at data loading, after the printout
    rc = main(
        [
            "train",
            "--run-dir",
            str(tmp_path / "run"),
            f"data.train_files=[{missing}]",
            "actor_rollout_ref.rollout.mode=async",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        ]
    )
    out, err = capsys.readouterr()
    return rc, [line for line in out.splitlines() if line.startswith("verl train: ")], err


@pytest.mark.skipif(_sandbox_ns.unavailable_reason() is not None, reason="namespaces box unavailable on this arch")
def test_verl_train_refuses_before_building_anything(no_bwrap, refused_unshare, tmp_path, capsys):
    rc, lines, err = _train(tmp_path, capsys, _tool_file(tmp_path))
    assert rc == 2
    assert "actor_rollout_ref.rollout.multi_turn.tool_config_path" in err
    assert "cannot isolate model-written code on this machine (isolation: auto)" in err
    assert "bwrap not found on PATH" in err and "max_user_namespaces = 0" in err
    assert not any("platform:" in line or "rollout engine" in line for line in lines)  # nothing was built


def test_verl_train_prints_the_isolation_in_force(tmp_path, capsys):
    rc, lines, _ = _train(tmp_path, capsys, _tool_file(tmp_path, isolation="unsafe_none"))
    assert rc == 2  # the missing train file, after the printout
    assert (
        "verl train: code_interpreter: isolation unsafe_none: NO box, model-written code runs as the trainer's "
        "user and can read and write what the trainer can (opted out in the tool config)"
    ) in lines
    try:
        expected = resolve_isolation("auto", None).describe()
    except IsolationUnavailableError:
        return
    rc, lines, _ = _train(tmp_path, capsys, CONFIGS / "code_interpreter_config.yaml")
    assert f"verl train: code_interpreter: {expected}" in lines
    assert expected.startswith(("isolation bubblewrap: bubblewrap (", "isolation namespaces: kernel namespaces;"))


def test_unsafe_none_runs_says_so_and_warns_once(monkeypatch, caplog, no_bwrap, tmp_path):
    monkeypatch.setattr(code_interpreter, "_LOGGED", set())
    with caplog.at_level(logging.WARNING, logger="verl.tools.code_interpreter"):
        tool = CodeInterpreterTool({"timeout": 5, "isolation": "unsafe_none"})
        CodeInterpreterTool({"timeout": 5, "isolation": "unsafe_none"})
    assert [r.getMessage() for r in caplog.records] == [f"code_interpreter: {tool.isolation.describe()}"]
    response, _, metrics = asyncio.run(tool.execute("i", {"code": "print(6 * 7)"}))
    assert response.text == "42\n"
    assert metrics["protections"]["isolation"] == "unsafe_none"
    assert metrics["protections"]["skipped"]["box"].startswith("isolation: unsafe_none")
    assert describe_isolation(_tool_file(tmp_path, isolation="unsafe_none")) == [
        f"code_interpreter: {tool.isolation.describe()}"
    ]


def test_an_architecture_without_known_syscall_numbers_is_refused(monkeypatch, fresh_probes):
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    reason = _sandbox_ns.unavailable_reason()
    assert reason.startswith("the namespaces box knows the system call numbers of ['aarch64', 'x86_64'] only")
    assert "this machine is riscv64 (install bubblewrap instead)" in reason
    with pytest.raises(IsolationUnavailableError, match="riscv64"):
        resolve_isolation("namespaces", None)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("user/max_user_namespaces", "0", "user.max_user_namespaces = 0: sysctl -w user.max_user_namespaces=15000"),
        ("kernel/unprivileged_userns_clone", "0", "kernel.unprivileged_userns_clone = 0: sysctl -w"),
        ("kernel/apparmor_restrict_unprivileged_userns", "1", "apparmor_restrict_unprivileged_userns = 1 (AppArmor)"),
    ],
)
def test_diagnose_user_namespaces_names_each_sysctl(tmp_path, name, value, expected):
    (tmp_path / name).parent.mkdir(parents=True)
    (tmp_path / name).write_text(value + "\n")
    (found,) = diagnose_user_namespaces(str(tmp_path))
    assert found.startswith("user namespaces are disabled by ") and expected in found
    (tmp_path / name).write_text("15000\n" if "max" in name else ("1\n" if value == "0" else "0\n"))
    assert diagnose_user_namespaces(str(tmp_path)) == []


def test_a_folder_the_box_uid_cannot_enter_is_named(call_root):
    private = call_root / "private"  # call_root: a folder every user may enter
    (private / "python").mkdir(parents=True)
    private.chmod(0o700)
    owner = private.stat().st_uid
    uid = 65534 if owner != 65534 else 65533
    blocked = _box_layout.unreachable_by(uid, uid, str(private / "python"))
    assert blocked == f"{private} (mode 0700, owner uid {owner})"
    private.chmod(0o711)
    assert _box_layout.unreachable_by(uid, uid, str(private / "python")) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="as root only: the box then starts as uid 65534")
def test_bubblewrap_as_root_names_an_interpreter_the_box_uid_cannot_reach(fresh_probes):
    interpreter = _box_layout.trainer_interpreter()
    blocked = [r for r in interpreter.roots if _box_layout.unreachable_by(65534, 65534, r)]
    if not blocked or _box_launch.shutil.which("bwrap") is None:
        pytest.skip("the trainer's interpreter is reachable by uid 65534 here (or no bwrap)")
    with pytest.raises(IsolationUnavailableError) as err:
        resolve_isolation("bubblewrap", None)
    assert f"so the box starts as uid 65534, which cannot reach {blocked[0]}" in str(err.value)
    assert "set the tool's config.python to an interpreter installed where every user can read it" in str(err.value)
