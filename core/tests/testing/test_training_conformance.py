"""The training-engine kit run on core's ``reference`` engine (built from its spec, against itself as oracle).

The reference against itself must pass with zero tolerance on what is computed the same way; the kit's
independent checks (hand-computed token mean and gradient norm, micro-batch 1 vs full, state dict, HF names)
are what make this run meaningful. Also: the kit's helpers and the option validation it goes through.
"""

from __future__ import annotations

import pytest

from verl.testing.conformance import TrainingEngineTests, engine_overrides, kwargs_overrides


class TestReferenceTrainingConformance(TrainingEngineTests):
    strategy = "reference"


def test_kwargs_overrides_flatten_nested_options():
    got = kwargs_overrides("a.engine_kwargs.x", {"flag": True, "n": 3, "s": "1.0", "mp": {"p": "bf16"}, "e": {}})
    assert got == [
        "a.engine_kwargs.x.flag=true",
        "a.engine_kwargs.x.n=3",
        'a.engine_kwargs.x.s="1.0"',
        'a.engine_kwargs.x.mp.p="bf16"',
        "a.engine_kwargs.x.e={}",
    ]
    assert engine_overrides("training_engine", "fsdp", None) == []
    with pytest.raises(ValueError, match="no engine_kwargs section"):
        engine_overrides("platform", "cpu", {})


def test_an_unknown_engine_option_fails_at_config_load(tmp_path):
    """The kit builds through load_config, so a misspelt option fails with its full key, as at config load."""
    from verl.testing.conformance import load_kit_config, training_overrides

    overrides = [
        *training_overrides(tmp_path, "reference"),
        *engine_overrides("training_engine", "reference", {"param_ofload": True}),
    ]
    with pytest.raises(pytest.fail.Exception, match="actor_rollout_ref.actor.engine_kwargs.reference.param_ofload"):
        load_kit_config(overrides)


class TestReferenceTrainingConformanceCUDA(TrainingEngineTests):
    """The reference engine on a CUDA device against itself on the CPU (skips without CUDA, with the probe's
    reason); float32 on both sides, so the default tolerances hold."""

    strategy = "reference"

    @pytest.fixture(scope="class")
    @classmethod
    def device(cls):
        from verl.testing.conformance import plugin_spec

        answer = plugin_spec("platform", "cuda").probe()
        if not answer:
            pytest.skip(f"no CUDA device: {getattr(answer, 'reason', answer)}")
        return plugin_spec("platform", "cuda").factory().torch_device(0)


def test_importing_the_kits_without_pytest_names_the_extra():
    """Without pytest the package refuses to import and says which extra installs it."""
    import subprocess
    import sys

    code = "import sys; sys.modules['pytest'] = None; import verl.testing.conformance"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "pip install './core[testing]'" in proc.stderr
