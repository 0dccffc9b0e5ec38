"""The probe's steps against FIXTURE trees laid out like a CANN install (``ascend_toolkit_install.info``),
plain files standing in for ``/dev/davinci<N>``, a shell script standing in for ``npu-smi`` and a stand-in
``torch_npu`` package for the child step. They test parsing and the order of the steps, not NPU support."""

from __future__ import annotations

import sys
from pathlib import Path

import attrs
from verl_npu.cann import find_ascend_home, read_cann, set_env_hint
from verl_npu.probe import check_cann, check_devices, check_import, check_package, run_probe
from verl_npu.smi import find_npu_smi, parse_board_software_version, parse_npu_smi_info


def smi_calls(roots) -> list[str]:
    log = Path(roots.npu_smi).parent / "npu-smi.log"
    return log.read_text().splitlines() if log.exists() else []


# ---------------------------------------------------------------- parsers (recorded-looking text)


def test_fixture_npu_smi_info_parsing(fx):
    info = parse_npu_smi_info(fx.NPU_SMI_INFO)
    assert info.version == "25.3.rc1"
    # chip rows (id only), the header row and the process table (whose rows start with an id) are not NPUs
    assert info.npus == ((0, "910B3", "OK"), (1, "910B3", "Warning"))
    assert parse_npu_smi_info("npu-smi: command not found\n") == type(info)(None, ())


def test_fixture_board_software_version_parsing(fx):
    assert parse_board_software_version(fx.NPU_SMI_BOARD) == "25.3.rc1.2"
    assert parse_board_software_version("NPU ID : 0\n") is None


def test_fixture_cann_home_and_version(tmp_path, cann_tree):
    assert find_ascend_home({}) == ("/usr/local/Ascend/ascend-toolkit/latest", "default")
    assert find_ascend_home({"ASCEND_TOOLKIT_HOME": "/opt/t"}) == ("/opt/t", "ASCEND_TOOLKIT_HOME")
    assert find_ascend_home({"ASCEND_HOME_PATH": "/opt/a", "ASCEND_TOOLKIT_HOME": "/opt/t"}) == (
        "/opt/a",
        "ASCEND_HOME_PATH",
    )
    assert (
        set_env_hint("/usr/local/Ascend/ascend-toolkit/latest") == "source /usr/local/Ascend/ascend-toolkit/set_env.sh"
    )
    roots = cann_tree(version="8.3.RC1")
    cann = read_cann(roots.ascend_home, "x86_64")
    assert cann.version == "8.3.RC1" and cann.info_file.endswith("latest/x86_64-linux/ascend_toolkit_install.info")
    other_arch = read_cann(roots.ascend_home, "aarch64")
    assert (
        other_arch.version is None
        and other_arch.problem.startswith("cannot read ")
        and "aarch64-linux" in other_arch.problem
    )
    assert read_cann(str(tmp_path / "nope"), "x86_64").problem == f"no CANN toolkit at {tmp_path / 'nope'}"
    Path(cann.info_file).write_text("package_name=Ascend-cann-toolkit\nversion=\n")
    assert read_cann(roots.ascend_home, "x86_64").problem.endswith("has no version= line")


def test_fixture_npu_smi_is_found_on_path_or_in_the_driver_folder(tmp_path, fx):
    smi = fx.write_executable(tmp_path / "bin" / "npu-smi", "#!/bin/sh\n")
    assert find_npu_smi({"PATH": str(tmp_path / "bin")}) == str(smi)
    assert find_npu_smi({"PATH": str(tmp_path / "empty")}) in (
        None,
        "/usr/local/sbin/npu-smi",
        "/usr/local/bin/npu-smi",
    )


# ---------------------------------------------------------------- steps on fixture trees


def test_fixture_cann_step(cann_tree):
    assert check_cann(cann_tree()).facts["cann_version"] == "8.3.RC1"
    missing = check_cann(cann_tree(version=None))
    assert not missing.ok
    assert missing.reason.startswith("CANN toolkit not found (cannot read ")
    assert "looked at ASCEND_HOME_PATH=" in missing.reason and "ascend-toolkit/set_env.sh" in missing.reason


def test_fixture_device_nodes_answer_without_npu_smi(cann_tree):
    roots = cann_tree(nodes=("davinci0", "davinci1", "davinci7"))
    step = check_devices(roots)
    assert step.ok and step.facts["device_nodes"] == ["davinci0", "davinci1", "davinci7"]
    assert smi_calls(roots) == []  # nodes are enough: npu-smi is not asked


def test_fixture_npu_smi_answers_when_there_are_no_nodes(cann_tree):
    roots = cann_tree(nodes=())  # davinci_manager etc. are present but are not devices
    step = check_devices(roots)
    assert step.ok and step.reason == "npu-smi 25.3.rc1 lists 2 NPU(s)"
    assert step.facts == {"npu_smi_version": "25.3.rc1", "npus": [(0, "910B3", "OK"), (1, "910B3", "Warning")]}
    assert smi_calls(roots) == ["info"]


