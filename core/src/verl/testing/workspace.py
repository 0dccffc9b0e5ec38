"""A tiny, download-free `verl train` workspace for end-to-end tests: GSM8K rows, a tiny model, a reward."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from verl.testing.tiny import save_tiny_model

#: A scorer that varies between samples of a random tiny model (share of digits), so advantages are
#: non-zero and the weights really move.
DIGIT_SHARE_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Share of digits in the response: varies between samples of a random model."""
    if not solution_str:
        return 0.0
    return sum(c.isdigit() for c in solution_str) / len(solution_str)
'''


def make_gsm8k_workspace(
    root: str | Path,
    *,
    train: int,
    test: int,
    max_question_chars: int = 220,
    reward_source: str | None = DIGIT_SHARE_REWARD,
    model: str | Path | None = None,
) -> dict[str, Path]:
    """Write the first short GSM8K questions (shipped copy) as verl parquet, a tiny model and a reward file.

    Args:
        root: folder to fill (created).
        train / test: number of questions per split (those shorter than ``max_question_chars``).
        reward_source: Python source of ``compute_score`` written to ``reward.py``; ``None`` = none.
        model: an existing model folder to use instead of saving a new tiny model.

    Returns:
        ``{"root", "model", "train", "test"}`` (+ ``"reward"``) paths.
    """
    from verl.data.gsm8k import default_source_dir, prepare_gsm8k

    root = Path(root)
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train), ("test", test)):
        with gzip.open(default_source_dir() / f"{split}.jsonl.gz", "rt") as fh:
            rows = [line for line in fh if len(json.loads(line)["question"]) < max_question_chars][:count]
        (src / f"{split}.jsonl").write_text("".join(rows))
    files = prepare_gsm8k(root / "data", source_dir=src)
    out = {"root": root, "model": Path(model) if model is not None else save_tiny_model(root / "tiny"), **files}
    if reward_source is not None:
        out["reward"] = root / "reward.py"
        out["reward"].write_text(reward_source)
    return out


# Metrics that measure the machine (wall clock, memory), not the run: equal runs differ in them.
MACHINE_METRIC_PREFIXES = (
    "timing_s/",
    "timing_per_token_ms/",
    "perf/throughput",
    "perf/time_per_step",
    "perf/update_actor_s",
    "perf/update_critic_s",
    "perf/max_memory_",
    "perf/cpu_memory_used_gb",
    "memory/",
    "weight_sync/seconds",
)


def run_metrics(row: dict) -> dict:
    """A ``metrics.jsonl`` row without :data:`MACHINE_METRIC_PREFIXES`: what two equal runs must agree on."""
    return {k: v for k, v in row.items() if not k.startswith(MACHINE_METRIC_PREFIXES)}
