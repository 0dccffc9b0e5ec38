"""Fixtures for plugin-manager tests: a clean process-wide manager and fake installed distributions."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator

import pytest

from verl.plugins import reset_plugin_manager


@pytest.fixture(autouse=True)
def _fresh_plugin_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("VERL_PLUGINS", raising=False)
    reset_plugin_manager()
    yield
    reset_plugin_manager()


@pytest.fixture
def fake_dist(tmp_path, monkeypatch) -> Iterator[Callable[..., None]]:
    """Factory installing a fake distribution on a temporary ``sys.path`` entry.

    ``fake_dist("verl-foo", "1.2", entry_points={"foo": "foo_plugin"}, modules={"foo_plugin": src})``
    writes ``verl_foo-1.2.dist-info/{METADATA,entry_points.txt}`` and ``foo_plugin.py``, which
    ``importlib.metadata`` then finds exactly like a pip-installed package.
    """
    root = tmp_path / "site-packages"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    created: list[str] = []

    # Plugins really installed in this environment (e.g. verl-fsdp in a dev venv) must not leak into
    # tests that count plugins: discovery sees core's built-in and this fixture's distributions only.
    from verl.plugins import discovery, manager

    real = discovery.iter_entry_points

    def only_fakes() -> list:
        return [
            ep
            for ep in real()
            if ep.value.strip() == discovery.BUILTIN_MODULE or str(root) in str(getattr(ep.dist, "_path", ""))
        ]

    monkeypatch.setattr(manager, "iter_entry_points", only_fakes)

    def make(dist: str, version: str = "1.0", *, entry_points: dict[str, str], modules: dict[str, str]) -> None:
        info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
        (info / "entry_points.txt").write_text(f"[verl.plugins]\n{lines}")
        for module, source in modules.items():
            (root / f"{module}.py").write_text(textwrap.dedent(source))
            created.append(module)

    yield make
    for module in created:
        sys.modules.pop(module, None)
