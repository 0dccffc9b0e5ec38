"""Process-level guarantees: cheap import, and a hung scorer never blocks interpreter exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.multiprocess


def _run(code: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout
    )


def test_import_rewards_does_not_import_torch():
    result = _run(
        """
        import sys
        import verl.rewards
        from verl.rewards import default_compute_score
        assert default_compute_score("openai/gsm8k", "#### 1", "1")["score"] == 1.0
        print("torch" in sys.modules)
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_hung_scorer_does_not_block_exit():
    # The scorer sleeps for 120 s; the manager gives up after 0.2 s and the process must exit right after.
    start = time.monotonic()
    result = _run(
        """
        import time
        import numpy as np
        import torch
        from verl.protocol import DataProto
        from verl.rewards import RewardManager

        class Tok:
            def decode(self, ids, skip_special_tokens=True):
                return "".join(map(chr, ids))

        def scorer(data_source, solution_str, ground_truth, extra_info=None):
            time.sleep(120)
            return 1.0

        data = DataProto.from_dict(
            tensors={"responses": torch.tensor([[104, 105]]), "response_mask": torch.ones(1, 2, dtype=torch.long)},
            non_tensors={"data_source": np.array(["s"], dtype=object),
                         "reward_model": np.array([{"ground_truth": "hi"}], dtype=object)},
        )
        # The one sample times out: tolerate an all-failed call, this test is about the exit.
        out = RewardManager(Tok(), compute_score=scorer, timeout_s=0.2, stop_on_all_failed=False)(data, return_dict=True)
        print(out["metrics"]["reward/timeouts"])
        """,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"
    assert time.monotonic() - start < 60
