"""Make the checkout's packages importable without pip: a folder of ``*.dist-info`` stand-ins (name, version and the
``verl.plugins`` entry points from each ``pyproject.toml``) to put on ``PYTHONPATH`` beside the ``src`` folders.

    python scripts/checkout_site.py SITE_DIR core plugins/verl-fsdp ...

For a machine where pip cannot install the checkout (no PyPI, no hatchling): verl's plugin discovery reads these
entry points exactly as those of installed packages. Prints the ``PYTHONPATH`` entries to add (site first, then
each folder's ``src``). Used by ``scripts/check_device.sh`` and ``scripts/gpu_throughput.sh``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib


def write_site(site: Path, folders: list[str]) -> list[str]:
    """Write the stand-ins under ``site``; returns the ``PYTHONPATH`` entries."""
    site.mkdir(parents=True, exist_ok=True)
    for folder in folders:
        project = tomllib.loads((Path(folder) / "pyproject.toml").read_text())["project"]
        info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
        )
        eps = project.get("entry-points", {}).get("verl.plugins", {})
        (info / "entry_points.txt").write_text("[verl.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    return [str(site), *(str((Path(folder) / "src").resolve()) for folder in folders)]


if __name__ == "__main__":
    print(":".join(write_site(Path(sys.argv[1]), sys.argv[2:])))
