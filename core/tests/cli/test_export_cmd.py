"""``verl export`` of a checkpoint written by a training engine whose spec has no ``merge_checkpoint``.

The engine is a stand-in (``stand_in_engine``: a spec whose factory is never called), registered by a stand-in
plugin next to core's built-ins; ``verl export`` and its refusal are real.
"""

from __future__ import annotations

import importlib.metadata
import json
import types

from verl.cli.main import main
from verl.plugins import PluginManager, TrainingEngineSpec, hookimpl
from verl.plugins import builtin as builtin_plugin
from verl.plugins import manager as manager_module


def _never_called(*args, **kwargs):
    raise AssertionError("verl export must not build the engine")


def _checkpoint(tmp_path, strategy: str):
    actor = tmp_path / "global_step_2" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    (actor / "huggingface" / "config.json").write_text("{}")
    (actor / "checkpoint.json").write_text(json.dumps({"strategy": strategy, "world_size": 1}))
    return actor.parent


def test_stand_in_engine_without_merge_checkpoint_is_refused_with_the_missing_field_and_the_way_out(
    tmp_path, capsys, monkeypatch
):
    pm = PluginManager(load_entry_points=False)
    pm.register(builtin_plugin, name="builtin", dist_name="verl-core", version=importlib.metadata.version("verl-core"))
    plugin = types.ModuleType("verl_myengine.plugin")
    plugin.verl_training_engines = hookimpl(lambda: [TrainingEngineSpec(name="myengine", factory=_never_called)])
    pm.register(plugin, name="myengine", dist_name="verl-myengine", version="0.3.0")
    monkeypatch.setattr(manager_module, "_manager", pm)

    rc = main(["export", str(_checkpoint(tmp_path, "myengine")), str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error: training engine 'myengine' (plugin verl-myengine 0.3.0 (entry point 'myengine'")
    # What is missing, with its signature; the HF copy that does exist; whom to ask.
    assert "its TrainingEngineSpec has no merge_checkpoint" in err
    assert "merge_checkpoint(actor_folder, hf_source, out_folder) -> Path" in err
    assert "<run dir>/final_hf/, with the engine's save_hf" in err
    assert "ask the authors of verl-myengine to add merge_checkpoint" in err
    assert not (tmp_path / "out").exists()
