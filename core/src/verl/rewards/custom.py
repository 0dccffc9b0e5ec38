"""Load a user scoring function from a ``.py`` file (verl/trainer/ppo/reward.py:get_custom_reward_fn).

Config keys (verl names): ``custom_reward_function.path`` (file), ``.name`` (function, default
``compute_score``), ``.reward_kwargs`` (keywords bound with :func:`functools.partial`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from verl.rewards.errors import RewardFunctionLoadError

__all__ = ["load_reward_function", "split_accepted_kwargs"]

# The arguments every reward manager passes, by keyword.
_CALL_KEYWORDS = ("data_source", "solution_str", "ground_truth", "extra_info")


def _module_name(path: Path) -> str:
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    stem = re.sub(r"\W", "_", path.stem)
    return f"verl_custom_reward_{stem}_{digest}"


def _import_file(path: Path) -> Any:
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RewardFunctionLoadError(f"custom_reward_function.path={str(path)!r} cannot be imported as a module")
    module = importlib.util.module_from_spec(spec)
    # Registered before exec so the module's own dataclasses/pickling resolve it, as a normal import would.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise RewardFunctionLoadError(
            f"importing custom_reward_function.path={str(path)!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    return module


def _check_signature(fn: Callable, path: Path, name: str, reward_kwargs: Mapping[str, Any]) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some C callables have no introspectable signature; trust them
        return
    probe = dict.fromkeys(_CALL_KEYWORDS)
    try:
        signature.bind(**probe, **reward_kwargs)
    except TypeError as exc:
        extra = f" plus reward_kwargs {sorted(reward_kwargs)}" if reward_kwargs else ""
        raise RewardFunctionLoadError(
            f"function {name!r}{signature} in {str(path)!r} cannot be called with the keyword arguments "
            f"{', '.join(_CALL_KEYWORDS)}{extra} ({exc}). Define it as "
            f"`def {name}(data_source, solution_str, ground_truth, extra_info=None, **kwargs)`."
        ) from exc


def split_accepted_kwargs(fn: Callable, kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Split ``kwargs`` into those ``fn`` can take by keyword and the names of those it cannot.

    ``fn`` takes a keyword when it has a parameter of that name (not positional-only) or a ``**kwargs``. A
    callable without an introspectable signature is trusted with all of them.

    Returns:
        ``(accepted, unused)``: a dict of the accepted keywords and the sorted names of the others.
    """
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return dict(kwargs), []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(kwargs), []
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    accepted = {key: value for key, value in kwargs.items() if key in names}
    return accepted, sorted(set(kwargs) - set(accepted))


def load_reward_function(
    path: str | Path,
    name: str = "compute_score",
    reward_kwargs: Mapping[str, Any] | None = None,
    optional_kwargs: Mapping[str, Any] | None = None,
) -> Callable[..., Any]:
    """Import ``path`` and return its function ``name``, with ``reward_kwargs`` bound by keyword.

    The function is called by the reward manager as
    ``fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`` and must return a float or a dict
    with a ``"score"`` key (it may be ``async def``). The file is imported under a private module name
    (``verl_custom_reward_<stem>_<hash>``) registered in ``sys.modules``.

    Args:
        path: the ``.py`` file (``~`` expanded, relative paths resolved against the working directory).
        name: attribute of the module to use.
        reward_kwargs: extra keywords bound with ``functools.partial``; ``None`` or empty binds nothing.
        optional_kwargs: keywords bound only if the function takes them (a parameter of that name or
            ``**kwargs``, see :func:`split_accepted_kwargs`); ``reward_kwargs`` win on a shared name. Used for
            ``reward_model.reward_kwargs``, which also configure the built-in scorers.

    Returns:
        The function itself, or a ``functools.partial`` when keywords are bound.

    Raises:
        RewardFunctionLoadError (a ValueError): the file does not exist or is not a file, importing it raised,
            the module has no ``name``, the attribute is not callable, or its signature cannot accept the four
            keywords above plus ``reward_kwargs``. Every message names the file and the function.
    """
    reward_kwargs = dict(reward_kwargs or {})
    file_path = Path(path).expanduser().resolve()
    if not file_path.exists():
        raise RewardFunctionLoadError(
            f"custom_reward_function.path={str(path)!r} does not exist (resolved to {str(file_path)!r}); "
            "point it at the .py file that defines the reward function"
        )
    if not file_path.is_file():
        raise RewardFunctionLoadError(f"custom_reward_function.path={str(path)!r} is not a file")
    module = _import_file(file_path)
    if not hasattr(module, name):
        candidates = sorted(
            attr for attr, value in vars(module).items() if inspect.isfunction(value) and not attr.startswith("_")
        )
        raise RewardFunctionLoadError(
            f"custom_reward_function.name={name!r} not found in {str(file_path)!r}; functions defined there: "
            f"{candidates or 'none'}. Set custom_reward_function.name to one of them."
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise RewardFunctionLoadError(
            f"custom_reward_function.name={name!r} in {str(file_path)!r} is a {type(fn).__name__}, not a function"
        )
    accepted, _ = split_accepted_kwargs(
        fn, {k: v for k, v in (optional_kwargs or {}).items() if k not in reward_kwargs}
    )
    reward_kwargs = {**accepted, **reward_kwargs}
    _check_signature(fn, file_path, name, reward_kwargs)
    return functools.partial(fn, **reward_kwargs) if reward_kwargs else fn
