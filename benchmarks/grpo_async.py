"""``grpo_step.py --async``: the synchronous loop vs one-step off-policy training, one run, alternating reps.

Both sides run our ``verl train`` with the ``hf`` rollout on a standalone Ray rollout pool (one actor worker,
one rollout worker: ``actor_rollout_ref.rollout.nnodes=1``, ``n_gpus_per_node=1``, ``checkpoint_engine.backend=
broadcast``) and the settings of ``grpo_step.py``; they differ only in ``async_training.staleness_threshold``
(0: ``sync``, 1: ``one-step``). Both follow the same ``old_log_prob`` rule: at ``grpo_step.py``'s one epoch and
one mini-batch, both skip the pass through ``actor.reuse_on_policy_log_prob`` (before issue #20 staleness 1
always ran it; a run that does is counted in its ``one-step`` step and added to the plan below).

The planned figure comes from the ``sync`` side's stage medians (``docs/async.md``): generation overlaps every
other stage of the step, so a step takes about ``max(gen, train) + update_weights`` instead of
``gen + train + update_weights``, where ``train`` = ``step - gen - update_weights`` (reward, log-probs,
advantages, update) and ``+ old_log_prob`` of the ``one-step`` side when the synchronous side skipped it.
"""

from __future__ import annotations

import math
from typing import Any

from common import fmt_share, median_spread

SIDES = ("sync", "one-step")
STANDALONE = [
    "trainer.controller=ray",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=broadcast",
]


def side_overrides(side: str) -> list[str]:
    """The overrides that make ``side`` (``sync`` / ``one-step``), on top of ``grpo_step.our_overrides``.

    Raises:
        ValueError: an unknown side.
    """
    if side not in SIDES:
        raise ValueError(f"unknown --async side {side!r}; known: {SIDES}")
    staleness = 0 if side == "sync" else 1
    return [*STANDALONE, f"async_training.staleness_threshold={staleness}"]


def planned_step_s(stages: dict[str, float], step_s: float, old_log_prob_s: float = 0.0) -> float:
    """One-step off-policy seconds per step planned from a synchronous step's stage times.

    Args:
        stages: the synchronous step's stage seconds (``gen``, ``update_weights``; missing or NaN = 0).
        step_s: the synchronous step's seconds (``timing_s/step``).
        old_log_prob_s: seconds of the old-log-prob pass the off-policy step adds (0 when both run it).

    Returns:
        ``max(gen, train + old_log_prob_s) + update_weights`` with ``train = step_s - gen - update_weights``.
    """

    def val(key: str) -> float:
        x = stages.get(key, 0.0)
        return 0.0 if x is None or math.isnan(x) else float(x)

    gen, sync = val("gen"), val("update_weights")
    train = max(step_s - gen - sync, 0.0) + old_log_prob_s
    return max(gen, train) + sync


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per side: median / min / max of the counted steps (the first step of each run is warm-up) and stages;
    the ``one-step`` row also gets the measured and the planned ratio ``sync / one-step``."""
    rows = []
    for side in SIDES:
        mine = [r for r in runs if r["side"] == side]
        counted = [s for r in mine for s in r["steps"][1:]]
        med, lo, hi = median_spread([s["seconds"] for s in counted])
        names = list(counted[0]["stages"]) if counted else []
        stages = {k: median_spread([s["stages"][k] for s in counted])[0] for k in names}
        rows.append(
            {
                "side": side,
                "runs": len(mine),
                "failed_runs": sum(1 for r in mine if r["returncode"] != 0),
                "counted_steps": len(counted),
                "step_s_median": med,
                "step_s_min": lo,
                "step_s_max": hi,
                "stages_median": stages,
                "response_tokens_median": median_spread([s["response_tokens"] for s in counted])[0],
                "others_cpu_max": max((r["cpu"]["others_cpu"] for r in mine), default=math.nan),
            }
        )
    sync, one = rows
    if sync["counted_steps"] and one["counted_steps"]:
        extra = one["stages_median"].get("old_log_prob", math.nan)
        skipped = math.isnan(sync["stages_median"].get("old_log_prob", math.nan))
        one["planned_step_s"] = planned_step_s(
            sync["stages_median"], sync["step_s_median"], extra if skipped and not math.isnan(extra) else 0.0
        )
        one["sync_over_this_time"] = sync["step_s_median"] / one["step_s_median"]
        one["planned_sync_over_this_time"] = sync["step_s_median"] / one["planned_step_s"]
    return rows


def markdown(result: dict[str, Any]) -> str:
    """The two sides' step times, the planned figure, the stage medians and every run."""
    m, info = result["machine"], result["machine_info"]

    def f(x: Any, spec: str = ".1f") -> str:
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)

    lines = [
        f"machine: {info['cpu']} ({info['isa']}), {info['cores']} cores; fp32 matmul peak {m['fp32_GFLOPs']:.0f} "
        f"GFLOP/s; threads per process {result['threads']} (OMP_NUM_THREADS; the actor and the rollout worker "
        f"are two processes); load average {result['load_avg_start']} -> {result['load_avg_end']}",
        f"protocol: {result['steps']} steps per process (step 1 = warm-up, not counted), {result['reps']} reps "
        "alternating sync / one-step; standalone rollout pool (1 actor + 1 rollout worker, Ray)",
        "",
        "| side | s/step median | min - max | steps | response tokens/step | planned s/step | sync / this | "
        "planned sync / this | others' CPU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["summary"]:
        planned = r.get("planned_sync_over_this_time")
        lines.append(
            f"| {r['side']} | {f(r['step_s_median'])} | {f(r['step_s_min'])} - {f(r['step_s_max'])} | "
            f"{r['counted_steps']} | {f(r['response_tokens_median'], '.0f')} | {f(r.get('planned_step_s'))} | "
            f"{f(r.get('sync_over_this_time'), '.2f')} | {f(planned, '.2f')} | {fmt_share(r['others_cpu_max'])} |"
        )
    names = ("gen", "reward", "old_log_prob", "adv", "update_actor", "update_weights")
    lines += [
        "",
        "Planned = max(gen, train) + update_weights from the sync side's medians (train = step - gen - "
        "update_weights, plus one-step's old_log_prob when sync skipped it). On a CPU the two processes share the "
        "cores, so generation slows training down and the measured figure stays above the planned one; with "
        "devices of their own (GPUs) the planned figure is the target.",
        "",
        "Per-stage medians (s); one-step's gen is the wait for the batch generated during the previous step:",
        "",
        "| side | " + " | ".join(names) + " | step |",
        "|---|" + "---|" * (len(names) + 1),
    ]
    for r in result["summary"]:
        s = r["stages_median"]
        cells = " | ".join(f(s.get(k), ".2f") for k in names)
        lines.append(f"| {r['side']} | {cells} | {f(r['step_s_median'])} |")
    lines += ["", "| run | exit | steps (s; * = warm-up) |", "|---|---|---|"]
    for run in result["runs"]:
        secs = ", ".join(("*" if i == 0 else "") + f"{s['seconds']:.1f}" for i, s in enumerate(run["steps"]))
        lines.append(f"| {run['side']} rep {run['rep']} | {run['returncode']} | {secs or '-'} |")
    return "\n".join(lines)
