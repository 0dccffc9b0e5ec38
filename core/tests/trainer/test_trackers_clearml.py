"""clearml backend in offline mode: the events and configuration ClearML stores in its offline session folder.

The run happens in a child process: ``Task.init`` hooks frameworks process-wide (torch.save, matplotlib,
argparse, stdout), which must not leak into the other tests of this session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("clearml")

CHILD = textwrap.dedent(
    """
    import json, sys
    import clearml
    from verl.trainer.tracking import Tracking

    clearml.Task.set_offline(True)
    config = {"trainer": {"total_epochs": 3}, "algorithm": {"adv_estimator": "grpo"}}
    tracking = Tracking("proj", "exp", ["clearml"], sys.argv[1], config_dict=config)
    tracking.log({"critic/score/mean": 0.25, "loss": 2.0, "note": "text"}, step=1)
    tracking.log({"critic/score/mean": 0.75}, step=2)
    tracking.log_generations([("q1", "a1", 1.0), ("q2", "a2", 0.0)], step=2)
    print(json.dumps({"folder": str(tracking.backends["clearml"].task.get_offline_mode_folder())}))
    tracking.close()
    """
)


def test_scalars_config_and_table_reach_the_offline_session(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path / "home"), "CLEARML_OFFLINE_MODE": "1"}
    for key in ("CLEARML_API_HOST", "CLEARML_CONFIG_FILE", "CLEARML_CACHE_DIR"):
        env.pop(key, None)
    # Script and working directory outside any git checkout: ClearML's repository detection (git status and
    # git diff of the checkout holding the script) of this repo can take minutes.
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env["GIT_CEILING_DIRECTORIES"] = str(tmp_path.parent)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run")],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = Path(next(json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))["folder"])
    events = [e for line in (folder / "metrics.jsonl").read_text().splitlines() for e in json.loads(line)]
    scalars = sorted(
        (e["metric"], e["variant"], e["iter"], e["value"]) for e in events if e["type"] == "training_stats_scalar"
    )
    assert scalars == [("critic", "score/mean", 1, 0.25), ("critic", "score/mean", 2, 0.75), ("loss", "loss", 1, 2.0)]
    (table,) = [e for e in events if e["type"] == "plot" and e["metric"] == "Validation"]
    assert table["variant"] == "Validation generations" and table["iter"] == 2
    cells = json.loads(table["plot_str"])["data"][0]["cells"]["values"]  # one list per column
    assert cells == [[2, 2], ["q1", "q2"], ["a1", "a2"], [1.0, 0.0]]
    task = json.loads((folder / "task.json").read_text())
    assert task["name"] == "exp"
    from clearml.utilities.pyhocon import ConfigFactory  # ClearML stores a dict configuration as HOCON text

    configuration = ConfigFactory.parse_string(task["configuration"]["Hyperparameters"]["value"])
    assert configuration.as_plain_ordered_dict() == {
        "trainer": {"total_epochs": 3},
        "algorithm": {"adv_estimator": "grpo"},
    }
