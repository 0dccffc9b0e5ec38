"""The ``pretend`` platform: an accelerator that keeps its tensors in host memory.

Environment:
    VERL_PRETEND_DEVICES: number of pretend devices on this machine (an int >= 1). Unset, empty or ``0``:
        the probe answers no (the machine "has no such device"), with the fix in the reason.
    PRETEND_VISIBLE_DEVICES: comma-separated indices in ``[0, VERL_PRETEND_DEVICES)`` restricting what this
        process sees, as ``CUDA_VISIBLE_DEVICES`` does for CUDA (unset: all devices visible).

What differs from a real vendor plugin, and why: ``device_type`` is ``"cpu"`` (torch has no pretend device
type), so ``device_module`` is ``None`` and every method the base class writes against a ``torch.cuda``-like
module is overridden here; ``torch_device()`` is the base class's, which gives ``torch.device("cpu")`` for
device type ``cpu`` whatever the index.
"""

from __future__ import annotations

import os
import resource
import sys
from types import ModuleType

from verl.platform import Platform, ProbeResult

COUNT_ENV = "VERL_PRETEND_DEVICES"
VISIBLE_ENV = "PRETEND_VISIBLE_DEVICES"


def _visible_devices() -> tuple[list[int], str]:
    """``(visible device indices, reason)``; an empty list means "none here", with the reason and the fix.

    Never raises: bad values of the two variables are reported in the reason.
    """
    raw = os.environ.get(COUNT_ENV, "").strip()
    if not raw:
        return [], f"{COUNT_ENV} is not set; export {COUNT_ENV}=<n> to pretend n devices"
    try:
        total = int(raw)
    except ValueError:
        return [], f"{COUNT_ENV}={raw!r} is not an integer; set it to the number of pretend devices, e.g. 2"
    if total < 1:
        return [], f"{COUNT_ENV}={total}: no pretend devices; set it to 1 or more"
    visible = os.environ.get(VISIBLE_ENV)
    if visible is None:
        return list(range(total)), f"{total} pretend device(s) in host memory"
    try:
        indices = [int(part) for part in visible.split(",") if part.strip()]
    except ValueError:
        return [], f"{VISIBLE_ENV}={visible!r} is not a comma-separated list of device indices, e.g. 0,1"
    bad = [i for i in indices if not 0 <= i < total]
    if bad:
        return [], f"{VISIBLE_ENV}={visible!r} names device(s) {bad} outside [0, {total}) ({COUNT_ENV}={total})"
    if not indices:
        return [], f"{VISIBLE_ENV} is empty: this process sees none of the {total} pretend device(s)"
    return indices, f"{len(indices)} of {total} pretend device(s) visible ({VISIBLE_ENV}={visible})"


def _rss_bytes() -> int:
    # /proc/self/statm: "size resident ..." in pages; the peak where /proc is missing.
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _peak_rss_bytes()


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB, macOS bytes


class PretendPlatform(Platform):
    """A pretend accelerator: ``VERL_PRETEND_DEVICES`` devices, tensors in host memory, gloo collectives.

    Ray workers reserve the custom resource ``PRETEND``, which Ray does not detect by itself: a run with
    ``trainer.controller=ray`` declares it, e.g. ``+ray_kwargs.ray_init.resources={PRETEND: 2}``.
    """

    name = "pretend"
    device_type = "cpu"
    vendor = "pretend"
    dist_backend = "gloo"
    visible_devices_env = VISIBLE_ENV
    ray_resource_name = "PRETEND"

    def __init__(self) -> None:
        self._current = 0

    @classmethod
    def probe(cls) -> ProbeResult:
        """Yes when ``VERL_PRETEND_DEVICES`` >= 1 and ``PRETEND_VISIBLE_DEVICES`` (if set) names some of them.

        Reads two environment variables and nothing else: fork-safe, never raises.
        """
        visible, reason = _visible_devices()
        return ProbeResult(bool(visible), reason)

    @property
    def device_module(self) -> ModuleType | None:
        """``None``: there is no ``torch.pretend``; the methods that would use it are overridden below."""
        return None

    def device_name(self, index: int | None = None) -> str:
        """``"Pretend Accelerator #<physical index> (host memory)"`` for visible device ``index`` (default: current).

        Raises:
            TypeError / ValueError: as :meth:`set_device` for a bad index.
        """
        index = self._current if index is None else index
        self._check_index(index)
        physical = _visible_devices()[0][index]
        return f"Pretend Accelerator #{physical} (host memory)"

    def device_count(self) -> int:
        """Visible pretend devices (0 when the probe says no)."""
        return len(_visible_devices()[0])

    def set_device(self, index: int) -> None:
        """Make visible device ``index`` current for this process.

        Raises:
            TypeError: not an int. ValueError: outside ``[0, device_count())``; names ``PRETEND_VISIBLE_DEVICES``.
        """
        self._check_index(index)
        self._current = index

    def current_device(self) -> int:
        """The index last given to :meth:`set_device` (0 before)."""
        return self._current

    def memory_stats(self) -> dict[str, int]:
        """Process memory in bytes: ``allocated_bytes`` = ``reserved_bytes`` = resident set size,
        ``max_allocated_bytes`` = ``max_reserved_bytes`` = peak resident set size since the process started."""
        rss, peak = _rss_bytes(), _peak_rss_bytes()
        top = max(rss, peak)
        return {"allocated_bytes": rss, "reserved_bytes": rss, "max_allocated_bytes": top, "max_reserved_bytes": top}

    def reset_peak_memory_stats(self) -> bool:
        """``False``: the peak RSS counts from the process start and cannot be reset here."""
        return False

    def empty_cache(self) -> None:
        """No-op: host memory has no device cache."""

    def synchronize(self) -> None:
        """No-op: CPU ops complete before they return."""
