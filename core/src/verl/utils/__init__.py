"""verl's ``verl.utils`` package path, for the imports verl users' code makes from it.

Provided: :mod:`verl.utils.reward_score` (``default_compute_score``, ``gsm8k``, ``math_reward``) and
``as_torch_index`` (verl/utils/groupwise.py; here :func:`verl.algorithms.advantage_vectorized.as_torch_index`).
Importing this package imports nothing else (``as_torch_index`` is loaded on first access, PEP 562).

Not provided: ``hf_tokenizer`` / ``hf_processor`` (load with ``transformers.AutoTokenizer`` /
``AutoProcessor``), ``omega_conf_to_dataclass`` / ``validate_config`` (configs here are attrs classes:
:func:`verl.config.load_config`), ``normalize_token_ids``, ``get_processor_token_id``,
``build_multimodal_processor_inputs``, and ``group_mean_std``: the function of that name here
(:func:`verl.algorithms.advantage_vectorized.group_mean_std`) takes ``weights`` where verl's takes ``eps``, so
it is not offered under verl's import path.
"""

from __future__ import annotations

from typing import Any

__all__ = ["as_torch_index"]


def __getattr__(name: str) -> Any:
    if name == "as_torch_index":
        from verl.algorithms.advantage_vectorized import as_torch_index

        return as_torch_index
    raise AttributeError(f"module 'verl.utils' has no attribute {name!r}")
