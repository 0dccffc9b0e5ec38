"""Every platform test starts from a fresh process-wide plugin manager (and so a fresh
``current_platform()`` cache) with ``VERL_PLUGINS`` unset."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from verl.plugins import reset_plugin_manager


@pytest.fixture(autouse=True)
def _fresh_plugin_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("VERL_PLUGINS", raising=False)
    reset_plugin_manager()
    yield
    reset_plugin_manager()
