"""A small SFT run for engine tests: chat rows and the ``verl sft`` keys of a 5-step run on a tiny model.

The plugins' SFT tests (``plugins/verl-fsdp/tests/test_fsdp_sft.py``, ``plugins/verl-megatron/tests/
test_megatron_sft.py``) run it on their engine over several ranks and compare with the one-process reference
engine on the same keys.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
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


def make_assets(root: Path) -> tuple[Path, Path]:
    """``(root, model)``: the rows of :func:`write_rows` and a tiny model folder under ``root``."""
    from verl.testing.tiny import save_tiny_model

    write_rows(root)
    return root, save_tiny_model(root / "model")


def metrics(run: Path) -> list[dict]:
    """The rows of a run's ``metrics.jsonl``."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def hf_weights(folder: Path) -> dict:
    """The tensors of a HF folder's ``model.safetensors`` (``final_hf/``)."""
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def reference_run(root: Path, model: Path, run: Path, *extra: str) -> tuple[list[dict], dict]:
    """The oracle: the run on the one-process reference engine, in this process; ``(metrics, final weights)``."""
    from verl.config.sft_loader import load_sft_config
    from verl.trainer.sft_trainer import SFTTrainer

    SFTTrainer(load_sft_config(None, overrides(root, model, run, *extra))).fit()
    return metrics(run), hf_weights(run / "final_hf")


def launch(root: Path, model: Path, run: Path, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m verl.trainer.sft_trainer <the run's keys> *extra`` as a user starts it (outside any torchrun
    world: ``verl sft`` starts torchrun itself for ``trainer.n_gpus_per_node > 1``), one thread per process.

    Raises:
        AssertionError: the command failed (with the end of its output).
    """
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    cmd = [sys.executable, "-m", "verl.trainer.sft_trainer", *overrides(root, model, run, *extra)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc
