"""``init_ray``: start or join the Ray runtime the Ray worker groups run on.

Source: verl/trainer/main_ppo.py (``ray.init(runtime_env=..., **ray_init)`` before building the trainer).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import ray

#: Driver environment variables handed to every worker (only those set in the driver): thread counts,
#: plugin selection, host allocator policy and import path must match the driver's, or workers behave
#: differently from it.
PROPAGATED_ENV_VARS = ("OMP_NUM_THREADS", "VERL_PLUGINS", "VERL_CPU_ALLOCATOR", "PYTHONPATH", "TOKENIZERS_PARALLELISM")

#: Object store size of a local cluster started by :func:`init_ray` (bytes) unless ``ray_init`` sets one.
DEFAULT_OBJECT_STORE_BYTES = 256 * 1024**2


def init_ray(ray_init: Mapping[str, Any] | None = None) -> None:
    """Initialise Ray once per driver process (no-op when ``ray.is_initialized()``).

    Args:
        ray_init: keyword arguments for ``ray.init`` (verl's ``ray_kwargs.ray_init``); they override the
            defaults below key by key (a ``None`` value is passed to Ray as is). ``runtime_env`` is merged:
            its ``env_vars`` win over the propagated driver variables.

    With ``ray_init["address"]`` or the environment variable ``RAY_ADDRESS`` set (other than ``"local"``),
    joins that cluster (only ``address``, ``logging_level=WARNING``, ``log_to_driver=True`` and the runtime
    env are defaulted: a cluster's size is the cluster's). Otherwise starts a quiet local cluster:
    ``num_cpus=os.cpu_count()``, ``object_store_memory`` = :data:`DEFAULT_OBJECT_STORE_BYTES`,
    ``include_dashboard=False``. The variables of :data:`PROPAGATED_ENV_VARS` that are set in the driver
    reach the workers through ``runtime_env={"env_vars": ...}``.

    Raises:
        TypeError: ``ray_init`` is not a mapping, or its ``runtime_env`` / ``env_vars`` are not mappings.
        Whatever ``ray.init`` raises (e.g. ``ConnectionError`` for an unreachable address).
    """
    if ray.is_initialized():
        return
    if ray_init is not None and not isinstance(ray_init, Mapping):
        raise TypeError(f"init_ray(ray_init=...) must be a mapping of ray.init kwargs, got {type(ray_init).__name__}")
    user = dict(ray_init or {})
    address = user.pop("address", None) or os.environ.get("RAY_ADDRESS") or None

    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
    if address:
        kwargs["address"] = address
    if not address or address == "local":  # "local": Ray's spelling for "start a new cluster here"
        kwargs.update(
            num_cpus=os.cpu_count() or 1, object_store_memory=DEFAULT_OBJECT_STORE_BYTES, include_dashboard=False
        )

    runtime_env = user.pop("runtime_env", None) or {}
    if not isinstance(runtime_env, Mapping):
        raise TypeError(f"ray_init['runtime_env'] must be a mapping, got {type(runtime_env).__name__}")
    runtime_env = dict(runtime_env)
    user_env_vars = runtime_env.get("env_vars") or {}
    if not isinstance(user_env_vars, Mapping):
        raise TypeError(f"ray_init['runtime_env']['env_vars'] must be a mapping, got {type(user_env_vars).__name__}")
    env_vars = {name: os.environ[name] for name in PROPAGATED_ENV_VARS if os.environ.get(name)}
    env_vars.update({str(k): str(v) for k, v in user_env_vars.items()})
    if env_vars:
        runtime_env["env_vars"] = env_vars
    if runtime_env:
        kwargs["runtime_env"] = runtime_env

    kwargs.update(user)
    ray.init(**kwargs)
