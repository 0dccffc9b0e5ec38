"""Fresh-process halves of :class:`~verl.testing.conformance.PlatformTests`, run as a script.

``python platform_worker.py probe NAME MODULES_JSON``: get platform ``NAME``'s spec from the plugin manager,
call its probe, and print one JSON line: the answer, the reason, which of the given modules (backend
libraries the probe must not import) are imported, and which ``torch.<device>`` modules report
``is_initialized()``. Nothing else runs in that process, so whatever is imported or initialised there the
probe (or plugin loading) did.

``python platform_worker.py collective NAME OUT_DIR``: one rank of a ``torch.distributed`` world on the
platform's ``dist_backend`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set by the kit, the
platform's ``visible_devices_env`` showing this rank one device): ``all_reduce`` (sum) of
``[rank + 1, 10 * (rank + 1)]`` and a broadcast of ``[7, 8, 9] * (rank + 1)`` from rank 0, on the platform's
device; writes ``OUT_DIR/rank<R>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# torch.<name> modules with is_initialized(); a platform's own device type is checked too.
DEVICE_MODULES = ("cuda", "xpu", "npu", "mlu", "musa", "mtia", "hpu")


def probe_report(name: str, forbidden: list[str]) -> dict:
    """Probe platform ``name`` in this process; what it answered, imported and initialised."""
    from verl.plugins import get_plugin_manager

    spec = get_plugin_manager().get("platform", name)
    try:
        answer = spec.probe()
        error = None
    except Exception as exc:  # reported, the kit fails with it
        answer, error = None, f"{type(exc).__name__}: {exc}"
    torch = sys.modules.get("torch")
    initialised = []
    device_type = getattr(spec, "device_type", None) or name
    for mod_name in dict.fromkeys((*DEVICE_MODULES, device_type)):
        module = getattr(torch, mod_name, None) if torch is not None else None
        check = getattr(module, "is_initialized", None)
        if callable(check) and check():
            initialised.append(f"torch.{mod_name}")
    return {
        "error": error,
        "type": type(answer).__name__,
        "available": bool(answer) if error is None else None,
        "reason": getattr(answer, "reason", None),
        "imported": [m for m in forbidden if m in sys.modules],
        "initialised": initialised,
    }


def collective(name: str, out_dir: Path) -> None:
    """One rank of the kit's collective check (see the module doc)."""
    import datetime

    import torch
    import torch.distributed as dist

    from verl.plugins import get_plugin_manager

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    platform = get_plugin_manager().get("platform", name).factory()
    if platform.device_type != "cpu":
        platform.set_device(0)  # the kit's visible_devices_env shows this rank its own device as index 0
    device = platform.torch_device()
    dist.init_process_group(
        backend=platform.dist_backend,
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        summed = torch.tensor([rank + 1.0, 10.0 * (rank + 1)], device=device)
        dist.all_reduce(summed)
        sent = torch.tensor([7.0, 8.0, 9.0], device=device) * (rank + 1)
        dist.broadcast(sent, src=0)
        platform.synchronize()
        result = {
            "rank": rank,
            "backend": dist.get_backend(),
            "device_type": summed.device.type,
            "all_reduce": summed.cpu().tolist(),
            "broadcast": sent.cpu().tolist(),
        }
    finally:
        dist.destroy_process_group()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


def main(argv: list[str]) -> None:
    """Dispatch ``probe`` / ``collective`` (see the module doc)."""
    mode, name = argv[0], argv[1]
    if mode == "probe":
        print(json.dumps(probe_report(name, json.loads(argv[2]))))
    elif mode == "collective":
        collective(name, Path(argv[2]))
    else:
        raise SystemExit(f"unknown mode {mode!r}: use probe or collective")


if __name__ == "__main__":
    main(sys.argv[1:])
