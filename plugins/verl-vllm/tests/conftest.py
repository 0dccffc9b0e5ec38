"""Shared settings of the verl-vllm tests: vLLM's CPU environment, and skipping where vLLM is absent."""

from __future__ import annotations

import importlib.util
import os

import pytest

# In-process engine core (hybrid mode) and a small CPU KV cache; set before vLLM is imported.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

HAVE_VLLM = importlib.util.find_spec("vllm") is not None

needs_vllm = pytest.mark.skipif(
    not HAVE_VLLM, reason="vLLM is not installed (pip install './plugins/verl-vllm[cpu]' from the verl checkout)"
)
