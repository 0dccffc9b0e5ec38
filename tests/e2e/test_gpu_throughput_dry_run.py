"""``benchmarks/gpu_throughput.py`` on the CPU with its ``tiny`` model: the GPU benchmark's whole path (model built
from a config, GSM8K rows, one ``verl train`` per side, figures read back) works before it ever meets a GPU, and the
sides that cannot run here are reported with their reason."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_tiny_dry_run_reports_each_side(tmp_path):
    from verl.testing.tiny import make_tiny_tokenizer

    make_tiny_tokenizer().save_pretrained(str(tmp_path / "tok"))
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "gpu_throughput.py"),
        "--size=tiny",
        "--device=cpu",
        f"--tokenizer={tmp_path / 'tok'}",
        f"--out={out}",
        f"--work={tmp_path / 'work'}",
        "--steps=2",
        "--prompts=4",
        "--n=2",
        "--response-length=8",
        "--prompt-length=1024",
        "--token-budget=4096",
        "--sides",
        "ours-reference-hf",
        "verl",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((out / "gpu_throughput.json").read_text())
    assert result["model"]["size"] == "tiny" and result["model"]["params"] > 0
    (run,) = result["runs"]
    assert run["side"] == "ours-reference-hf" and run["returncode"] == 0 and run["steps"] == 2
    # The reported throughput is verl's perf/throughput of the counted step: tokens over the step time.
    rows = [json.loads(x) for x in (tmp_path / "work" / "ours-reference-hf" / "metrics.jsonl").read_text().splitlines()]
    counted = [r for r in rows if "timing_s/step" in r][1:]
    want = statistics.median(r["perf/total_num_tokens"] / r["timing_s/step"] for r in counted)
    assert abs(run["throughput"] - want) <= 1e-6 * want
    assert run["stages"]["gen"] > 0 and run["stages"]["update_actor"] > 0
    assert "verl==0.9" in result["not_run"]["verl"]
    assert "not run: no --verl-python" in (out / "gpu_throughput.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu_throughput.json",
        "gpu_throughput.md",
        "ours-reference-hf.log",
    ]
