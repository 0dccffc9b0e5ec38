"""verl-pretend-accelerator: a platform plugin written from docs/platform-vendors.md as a vendor would.

The ``pretend`` platform answers its probe with "yes" when ``VERL_PRETEND_DEVICES=<n>`` is set and then
claims ``n`` devices. Its tensors live in host memory (``device_type = "cpu"``) and its collectives run on
gloo, so it trains anywhere; what it exercises is everything verl does with a platform *by name*: discovery
through the ``verl.plugins`` entry point, the probe in ``verl plugins`` and automatic selection,
``trainer.device=pretend`` with core's engines, device counting through its own visible-devices variable.
"""
