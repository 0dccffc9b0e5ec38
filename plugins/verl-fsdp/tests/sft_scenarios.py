"""SFT on the FSDP engine, as a script: shared assets and config for ``test_fsdp_sft.py``, and (run as
``python sft_scenarios.py ROOT MODEL RUN_DIR [key=value ...]`` on each of 2 ranks) an SFT run stopped after its
step-2 checkpoint and resumed in the same processes. Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

STEPS = 5  # 3 steps per epoch (12 rows, 4 per step): the run crosses an epoch


def conversation(rng: random.Random, turns: int) -> list[dict]:
    msgs = []
    for _ in range(turns):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        msgs += [{"role": "user", "content": f"{a}+{b}="}, {"role": "assistant", "content": str(a + b)}]
    return msgs


def write_rows(root: Path) -> None:
    """``train.jsonl`` (12 rows) and ``val.jsonl`` (5 rows: not a multiple of the 2 ranks) of 1-3 turn chats."""
    rng = random.Random(0)
    for name, n in (("train", 12), ("val", 5)):
        rows = [{"messages": conversation(rng, 1 + i % 3)} for i in range(n)]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def overrides(root: Path, model: Path, run: Path, *extra: str) -> list[str]:
    """The run's ``verl sft`` keys: 4 rows per step, micro-batches of 1 row, packed, cosine lr with warmup."""
    return [
        f"data.train_files={root / 'train.jsonl'}",
        f"data.val_files={root / 'val.jsonl'}",
        f"model.path={model}",
        "model.enable_gradient_checkpointing=false",
        "data.train_batch_size=4",
        "data.micro_batch_size_per_gpu=1",
        "data.use_dynamic_bsz=false",
        "data.max_length=128",
        f"trainer.total_training_steps={STEPS}",
        "trainer.save_freq=2",
        "trainer.test_freq=2",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={run}",
        "optim.lr=1e-2",
        "optim.lr_scheduler_type=cosine",
        "optim.lr_warmup_steps=1",
        *extra,
    ]


class _Stop(Exception):
    pass


def main(root: str, model: str, run: str, *extra: str) -> None:
    from verl.config.sft_loader import load_sft_config
    from verl.trainer.sft_trainer import SFTTrainer

    def stop_at_2(step: int, metrics: dict) -> None:
        if step == 2:
            raise _Stop

    cfg = load_sft_config(None, overrides(Path(root), Path(model), Path(run), *extra))
    try:
        SFTTrainer(cfg).fit(on_step=stop_at_2)
        raise AssertionError("the run did not stop at step 2")
    except _Stop:
        pass
    SFTTrainer(cfg).fit()  # resumes from global_step_2


if __name__ == "__main__":
    main(*sys.argv[1:])
