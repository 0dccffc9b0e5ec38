"""Shared helpers of the verl-trtllm tests (none of them needs TensorRT-LLM unless marked ``gpu``)."""

from __future__ import annotations

import importlib.util

import pytest

HAVE_TRTLLM = importlib.util.find_spec("tensorrt_llm") is not None


@pytest.fixture
def pretend_trtllm_installed(monkeypatch):
    """Make ``importlib.util.find_spec("tensorrt_llm")`` answer as if TensorRT-LLM were installed, so the spec's
    ``available()`` passes and a config selecting ``trtllm`` loads; nothing of TensorRT-LLM is imported."""
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return object() if name == "tensorrt_llm" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
