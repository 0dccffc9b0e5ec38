"""metrics.jsonl keeps one row per step when validation is merged into the step's row, at every crash point.

``FileBackend.update`` writes the merged row to ``metrics.jsonl.merge`` first, then truncates and rewrites the
last line, then removes the journal. Each crash point is reproduced by writing the files a killed process would
leave; the next backend must end with the merged row exactly once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl.trainer.tracking import METRICS_FILE, FileBackend, Tracking

TRAIN = {"critic/score/mean": 0.5, "actor/pg_loss": -0.1}
VAL = {"val-core/openai/gsm8k/acc/mean@1": 0.25, "timing_s/testing": 1.5}


def _lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]


def test_update_merges_into_the_last_row_of_that_step(tmp_path):
    backend = FileBackend(tmp_path)
    backend.log({"val-core/x": 0.1}, step=0)
    backend.log(TRAIN, step=1)
    backend.update(VAL, step=1)
    backend.log(TRAIN, step=2)
    backend.update({"critic/score/mean": float("nan"), **VAL}, step=2)  # a later key wins; NaN -> null
    backend.close()
    rows = _lines(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[1] == {"step": 1, **TRAIN, **VAL}
    assert rows[2] == {"step": 2, **TRAIN, **VAL, "critic/score/mean": None}
    assert not (tmp_path / (METRICS_FILE + ".merge")).exists()


def test_update_of_another_step_appends_a_row(tmp_path):
    backend = FileBackend(tmp_path)
    backend.log(TRAIN, step=3)
    backend.update(VAL, step=4)  # step 4 has no row: a row of its own
    backend.close()
    assert [r["step"] for r in _lines(tmp_path)] == [3, 4]
    assert _lines(tmp_path)[1] == {"step": 4, **VAL}


def test_a_new_process_merges_into_the_row_an_earlier_one_wrote(tmp_path):
    first = FileBackend(tmp_path)
    first.log(TRAIN, step=1)
    first.log({**TRAIN, "pad": "x" * 200_000}, step=2)  # longer than one 64 KiB read-back chunk
    first.close()
    second = FileBackend(tmp_path)
    second.update(VAL, step=2)
    second.close()
    rows = _lines(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1] == {"step": 2, **TRAIN, "pad": "x" * 200_000, **VAL}


def _crash_state(tmp_path: Path, point: str) -> None:
    """The files a process killed at ``point`` of ``update(VAL, step=2)`` leaves behind."""
    row1 = json.dumps({"step": 1, **TRAIN})
    row2 = json.dumps({"step": 2, **TRAIN})
    merged = json.dumps({"step": 2, **TRAIN, **VAL})
    journal = tmp_path / (METRICS_FILE + ".merge")
    if point == "journal_being_written":  # the temp file of the journal, never renamed into place
        (tmp_path / METRICS_FILE).write_text(f"{row1}\n{row2}\n")
        (tmp_path / f"{journal.name}.tmp-99999").write_text(merged[:10])
    elif point == "journal_written":
        (tmp_path / METRICS_FILE).write_text(f"{row1}\n{row2}\n")
        journal.write_text(merged + "\n")
    elif point == "truncated":
        (tmp_path / METRICS_FILE).write_text(f"{row1}\n")
        journal.write_text(merged + "\n")
    elif point == "half_rewritten":
        (tmp_path / METRICS_FILE).write_text(f"{row1}\n{merged[:25]}")
        journal.write_text(merged + "\n")
    elif point == "rewritten":  # only the journal's removal was missing
        (tmp_path / METRICS_FILE).write_text(f"{row1}\n{merged}\n")
        journal.write_text(merged + "\n")
    else:
        raise AssertionError(point)


@pytest.mark.parametrize("point", ["journal_written", "truncated", "half_rewritten", "rewritten"])
def test_an_update_interrupted_anywhere_is_finished_by_the_next_backend(tmp_path, point):
    _crash_state(tmp_path, point)
    FileBackend(tmp_path).close()
    assert _lines(tmp_path) == [{"step": 1, **TRAIN}, {"step": 2, **TRAIN, **VAL}]
    assert sorted(p.name for p in tmp_path.iterdir()) == [METRICS_FILE]


def test_a_journal_never_published_is_dropped_and_the_old_row_kept(tmp_path):
    _crash_state(tmp_path, "journal_being_written")
    FileBackend(tmp_path).close()
    assert _lines(tmp_path) == [{"step": 1, **TRAIN}, {"step": 2, **TRAIN}]
    assert sorted(p.name for p in tmp_path.iterdir()) == [METRICS_FILE]


def test_tracking_update_merges_in_the_file_and_logs_elsewhere(tmp_path, capsys):
    tracking = Tracking("p", "e", backends=["file", "console"], run_dir=tmp_path, total_steps=2)
    tracking.log(TRAIN, step=1)
    tracking.update(VAL, step=1)
    assert tracking.rows() == [{"step": 1, **TRAIN, **VAL}]
    tracking.finish()
    out = capsys.readouterr().out.splitlines()
    # The console prints both calls: the training line, then the validation one of the same step.
    assert out[0].startswith("step 1/2 | score 0.5") and out[1].startswith("step 1/2 | val-core/openai")
    assert Tracking("p", "e", backends=["console"], run_dir=tmp_path).rows() is None


def test_rows_skip_a_torn_line(tmp_path):
    (tmp_path / METRICS_FILE).write_text(json.dumps({"step": 1, "a": 1.0}) + '\n{"step": 2, "a"')
    backend = FileBackend(tmp_path)
    assert backend.rows() == [{"step": 1, "a": 1.0}]
    backend.close()
