"""Turn a `verl train` run directory into a results page: score curve PNG, per-step table, learning test.

    pip install './core[plot]'   # matplotlib, for the PNG
    python scripts/results_page.py RUN_DIR OUT_MD [--title TITLE] [--command "verl train ..."] \
        [--compare OTHER_RUN_DIR | --compare-page OTHER_PAGE.md] [--compare-label GRPO]

Reads ``RUN_DIR/metrics.jsonl`` (per-step metrics, validation rows) and, when the run set
``trainer.rollout_data_dir=RUN_DIR/rollouts``, the per-sample scores of every step. The
learning test is the one the project uses: the mean training score over the last quarter
of steps must exceed the first quarter's by more than two standard errors of the
difference, ``SE = sqrt(var_first / n_first + var_last / n_last)`` over per-sample scores
(per-step means when no sample dump exists).

``--compare-page`` compares with an earlier results page when its run directory is gone: the score and
``step_s`` columns of its "Per step" table. Runs with agent loops (``rollout.mode=async``) get an "Agent
loop" section from the ``num_turns/*`` and ``tool/*`` metrics.

Runs with DAPO's dynamic sampling (``algorithm.filter_groups.enable``) train on selected groups only, so their
``critic/score/mean`` (and the rollout dump) overstate what the policy produces. When the filter metric is the
score (``score`` or ``seq_reward``), the learning test and the comparison use
``train/filter_groups/metric_mean`` instead, the score of every response the step generated before the filter
(per-step means), and a "Dynamic sampling" section lists rounds and group counts per step.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from pathlib import Path


def _is_val_key(key: str) -> bool:
    """The validation columns: verl's core metric, and the mean reward (format credit included) beside it."""
    return key.startswith("val-core/") or (key.startswith("val-aux/") and key.endswith("/reward/mean@1"))


def load_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def sample_scores(run_dir: Path, step: int) -> list[float] | None:
    path = run_dir / "rollouts" / f"{step}.jsonl"
    if not path.exists():
        return None
    return [float(json.loads(line)["score"]) for line in path.read_text().splitlines() if line.strip()]


def page_rows(page: Path) -> list[dict]:
    """Per-step rows (``step``, ``critic/score/mean``, ``timing_s/step``) from a results page's "Per step" table."""
    lines = page.read_text().splitlines()
    start = lines.index("## Per step")
    header = [c.strip() for c in lines[start + 2].strip("|").split("|")]
    rows = []
    for line in lines[start + 4 :]:
        if not line.startswith("|"):
            break
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        rows.append(
            {
                "step": int(cells["step"]),
                "critic/score/mean": float(cells["score"]),
                "timing_s/step": float(cells["step_s"]),
            }
        )
    if not rows:
        raise ValueError(f"{page}: no rows under its '## Per step' table")
    return rows


AGENT_KEYS = (
    "num_turns/mean",
    "tool/calls",
    "tool/call_rate",
    "tool/parse_errors",
    "tool/errors",
    "tool/timeouts",
    "tool/truncated",
    "agent_loop/tool_token_ratio",
)


def agent_section(run_dir: Path, steps: list[dict]) -> list[str]:
    """Markdown: per-step agent-loop metrics and the share of dumped samples that wrote a ``<tool_call>``."""
    keys = [k for k in AGENT_KEYS if k in steps[0]]
    lines = [
        "",
        "## Agent loop",
        "",
        "Per step, from the trainer's metrics (`tool/call_rate`: calls per sample; `num_turns`: chat turns per "
        "sample, the prompt's included). `wrote <tool_call>`: share of the step's dumped samples whose response "
        "contains the tag at all (a malformed call counts here and in `parse_errors`).",
        "",
        "| step | " + " | ".join(keys) + " | wrote <tool_call> |",
        "|---" * (len(keys) + 2) + "|",
    ]
    for r in steps:
        path = run_dir / "rollouts" / f"{r['step']}.jsonl"
        tagged = "n/a"
        if path.exists():
            outs = [json.loads(x)["output"] for x in path.read_text().splitlines() if x.strip()]
            tagged = f"{sum('<tool_call>' in o for o in outs)}/{len(outs)}"
        lines.append(f"| {r['step']} | " + " | ".join(f"{r[k]:.3f}" for k in keys) + f" | {tagged} |")
    totals = {k: sum(r[k] for r in steps) for k in ("tool/calls", "tool/parse_errors", "tool/errors") if k in steps[0]}
    if totals:
        lines += ["", "Over the run: " + ", ".join(f"{k} {v:g}" for k, v in totals.items()) + "."]
    return lines