def test_fixture_npu_smi_failing_or_empty_is_a_no(cann_tree, tmp_path, fx):
    failing = check_devices(cann_tree(nodes=(), rc=3))
    assert not failing.ok and "exited 3: dcmi model initialized failed" in failing.reason
    assert "install the Ascend driver" in failing.reason
    empty = check_devices(
        attrs.evolve(
            cann_tree(nodes=()), npu_smi=str(fx.write_executable(tmp_path / "e" / "npu-smi", "#!/bin/sh\necho hello\n"))
        )
    )
    assert not empty.ok and "`npu-smi info` lists no NPU" in empty.reason


def test_fixture_package_step_with_a_stand_in_dist(fake_torch_npu):
    fake_torch_npu()
    step = check_package()
    assert step.ok and step.facts["torch_npu_version"] == "2.13.0"
    assert "torch_npu" not in sys.modules


def test_fixture_package_step_refuses_a_mismatched_pair(fake_torch_npu, fx):
    fake_torch_npu(torch_pin="2.5.1.*", version="2.5.1")
    step = check_package()
    assert not step.ok
    assert step.reason.startswith("torch-npu 2.5.1 needs torch==2.5.1.*, but torch ")
    assert step.reason.endswith(
        f"install the matching pair: pip install torch==2.5.1 or torch-npu=={fx.torch_release()}"
    )


def test_fixture_child_step_counts_devices(cann_tree, fake_torch_npu, monkeypatch):
    fake_torch_npu(count=3)
    step = check_import(cann_tree())
    assert step.ok and step.facts == {"device_count": 3, "torch_npu_runtime": "2.13.0"}
    fake_torch_npu(count=0)
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "")
    none = check_import(cann_tree())
    assert not none.ok and none.reason == "torch_npu sees no NPU (ASCEND_RT_VISIBLE_DEVICES='')"
    assert "torch_npu" not in sys.modules


def test_fixture_child_step_timeout_and_crash(cann_tree, tmp_path, fx):
    slow = fx.write_executable(tmp_path / "slow-python", "#!/bin/sh\nsleep 30\n")
    step = check_import(attrs.evolve(cann_tree(), python=str(slow), timeout_s=0.5))
    assert not step.ok and step.reason.startswith("importing torch_npu in a child process took over 0.5 s")
    crash = fx.write_executable(tmp_path / "crash-python", "#!/bin/sh\necho 'Segmentation fault' >&2\nexit 139\n")
    step = check_import(attrs.evolve(cann_tree(), python=str(crash)))
    assert not step.ok and step.reason == f"the torch_npu check in {crash} exited 139: Segmentation fault"
    step = check_import(attrs.evolve(cann_tree(), python=str(tmp_path / "no-python")))
    assert not step.ok and step.reason.startswith(f"cannot start {tmp_path / 'no-python'}: FileNotFoundError")


# ---------------------------------------------------------------- the order of the steps


def test_fixture_full_probe_says_yes_with_a_summary(cann_tree, fake_torch_npu):
    fake_torch_npu(count=2)
    report = run_probe(cann_tree(nodes=()))
    assert [s.name for s in report.steps] == ["package", "cann", "devices", "import"]
    assert report.result.available is True
    assert report.result.reason == "2 device(s), torch-npu 2.13.0, CANN 8.3.RC1"
    assert "torch_npu" not in sys.modules


def test_fixture_probe_stops_at_the_first_no(cann_tree, fake_torch_npu, tmp_path, fx):
    fake_torch_npu()
    roots = cann_tree(version=None, nodes=())
    report = run_probe(roots)
    assert [s.name for s in report.steps] == ["package", "cann"]
    assert smi_calls(roots) == []  # the devices step never ran
    # devices missing: the child (expensive) step is never started
    never = fx.write_executable(tmp_path / "never-python", f"#!/bin/sh\ntouch {tmp_path}/child-ran\n")
    roots = attrs.evolve(cann_tree(nodes=(), smi=False), python=str(never))
    report = run_probe(roots)
    assert [s.name for s in report.steps] == ["package", "cann", "devices"]
    assert not (tmp_path / "child-ran").exists()


def test_fixture_probe_internal_error_is_a_no(cann_tree, monkeypatch):
    import verl_npu.probe as probe

    def broken(roots):
        raise KeyError("boom")

    monkeypatch.setattr(probe, "check_devices", broken)
    monkeypatch.setattr(probe, "check_package", lambda: probe.Step("package", True, "stand-in"))
    report = probe.run_probe(cann_tree())
    assert report.result.available is False
    assert report.result.reason == "the npu probe failed: KeyError: 'boom'"
