"""Entry module of verl-pretend-accelerator (entry point ``pretend`` in group ``verl.plugins``).

Imports only verl and the standard library at module level: ``verl plugins`` and every platform lookup
import this module. The platform module (which imports nothing heavy either, but would import the vendor's
torch extension in a real plugin) is imported inside the probe and the factory.
"""

from __future__ import annotations

from verl.plugins import hookimpl
from verl.plugins.specs import PlatformSpec

VERL_PLUGIN_API = (2, 0)


def _probe():
    from verl_pretend.platform import PretendPlatform

    return PretendPlatform.probe()


def _make():
    from verl_pretend.platform import PretendPlatform

    return PretendPlatform()


@hookimpl
def verl_platforms():
    """The ``pretend`` platform, an accelerator (takes part in the automatic choice when its probe says yes).

    ``device_type="cpu"`` is declared because the factory is a function: config load matches it against the
    engines' ``devices`` without building the platform, so core's engines (``cpu``, ``cuda``) accept
    ``trainer.device=pretend``.
    """
    return [PlatformSpec(name="pretend", probe=_probe, factory=_make, device_type="cpu")]