FILTER_KEYS = (
    "train/num_gen_batches",
    "train/filter_groups/kept",
    "train/filter_groups/dropped",
    "train/filter_groups/surplus",
)


def unfiltered_steps(steps: list[dict], config: str) -> list[dict] | None:
    """The steps with ``critic/score/mean`` = the score before DAPO's filter, or None when not applicable.

    Applies when the run filtered groups on the score itself (``metric: score`` or ``seq_reward`` in its
    config.yaml) and logged ``train/filter_groups/metric_mean``; the trained batch's score is kept as
    ``trained_score``.
    """
    import yaml

    fg = (yaml.safe_load(config).get("algorithm") or {}).get("filter_groups") or {}
    if not fg.get("enable") or fg.get("metric") not in ("score", "seq_reward"):
        return None
    if "train/filter_groups/metric_mean" not in steps[0]:
        return None
    return [
        {**r, "trained_score": r["critic/score/mean"], "critic/score/mean": r["train/filter_groups/metric_mean"]}
        for r in steps
    ]


def filter_section(steps: list[dict], gen_batch_size: int, n: int) -> list[str]:
    """Markdown: per-step generation rounds, group counts and the score before / after the filter."""
    lines = [
        "",
        "## Dynamic sampling",
        "",
        f"Per step: generation rounds of {gen_batch_size} prompts x {n} samples, groups kept (score spread) and "
        "dropped (all samples scored the same) over the rounds, kept groups cut away (surplus); the score of every "
        "generated sample, of the first round's only, and of the trained (kept) groups.",
        "",
        "| step | rounds | kept | dropped | surplus | score, all generated | first round | trained groups | gen_s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in steps:
        counts = " | ".join(f"{r[k]:g}" for k in FILTER_KEYS)
        lines.append(
            f"| {r['step']} | {counts} | {r['critic/score/mean']:.3f} | "
            f"{r['train/filter_groups/metric_mean_first_round']:.3f} | {r['trained_score']:.3f} | "
            f"{r['timing_s/gen']:.1f} |"
        )
    rounds = [r["train/num_gen_batches"] for r in steps]
    kept = sum(r["train/filter_groups/kept"] for r in steps)
    dropped = sum(r["train/filter_groups/dropped"] for r in steps)
    lines += [
        "",
        f"Over the run: {sum(rounds)} rounds for {len(steps)} steps (mean {sum(rounds) / len(steps):.2f}, "
        f"max {max(rounds)}); {kept} of {kept + dropped} generated groups had a spread "
        f"({kept / max(1, kept + dropped):.1%}).",
    ]
    return lines


def mean_var(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, var


def learning_test(run_dir: Path, steps: list[dict], *, use_dump: bool = True) -> dict:
    """First vs last quarter of steps: means, standard error of the difference, verdict.

    ``use_dump=False``: per-step means of ``critic/score/mean`` even when a sample dump exists (a filtered run's
    dump holds the selected groups only).
    """
    q = max(1, len(steps) // 4)
    first, last = steps[:q], steps[-q:]

    def pool(rows: list[dict]) -> tuple[list[float], str]:
        per_sample = [sample_scores(run_dir, r["step"]) if use_dump else None for r in rows]
        if all(s is not None for s in per_sample):
            return [x for s in per_sample for x in s], "samples"
        return [r["critic/score/mean"] for r in rows], "step means"

    a, unit = pool(first)
    b, _ = pool(last)
    (ma, va), (mb, vb) = mean_var(a), mean_var(b)
    se = math.sqrt(va / len(a) + vb / len(b))
    return {
        "quarter_steps": q,
        "unit": unit,
        "first": (ma, len(a)),
        "last": (mb, len(b)),
        "diff": mb - ma,
        "se": se,
        "z": (mb - ma) / se if se > 0 else float("inf"),
        "learns": (mb - ma) > 2 * se,
    }


def plot(
    steps: list[dict],
    vals: list[dict],
    out_png: Path,
    title: str,
    other: list[dict] | None = None,
    other_label: str = "other",
) -> None:
    """The score panel of a run's metrics.png (:func:`verl.trainer.trackers.curves.draw_score`), alone."""
    from verl.trainer.trackers.curves import draw_score, new_figure, save_figure

    fig, (ax,) = new_figure(1, figsize=(7, 4))
    draw_score(ax, [*steps, *vals], other, other_label)
    ax.set_title(title)
    save_figure(fig, out_png)


def comparison(
    run_dir: Path, steps: list[dict], other_dir: Path, other: list[dict], label: str, *, use_dump: bool = True
) -> list[str]:
    """Markdown: this run vs ``other`` per step and per wall-clock minute (training score)."""
    mine, theirs = learning_test(run_dir, steps, use_dump=use_dump), learning_test(other_dir, other)

    def elapsed(rows: list[dict]) -> list[float]:
        total, out = 0.0, []
        for r in rows:
            total += r["timing_s/step"]
            out.append(total / 60)
        return out

    t_mine, t_theirs = elapsed(steps), elapsed(other)
    budget = min(t_mine[-1], t_theirs[-1])

    def within(rows: list[dict], times: list[float]) -> list[dict]:
        return [r for r, t in zip(rows, times, strict=True) if t <= budget + 1e-9]

    def last_quarter_mean(rows: list[dict]) -> float:
        q = max(1, len(rows) // 4)
        return sum(r["critic/score/mean"] for r in rows[-q:]) / q

    a, b = within(steps, t_mine), within(other, t_theirs)
    return [
        "",
        f"## Compared with {label}",
        "",
        "Training score (`critic/score/mean`, the same scorer in both runs"
        + ("; this run's: `train/filter_groups/metric_mean`, before the filter" if not use_dump else "")
        + f"). {label}: `{other_dir}`.",
        "",
        "| | this run | " + label + " |",
        "|---|---|---|",
        f"| steps | {len(steps)} | {len(other)} |",
        f"| seconds per step (mean) | {60 * t_mine[-1] / len(steps):.1f} | {60 * t_theirs[-1] / len(other):.1f} |",
        f"| first-quarter score | {mine['first'][0]:.4f} | {theirs['first'][0]:.4f} |",
        f"| last-quarter score | {mine['last'][0]:.4f} | {theirs['last'][0]:.4f} |",
        f"| gain (z) | {mine['diff']:+.4f} ({mine['z']:.1f}) | {theirs['diff']:+.4f} ({theirs['z']:.1f}) |",
        f"| steps within the shorter run's {budget:.1f} min | {len(a)} | {len(b)} |",
        f"| last-quarter score within that budget | {last_quarter_mean(a):.4f} | {last_quarter_mean(b):.4f} |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out_md", type=Path)
    parser.add_argument("--title", default="GRPO on GSM8K, SmolLM2-135M-Instruct, 2-core CPU")
    parser.add_argument("--command", default="verl train")
    parser.add_argument("--compare", type=Path, default=None, help="another run directory to compare with")
    parser.add_argument("--compare-page", type=Path, default=None, help="an earlier results page to compare with")
    parser.add_argument("--compare-label", default="other run")
    args = parser.parse_args()
    rows = load_rows(args.run_dir)
    steps = [r for r in rows if r["step"] > 0 and "critic/score/mean" in r]
    vals = [r for r in rows if any(k.startswith("val-core/") for k in r)]
    other = None
    if args.compare is not None and args.compare_page is not None:
        parser.error("give --compare or --compare-page, not both")
    if args.compare is not None:
        other = [r for r in load_rows(args.compare) if r["step"] > 0 and "critic/score/mean" in r]
    elif args.compare_page is not None:
        other = page_rows(args.compare_page)
    config = (args.run_dir / "config.yaml").read_text()
    unfiltered = unfiltered_steps(steps, config)
    filtered = unfiltered is not None
    if filtered:
        steps = unfiltered
    args.out_md.parent.mkdir(parents=True, exist_ok=True)
    png = args.out_md.with_suffix(".png")
    plot(steps, vals, png, args.title, other, args.compare_label)
    test = learning_test(args.run_dir, steps, use_dump=not filtered)
    stage_keys = [k for k in steps[0] if k.startswith("timing_s/")]
    lines = [
        f"# {args.title}",
        "",
        f"Command: `{args.command}`  ",
        f"Machine: {platform.processor() or platform.machine()}, {__import__('os').cpu_count()} CPUs, "
        f"Python {platform.python_version()}  ",
        f"Steps: {len(steps)}; wall time {sum(r['timing_s/step'] for r in steps) / 60:.1f} min of training steps",
        "",
        f"![score curve]({png.name})",
        "",
        "## Learning test",
        "",
        *(
            [
                "Score = `train/filter_groups/metric_mean`, every sample the step generated before the filter "
                "(per-step means; the trained groups are a selected sample).",
                "",
            ]
            if filtered
            else []
        ),
        f"First {test['quarter_steps']} steps: mean score {test['first'][0]:.4f} over {test['first'][1]} {test['unit']}; "
        f"last {test['quarter_steps']} steps: {test['last'][0]:.4f} over {test['last'][1]} {test['unit']}.  ",
        f"Difference {test['diff']:+.4f}, standard error {test['se']:.4f}, z = {test['z']:.2f} -> "
        f"**{'learns (difference > 2 SE)' if test['learns'] else 'not significant (difference <= 2 SE)'}**.",
        "",
        "## Validation (greedy)",
        "",
        "| step | " + " | ".join(sorted({k for r in vals for k in r if _is_val_key(k)})) + " |",
        "|---|" + "---|" * len({k for r in vals for k in r if _is_val_key(k)}),
    ]
    val_keys = sorted({k for r in vals for k in r if _is_val_key(k)})
    for r in vals:
        lines.append(f"| {r['step']} | " + " | ".join(f"{r.get(k, float('nan')):.4f}" for k in val_keys) + " |")
    val_dir = args.run_dir / "validation"
    if val_dir.is_dir():
        lines += [
            "",
            "From the greedy validation dumps (`validation/<step>.jsonl`): exact answers (score 1) and answers",
            "in the asked `#### <number>` format (score > 0: exact, or wrong with the 0.1 format credit).",
            "",
            "| step | exact-answer accuracy | formatted answers | mean response chars |",
            "|---|---|---|---|",
        ]
        for path in sorted(val_dir.glob("*.jsonl"), key=lambda p: int(p.stem)):
            rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            exact = sum(r["score"] >= 1.0 for r in rows) / len(rows)
            formatted = sum(r["score"] > 0 for r in rows) / len(rows)
            chars = sum(len(r["output"]) for r in rows) / len(rows)
            lines.append(f"| {path.stem} | {exact:.3f} ({len(rows)} prompts) | {formatted:.3f} | {chars:.0f} |")
    if other is not None:
        other_dir = args.compare if args.compare is not None else args.compare_page
        lines += comparison(args.run_dir, steps, other_dir, other, args.compare_label, use_dump=not filtered)
    if filtered:
        import yaml

        cfg = yaml.safe_load(config)
        lines += filter_section(steps, cfg["data"]["gen_batch_size"], cfg["actor_rollout_ref"]["rollout"]["n"])
    if "num_turns/mean" in steps[0]:
        lines += agent_section(args.run_dir, steps)
    critic_keys = [k for k in ("critic/vf_loss", "critic/vf_explained_var") if k in steps[0]]
    lines += [
        "",
        "## Per step",
        "",
        "| step | score | pg_loss | entropy | grad_norm | resp len | "
        + "".join(k.split("/")[1] + " | " for k in critic_keys)
        + " | ".join(k.split("/")[1] + "_s" for k in stage_keys)
        + " |",
        "|---" * (6 + len(critic_keys) + len(stage_keys)) + "|",
    ]
    for r in steps:
        cells = [
            r["step"],
            f"{r['critic/score/mean']:.3f}",
            f"{r.get('actor/pg_loss', float('nan')):+.4f}",
            f"{r.get('actor/entropy', float('nan')):.3f}",
            f"{r.get('actor/grad_norm', float('nan')):.3f}",
            f"{r['response_length/mean']:.1f}",
            *(f"{r.get(k, float('nan')):.3f}" for k in critic_keys),
            *(f"{r[k]:.1f}" for k in stage_keys),
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += [
        "",
        "Seconds per stage, mean over steps: "
        + ", ".join(f"{k.split('/')[1]} {sum(r[k] for r in steps) / len(steps):.1f}" for k in stage_keys),
        "",
        "## Config",
        "",
        "```yaml",
        config.rstrip(),
        "```",
        "",
    ]
    args.out_md.parent.mkdir(parents=True, exist_ok=True)
    args.out_md.write_text("\n".join(lines))
    print(f"wrote {args.out_md} and {png}; learning test: {test}")


if __name__ == "__main__":
    main()
