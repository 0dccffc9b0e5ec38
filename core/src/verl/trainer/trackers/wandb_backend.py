"""``trainer.logger=[..., wandb]``: Weights & Biases, as verl's ``wandb`` backend (verl/utils/tracking.py).

``wandb.init(project=trainer.project_name, name=trainer.experiment_name, entity=$WANDB_ENTITY,
config=<resolved config>)``; wandb's own variables apply unchanged (``WANDB_API_KEY``, ``WANDB_MODE=offline``,
``WANDB_PROJECT`` is overridden by the argument, ...). Files go to ``$WANDB_DIR`` when set, else to the run
directory (``{run_dir}/wandb/``), next to ``metrics.jsonl``: verl leaves wandb's default, the working directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from verl.trainer.trackers.values import scalars, to_json_safe

Sample = tuple[str, str, float]


class WandbBackend:
    """Scalars via ``run.log(data, step=step)``; validation samples as the table ``val/generations``.

    The table grows one row per validation: ``step, input_1, output_1, score_1, ..., input_k, ...`` (verl's
    layout, re-created each time because wandb tables are immutable once logged).

    Raises:
        ImportError: wandb is not installed (:func:`verl.trainer.trackers.check_installed` catches that first).
    """

    def __init__(
        self, project_name: str, experiment_name: str, run_dir: Path, config_dict: Mapping[str, Any] | None
    ) -> None:
        import wandb

        self._wandb = wandb
        directory = os.environ.get("WANDB_DIR") or str(run_dir)
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project_name,
            name=experiment_name,
            entity=os.environ.get("WANDB_ENTITY"),
            config=to_json_safe(dict(config_dict)) if config_dict is not None else None,
            dir=directory,
        )
        self._rows: list[list[Any]] = []
        self._columns: list[str] | None = None

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.run.log(scalars(data), step=step)

    def log_generations(self, samples: Sequence[Sample], step: int) -> None:
        columns = ["step"] + [f"{kind}_{i + 1}" for i in range(len(samples)) for kind in ("input", "output", "score")]
        if columns != self._columns:  # a different sample count cannot share the earlier rows' columns
            self._columns, self._rows = columns, []
        self._rows.append([step] + [item for inp, out, score in samples for item in (str(inp), str(out), float(score))])
        table = self._wandb.Table(columns=columns, data=[list(row) for row in self._rows])
        self.run.log({"val/generations": table}, step=step)

    def close(self, exit_code: int = 0) -> None:
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None
