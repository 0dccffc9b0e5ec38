"""The Ascend version comparator, verl's IPC thresholds and the torch / torch-npu pairing rule (hand values)."""

from __future__ import annotations

import itertools

import pytest
from verl_npu.versions import AscendVersion, VersionFormatError, ipc_support, torch_pair

V = AscendVersion.parse


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("8.3.RC1", (8, 3, 1, 1)),
        ("8.3.rc1", (8, 3, 1, 1)),
        ("8.0.0", (8, 0, 2, 0)),
        ("8.5", (8, 5, 2, 0)),
        ("25.3.rc1.2", (25, 3, 1, 1, 2)),
        ("25.5.t3.b001", (25, 5, 0, 3, 1)),
        ("8.2.alpha002", (8, 2, 0, 2)),
        ("24.1.0.3", (24, 1, 2, 0, 3)),
        (" 7.0.RC1 ", (7, 0, 1, 1)),
    ],
)
def test_parse_keys(text, key):
    assert V(text).key == key
    assert str(V(text)) == text.strip()


@pytest.mark.parametrize(
    "ordered",
    [
        # test build < RC1 < RC1 build 2 < RC2 < release 8.0.0 < 8.0.1 < next minor's RC
        ["8.0.T13", "8.0.RC1", "8.0.rc1.2", "8.0.RC2", "8.0.0", "8.0.1", "8.1.RC1", "8.3.RC1", "9.0.alpha001"],
        ["25.2.1", "25.3.t3.b001", "25.3.rc1", "25.3.rc1.2", "25.3.0", "25.5.0", "26.0.rc1"],
    ],
)
def test_order(ordered):
    parsed = [V(t) for t in ordered]
    assert sorted(reversed(parsed)) == parsed
    for a, b in itertools.pairwise(parsed):
        assert a < b and b > a and a != b and not b <= a


def test_equality_ignores_case_and_trailing_zero_builds():
    assert V("8.3.RC1") == V("8.3.rc1")
    assert V("25.3.rc1") == V("25.3.rc1.0") and hash(V("25.3.rc1")) == hash(V("25.3.rc1.0"))
    assert V("8.5") == V("8.5.0")
    assert V("8.3.RC1") <= V("8.3.rc1") <= V("8.3.RC1")
    assert (V("8.0.0") == "8.0.0") is False  # not equal to a plain string


@pytest.mark.parametrize("bad", ["", "8", "x.3", "8.3.RCx", "8.3.gamma1", "8.3..1", "8.3.RC1-beta", None, 8.3])
def test_bad_versions_are_refused(bad):
    with pytest.raises(VersionFormatError, match="Ascend version"):
        V(bad)


@pytest.mark.parametrize(
    ("driver", "cann", "answer", "reason"),
    [
        ("25.3.rc1", "8.3.RC1", True, "npu-smi driver 25.3.rc1 >= 25.3.rc1, CANN 8.3.RC1 >= 8.3.rc1"),
        ("25.3.rc1.2", "8.3.0", True, "npu-smi driver 25.3.rc1.2 >= 25.3.rc1, CANN 8.3.0 >= 8.3.rc1"),
        ("25.5.t3.b001", "8.5.0", True, "npu-smi driver 25.5.t3.b001 >= 25.3.rc1"),
        ("25.2.1", "8.3.RC1", False, "npu-smi driver 25.2.1 is older than 25.3.rc1, which IPC needs"),
        ("25.3.t3.b001", "8.3.RC1", False, "npu-smi driver 25.3.t3.b001 is older than 25.3.rc1"),
        ("25.3.rc1", "8.2.RC1", False, "CANN 8.2.RC1 is older than 8.3.rc1, which IPC needs"),
        ("25.3.rc1", "8.3.T10", False, "CANN 8.3.T10 is older than 8.3.rc1"),
        (None, "8.3.RC1", False, "npu-smi driver version unknown; IPC needs npu-smi driver >= 25.3.rc1"),
        ("25.3.rc1", None, False, "CANN version unknown; IPC needs CANN >= 8.3.rc1"),
        ("garbage", "8.3.RC1", False, "not an Ascend version: 'garbage'"),
    ],
)
def test_ipc_support(driver, cann, answer, reason):
    got, why = ipc_support(driver, cann)
    assert got is answer
    assert reason in why


def test_torch_pair_reads_the_metadata_pin():
    assert torch_pair("2.13.0+cpu", "2.13.0", ["torch==2.13.0.*", "numpy", "pyyaml"])[0] is True
    ok, why = torch_pair("2.13.0+cpu", "2.5.1", ["torch==2.5.1.*", "numpy"])
    assert not ok and why == "torch-npu 2.5.1 needs torch==2.5.1.*, but torch 2.13.0+cpu is installed"
    # A marker that does not apply is skipped; no pin at all falls back to the release numbers.
    assert torch_pair("2.5.1", "2.5.1.post1", ['torch==9.9; python_version < "3"'])[0] is True
    assert torch_pair("2.5.1", "2.5.1.post1", None)[0] is True
    ok, why = torch_pair("2.6.0", "2.5.1.post1", [])
    assert not ok and "built for another torch than the installed 2.6.0" in why
    assert torch_pair("2.6.0", "not-a-version", [])[0] is False
