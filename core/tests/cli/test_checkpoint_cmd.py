"""``verl checkpoint convert|verify`` on hand-built checkpoints of the old pickle format (an SFT one: its
``data.pt`` holds the loop state with the RNG state) and of the new one."""

from __future__ import annotations

import json
import random

import numpy as np
import torch

from verl.cli.main import main as verl_main
from verl.engines.reference.checkpoint_files import load_engine_state
from verl.trainer.checkpoint import verify_checkpoint
from verl.trainer.rng_state import capture_rng_state, rng_state_from_json, rng_state_to_json


def _old_sft_checkpoint(root, *, nan: bool = False):
    folder = root / "global_step_2"
    (folder / "actor" / "huggingface").mkdir(parents=True)
    (folder / "actor" / "huggingface" / "config.json").write_text("{}")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    if nan:
        with torch.no_grad():
            model.bias[0] = float("nan")
    state = {
        "model": model.state_dict(),
        "lora": False,
        "global_step": 2,
        "skipped_steps": 0,
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": {"last_epoch": 2, "base_lrs": [0.01]},
    }
    torch.save(state, folder / "actor" / "model_world_size_1_rank_0.pt")  # what the code before wrote
    random.seed(1)
    np.random.seed(1)
    loop = {
        "global_step": 2,
        "total_tokens": 123,
        "sampler": {"epoch": 0, "batch_in_epoch": 2, "seed": 1},
        "rng": capture_rng_state(),
        "engine": "reference",
        "world_size": 1,
    }
    torch.save(loop, folder / "data.pt")
    return folder, state, loop


def test_convert_an_old_sft_checkpoint_then_verify(tmp_path, capsys):
    folder, state, loop = _old_sft_checkpoint(tmp_path)
    assert verl_main(["checkpoint", "verify", str(tmp_path)]) == 1
    assert "data.pt: is in the old pickle format" in capsys.readouterr().out

    assert verl_main(["checkpoint", "convert", str(folder), "--trust-pickle"]) == 0
    assert "old pickle files deleted" in capsys.readouterr().out
    assert not list(folder.rglob("model_world_size_1_rank_0.pt")) and not (folder / "data.pt").exists()
    assert (folder / "actor" / "huggingface" / "config.json").read_text() == "{}"  # other files copied as they were
    data = json.loads((folder / "data.json").read_text())
    assert {k: v for k, v in data.items() if k != "rng"} == {k: v for k, v in loop.items() if k != "rng"}
    assert rng_state_to_json(rng_state_from_json(data["rng"])) == rng_state_to_json(loop["rng"])
    back = load_engine_state(folder / "actor", 1, 0)
    assert all(torch.equal(back["model"][k], v) for k, v in state["model"].items())
    assert back["lr_scheduler"] == state["lr_scheduler"]
    manifest = verify_checkpoint(folder)
    assert manifest["health"] == {"weights_finite": True, "updates_applied": None, "updates_skipped": None,
                                  "nonfinite": []}  # fmt: skip
    assert not list(tmp_path.glob("global_step_2.*"))  # no scratch or old folder left

    assert verl_main(["checkpoint", "convert", str(folder), "--trust-pickle"]) == 0  # already converted: verified
    assert "already in the data-only format" in capsys.readouterr().out
    (folder / "data.json").write_text(
        (folder / "data.json").read_text().replace('"total_tokens": 123', '"total_tokens": 124')
    )
    assert verl_main(["checkpoint", "verify", str(folder)]) == 1
    assert "data.json: is corrupt" in capsys.readouterr().out


def test_convert_records_non_finite_weights_and_keeps_the_old_folder(tmp_path, capsys):
    folder, _, _ = _old_sft_checkpoint(tmp_path, nan=True)
    assert verl_main(["checkpoint", "convert", str(tmp_path), "--trust-pickle", "--keep-old"]) == 0
    assert (tmp_path / "global_step_2.legacy-pickle" / "data.pt").is_file()
    assert verify_checkpoint(folder)["health"]["nonfinite"] == ["actor:bias"]
    assert verl_main(["checkpoint", "verify", str(folder)]) == 0
    assert "non-finite weights (actor:bias)" in capsys.readouterr().out


def test_convert_without_trust_loads_nothing(tmp_path, capsys):
    folder, _, _ = _old_sft_checkpoint(tmp_path)
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert verl_main(["checkpoint", "convert", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "data.pt, actor/model_world_size_1_rank_0.pt" in err and "--trust-pickle" in err
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before
