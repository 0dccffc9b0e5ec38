"""``verl data gsm8k --sft`` and ``verl sft`` through the real ``verl`` entry point (tiny model)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verl.cli.main import main
from verl.data.gsm8k import INSTRUCTION
from verl.testing.tiny import save_tiny_model


def test_gsm8k_sft_rows_then_one_sft_step_on_them(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "src"
    src.mkdir()
    answers = [f"{i} + 1 = <<{i}+1={i + 1}>>{i + 1}\n#### {i + 1}" for i in range(4)]
    (src / "train.jsonl").write_text(
        "".join(json.dumps({"question": f"What is {i} + 1?", "answer": a}) + "\n" for i, a in enumerate(answers))
    )
    (src / "test.jsonl").write_text(json.dumps({"question": "t?", "answer": "#### 9"}) + "\n")
    out = tmp_path / "sft"
    assert main(["data", "gsm8k", "--sft", "--out", str(out), "--source", str(src)]) == 0
    rows = pq.read_table(out / "train.parquet").to_pylist()
    question = f"What is 2 + 1? {INSTRUCTION}"
    assert rows[2]["messages"] == [{"role": "user", "content": question}, {"role": "assistant", "content": answers[2]}]
    assert (rows[2]["question"], rows[2]["answer"]) == (question, answers[2])
    assert main(["data", "gsm8k", "--sft", "--tools", "--out", str(out), "--source", str(src)]) == 2

    model = save_tiny_model(tmp_path / "model")
    run = tmp_path / "run"
    common = [
        f"data.train_files={out / 'train.parquet'}",
        f"model.path={model}",
        "data.train_batch_size=2",
        "data.max_length=256",
        "trainer.total_training_steps=1",
        f"trainer.default_local_dir={run}",
        "trainer.logger=[console,file]",
    ]
    capsys.readouterr()
    assert main(["sft", "data.prompt_key=question", *common]) == 2  # response_key missing
    assert "data.response_key: single-turn rows need both" in capsys.readouterr().err
    assert main(["sft", "data.prompt_key=question", "data.response_key=answer", *common]) == 0
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["train/loss"] > 0
    assert f"loss {row['train/loss']:.4g}" in capsys.readouterr().out  # the console line shows the SFT loss
    assert (run / "final_hf" / "config.json").is_file() and (run / "global_step_1").is_dir()
