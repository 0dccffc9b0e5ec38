"""Ascend version strings (CANN ``8.3.RC1``, driver ``25.3.rc1.2``, ``25.5.t3.b001``) and their order.

They are not PEP 440 (``packaging`` rejects ``25.3.rc1.2`` and ``25.5.t3.b001``), so they get their own small
parser. The order follows Huawei's release naming: within one ``major.minor``, test builds (``T3``, ``alpha002``,
``B010``) come before release candidates (``RC1 < RC2``), which come before the release (``8.0.0``, then
``8.0.1``); anything after the stage (``.2`` in ``25.3.rc1.2``, ``.b001``) is a later build of it.

Also here: whether a torch-npu release matches the installed torch (:func:`torch_pair`).
"""

from __future__ import annotations

import functools
import re

import attrs
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

__all__ = [
    "IPC_MIN_CANN",
    "IPC_MIN_DRIVER",
    "AscendVersion",
    "VersionFormatError",
    "ipc_support",
    "torch_pair",
]


class VersionFormatError(ValueError):
    """A string that is not an Ascend version (``<major>.<minor>[.<stage>][.<build>...]``)."""


# Stage ranks: pre-release builds < release candidates < releases.
_TEST, _RC, _RELEASE = 0, 1, 2
_PART = re.compile(r"(?P<word>[a-z]*)(?P<num>\d*)")
_PRE_WORDS = {"t": _TEST, "alpha": _TEST, "a": _TEST, "beta": _TEST, "b": _TEST, "rc": _RC}


@functools.total_ordering
@attrs.frozen(eq=False)
class AscendVersion:
    """A parsed Ascend version; compare with ``<``/``==``, print with ``str`` (the text it was parsed from).

    Attributes:
        text: the version as written (``"8.3.RC1"``).
        key: the sort key ``(major, minor, stage, number, *build)``: ``8.3.RC1`` -> ``(8, 3, 1, 1)``,
            ``8.3.0`` -> ``(8, 3, 2, 0)``, ``25.3.rc1.2`` -> ``(25, 3, 1, 1, 2)``.
    """

    text: str
    key: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> AscendVersion:
        """Parse ``8.3.RC1``, ``8.0.0``, ``25.3.rc1.2``, ``25.5.t3.b001``, ``24.1.0.3``, ``8.5`` (case-insensitive).

        Raises:
            VersionFormatError: not a string, fewer than two numeric parts, or a part that is neither a
                number nor a known stage word followed by a number (``rc1``, ``t3``, ``alpha002``, ``b001``).
        """
        if not isinstance(text, str):
            raise VersionFormatError(f"Ascend version must be a string, got {type(text).__name__} ({text!r})")
        parts = text.strip().lower().split(".")
        if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
            raise VersionFormatError(
                f"not an Ascend version: {text!r} (expected <major>.<minor>[.RC<n>|.<patch>][...], e.g. 8.3.RC1)"
            )
        key = [int(parts[0]), int(parts[1])]
        rest = parts[2:]
        if not rest:
            key += [_RELEASE, 0]  # "8.5" is the 8.5 release (8.5.0)
        for i, part in enumerate(rest):
            match = _PART.fullmatch(part)
            if not match or not part or (match["word"] and match["word"] not in _PRE_WORDS):
                raise VersionFormatError(f"not an Ascend version: {text!r} (part {part!r} is not understood)")
            word, num = match["word"], int(match["num"] or 0)
            if i == 0:
                key += [_PRE_WORDS[word] if word else _RELEASE, num]
            else:
                key.append(num)  # a later build of the same stage: rc1 < rc1.2
        return cls(text.strip(), tuple(key))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AscendVersion):
            return NotImplemented
        return _padded(self.key, other.key) == _padded(other.key, self.key)

    def __lt__(self, other: AscendVersion) -> bool:
        if not isinstance(other, AscendVersion):
            return NotImplemented
        return _padded(self.key, other.key) < _padded(other.key, self.key)

    def __hash__(self) -> int:
        key = list(self.key)
        while len(key) > 4 and key[-1] == 0:  # 25.3.rc1 == 25.3.rc1.0
            key.pop()
        return hash(tuple(key))

    def __str__(self) -> str:
        return self.text


def _padded(key: tuple[int, ...], other: tuple[int, ...]) -> tuple[int, ...]:
    return key + (0,) * (len(other) - len(key))


#: verl's thresholds for device-memory IPC between processes (``verl/utils/device.py``).
IPC_MIN_DRIVER = AscendVersion.parse("25.3.rc1")
IPC_MIN_CANN = AscendVersion.parse("8.3.rc1")


def ipc_support(driver: str | None, cann: str | None) -> tuple[bool, str]:
    """Whether NPU device memory can be shared between processes: driver (npu-smi) >= 25.3.rc1 and CANN
    >= 8.3.RC1, as in verl. Returns ``(answer, reason)``; an unknown or unparsable version answers ``False``
    with the reason (never raises)."""
    checks = (("npu-smi driver", driver, IPC_MIN_DRIVER), ("CANN", cann, IPC_MIN_CANN))
    found = []
    for what, text, minimum in checks:
        if text is None:
            return False, f"{what} version unknown; IPC needs {what} >= {minimum}"
        try:
            version = AscendVersion.parse(text)
        except VersionFormatError as exc:
            return False, f"{exc}; IPC needs {what} >= {minimum}"
        if version < minimum:
            return False, f"{what} {version} is older than {minimum}, which IPC needs"
        found.append(f"{what} {version} >= {minimum}")
    return True, ", ".join(found)


def torch_pair(torch_version: str, torch_npu_version: str, torch_npu_requires: list[str] | None) -> tuple[bool, str]:
    """Whether torch-npu ``torch_npu_version`` was built for the installed torch ``torch_version``.

    torch-npu's metadata pins its torch (``Requires-Dist: torch==2.13.0.*``); that pin decides. Without one
    (an old or repackaged wheel) the release numbers must agree: torch-npu ``2.5.1.post1`` is for torch
    ``2.5.1``. Local labels (``+cpu``) are ignored. Returns ``(answer, reason)``; never raises.
    """
    for line in torch_npu_requires or ():
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower() == "torch" and (req.marker is None or req.marker.evaluate()):
            if not req.specifier:
                break
            if req.specifier.contains(torch_version, prereleases=True):
                return True, f"torch {torch_version} satisfies torch-npu {torch_npu_version}'s torch{req.specifier}"
            return (
                False,
                f"torch-npu {torch_npu_version} needs torch{req.specifier}, but torch {torch_version} is installed",
            )
    try:
        same = Version(torch_version).release[:3] == Version(torch_npu_version).release[:3]
    except InvalidVersion as exc:
        return False, f"cannot compare torch {torch_version} with torch-npu {torch_npu_version}: {exc}"
    if same:
        return True, f"torch {torch_version} and torch-npu {torch_npu_version} are the same release"
    return False, f"torch-npu {torch_npu_version} is built for another torch than the installed {torch_version}"
