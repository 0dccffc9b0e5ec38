"""Colocation (verl's hybrid engine): several roles' workers in one process per rank.

``create_colocated_worker_cls({"actor": ClassWithInitArgs(Actor), "ref": ClassWithInitArgs(Ref)})``
returns a ``ClassWithInitArgs`` of a generated :class:`Worker` subclass. Each instance constructs every
role's worker (in the same process, with the same rank) and exposes every ``@register``-ed method ``m``
of role ``r`` as ``r_m`` with the same dispatch attributes. A group built from it is split back into
per-role views with :meth:`WorkerGroup.spawn`::

    group = LocalWorkerGroup(create_colocated_worker_cls(class_dict), world_size=2)
    views = group.spawn({"actor", "ref"})
    views["actor"].update_actor(batch)   # runs actor_update_actor on the shared workers

Source: verl/single_controller/ray/base.py (``create_colocated_worker_cls``, ``_bind_workers_method_to_parent``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from verl.controller.decorator import MAGIC_ATTR, registered_methods
from verl.controller.worker import Worker
from verl.controller.worker_group import ClassWithInitArgs


def _delegate(role: str, method_name: str, attrs: dict, is_async: bool) -> Callable[..., Any]:
    if is_async:

        async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await getattr(self.worker_dict[role], method_name)(*args, **kwargs)

    else:

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.worker_dict[role], method_name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = f"{role}_{method_name}"
    method.__doc__ = f"Role {role!r}: calls {method_name} on this process's {role} worker."
    setattr(method, MAGIC_ATTR, dict(attrs))
    return method


def _init_colocated(self: Any) -> None:
    Worker.__init__(self)
    # Every role is built while the group's identity (or the process environment) is in effect, so each
    # inner worker sees the same rank and world size as the colocated worker.
    self.worker_dict = {role: init() for role, init in self._role_inits.items()}


def create_colocated_worker_cls(class_dict: dict[str, ClassWithInitArgs]) -> ClassWithInitArgs:
    """Build one worker class holding every role of ``class_dict`` (role name -> worker class + init args).

    Returns:
        ``ClassWithInitArgs`` of a class named ``ColocatedWorker_<roles>``: attribute ``colocated_roles``
        (role names in ``class_dict`` order), instance attribute ``worker_dict`` (role -> inner worker),
        and method ``{role}_{method}`` for every registered method.

    Raises:
        ValueError: empty dict, a role name that is not an identifier, one role name being the
            ``<other>_`` prefix of another (their methods could not be told apart), or two roles
            producing the same ``{role}_{method}`` name / a name that shadows a ``Worker`` attribute.
        TypeError: a value is not a ``ClassWithInitArgs``.
    """
    if not class_dict:
        raise ValueError("create_colocated_worker_cls needs at least one role, got an empty dict")
    for role, init in class_dict.items():
        if not isinstance(role, str) or not role.isidentifier():
            raise ValueError(f"role name must be an identifier such as 'actor_rollout', got {role!r}")
        if not isinstance(init, ClassWithInitArgs):
            raise TypeError(f"role {role!r}: expected ClassWithInitArgs, got {type(init).__name__}")
    roles = list(class_dict)
    for role in roles:
        for other in roles:
            if other != role and other.startswith(f"{role}_"):
                raise ValueError(
                    f"role {role!r} is a prefix of role {other!r}: spawn({role!r}) could not tell their methods "
                    "apart; rename one of them"
                )

    namespace: dict[str, Any] = {
        "colocated_roles": tuple(roles),
        "_role_inits": dict(class_dict),
        "__init__": _init_colocated,
        "__module__": __name__,
    }
    origin: dict[str, str] = {}
    for role, init in class_dict.items():
        for method_name, attrs in registered_methods(init.cls).items():
            name = f"{role}_{method_name}"
            if name in origin:
                raise ValueError(f"{origin[name]} and {role}.{method_name} both map to {name!r}; rename one of them")
            if hasattr(Worker, name) or name in namespace:
                raise ValueError(f"{role}.{method_name} maps to {name!r}, which shadows a Worker attribute; rename it")
            origin[name] = f"{role}.{method_name}"
            is_async = inspect.iscoroutinefunction(getattr(init.cls, method_name))
            namespace[name] = _delegate(role, method_name, attrs, is_async)

    cls_name = "ColocatedWorker_" + "_".join(roles)
    namespace["__qualname__"] = cls_name
    namespace["__doc__"] = f"Colocated worker holding roles {', '.join(roles)} in one process."
    return ClassWithInitArgs(type(cls_name, (Worker,), namespace))
