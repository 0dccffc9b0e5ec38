"""An SFT run stopped after its step-2 checkpoint and resumed in the same processes, as a script for
``test_fsdp_sft.py`` (``python sft_scenarios.py ROOT MODEL RUN_DIR [key=value ...]`` on each of 2 ranks; the run's
keys are :mod:`verl.testing.sft`'s). Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import sys
from pathlib import Path

from verl.testing.sft import overrides


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
