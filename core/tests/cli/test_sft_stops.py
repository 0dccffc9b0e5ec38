"""``verl sft`` stops cleanly on SIGINT / SIGTERM (issue #36, item 5) and records its checkpoints' health (item 3):
a real ``verl sft`` process on a tiny model, signalled once its first checkpoint exists."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl.testing.tiny import save_tiny_model
from verl.trainer.checkpoint import TRACKER_FILE, read_health

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("sft_stops")
    rows = [{"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(8)]
    pq.write_table(pa.Table.from_pylist(rows), root / "train.parquet")
    return {"root": root, "train": root / "train.parquet", "model": save_tiny_model(root / "model")}


def _command(assets: dict[str, Path], run: Path, steps: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "verl.cli.main",
        "sft",
        f"data.train_files={assets['train']}",
        f"model.path={assets['model']}",
        "data.prompt_key=question",
        "data.response_key=answer",
        "data.train_batch_size=2",
        "data.max_length=128",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=1",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={run}",
    ]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_verl_sft_with_one_line_and_the_rerun_resumes(assets, signum):
    run = assets["root"] / f"run_{signum.name}"
    proc = subprocess.Popen(_command(assets, run, 100000), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 180
    while not (run / TRACKER_FILE).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (run / TRACKER_FILE).exists(), "no checkpoint within 180 s"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("verl sft: ")]
    stop = [line for line in lines if f"verl sft: {signum.name}: stopped at step " in line]
    assert stop and "rerun to resume from" in stop[0], lines
    saved = int((run / TRACKER_FILE).read_text())
    assert f"global_step_{saved} (step {saved})" in stop[0]
    # the checkpoint named is whole (a stop during a save waits for it) and records its health
    health = read_health(run / f"global_step_{saved}")
    assert health is not None and health.weights_finite is True
    assert (health.updates_applied, health.updates_skipped) == (1, 0)  # save_freq=1: one update since the last
    # the rerun resumes from it and finishes
    done = subprocess.run(_command(assets, run, saved + 1), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows == list(range(1, saved + 2))
