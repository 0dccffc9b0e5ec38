"""``trainer.logger=[..., swanlab]``: SwanLab, as verl's ``swanlab`` backend (verl/utils/tracking.py).

Environment, as verl: ``SWANLAB_API_KEY`` (logs in first when set), ``SWANLAB_MODE`` (``cloud`` default,
``local``, ``offline``, ``disabled``), ``SWANLAB_LOG_DIR`` (where swanlab writes its run files; verl's
default is ``swanlog`` in the working directory, here ``{run_dir}/swanlog``). The config is sent as
``{"FRAMEWORK": "verl", **config}``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from verl.trainer.trackers.values import scalars, to_json_safe

Sample = tuple[str, str, float]


class SwanlabBackend:
    """Scalars via ``swanlab.log(data, step=step)``; validation samples as an ECharts table.

    Raises:
        RuntimeError: from swanlab, e.g. ``SWANLAB_MODE=cloud`` without a login and without a terminal to ask.
    """

    def __init__(
        self, project_name: str, experiment_name: str, run_dir: Path, config_dict: Mapping[str, Any] | None
    ) -> None:
        import swanlab

        self._swanlab = swanlab
        api_key = os.environ.get("SWANLAB_API_KEY")
        if api_key:
            swanlab.login(api_key)  # replaces any earlier login, as in verl
        log_dir = os.environ.get("SWANLAB_LOG_DIR") or str(run_dir / "swanlog")
        config = to_json_safe(dict(config_dict)) if config_dict is not None else {}
        self.run = swanlab.init(
            project=project_name,
            experiment_name=experiment_name,
            config={"FRAMEWORK": "verl", **config},
            logdir=log_dir,
            mode=os.environ.get("SWANLAB_MODE", "cloud"),
        )
        self.log_dir = Path(log_dir)
        self._open = True

    def log(self, data: Mapping[str, Any], step: int) -> None:
        numbers = scalars(data)
        if numbers:
            self._swanlab.log(numbers, step=step)

    def log_generations(self, samples: Sequence[Sample], step: int) -> None:
        table = self._swanlab.echarts.Table()
        rows = [[step, str(inp), str(out), float(score)] for inp, out, score in samples]
        table.add(headers=["step", "input", "output", "score"], rows=rows)
        self._swanlab.log({"val/generations": table}, step=step)

    def close(self, exit_code: int = 0) -> None:
        if self._open:
            self._open = False
            self._swanlab.finish(state="success" if exit_code == 0 else "crashed")
