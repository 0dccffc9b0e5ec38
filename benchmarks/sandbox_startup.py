"""The code interpreter's cost per call: ``print(1)`` through ``CodeInterpreterTool.execute`` in each isolation.

    python benchmarks/sandbox_startup.py --calls 40 --md benchmarks/results/sandbox_startup.md

Sides: ``unsafe_none`` (the path every call took before the box: a ``python -I`` child that tries an empty
network namespace, sets rlimits and an audit hook), ``namespaces`` (the box built by the child with the
kernel's namespaces) and ``bubblewrap`` (the box built by bwrap). Each box side runs the interpreter its default
resolves to (the trainer's base interpreter); where bubblewrap cannot use it (the trainer is root and the
interpreter lives in a folder uid 65534 cannot enter, e.g. pyenv in root's home) it runs ``--fallback-python``
instead, and ``unsafe_none`` is measured with that interpreter too, so each ratio compares one interpreter.

Per side: the tool is built once (that time includes the box's one probe per process), three warm-up calls are
not counted, then ``--calls`` calls alternate between the sides (round robin, so drift hits all alike). Each
figure is the wall time of one ``execute`` (start, run, exit, folder removed), in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CpuWatch, fmt_share, load_avg, machine_info, write_results  # noqa: E402

from verl.tools.code_interpreter import CodeInterpreterTool  # noqa: E402
from verl.tools.isolation import IsolationUnavailableError  # noqa: E402

CODE = "print(1)"


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def build(isolation: str, python: str | None) -> tuple[CodeInterpreterTool | None, float, str]:
    """``(tool, construction seconds, note)``; tool None with the reason as note where it cannot be built."""
    config = {"timeout": 30, "isolation": isolation, **({"python": python} if python else {})}
    start = time.perf_counter()
    try:
        tool = CodeInterpreterTool(config)
    except (IsolationUnavailableError, ValueError) as exc:
        return None, 0.0, str(exc).splitlines()[-1] if "\n" not in str(exc) else str(exc).splitlines()[1].strip()
    return tool, time.perf_counter() - start, _note(tool, python)


def _note(tool: CodeInterpreterTool, python: str | None) -> str:
    """The isolation and the interpreter, without this machine's paths (the default interpreter is named by role)."""
    iso = tool.isolation
    if iso.mode == "unsafe_none":
        return f"no box, {python} with its packages" if python else "no box, the trainer's interpreter and packages"
    what = "with its packages" if iso.interpreter.packages else "standard library only"
    where = python or "the trainer's base interpreter"
    return f"{iso.mode} box, Python {iso.interpreter.version} ({where}, {what})"


async def one_call(tool: CodeInterpreterTool) -> float:
    start = time.perf_counter()
    response, _, _ = await tool.execute("bench", {"code": CODE})
    elapsed = time.perf_counter() - start
    if response.text != "1\n":
        raise RuntimeError(f"unexpected reply {response.text!r}")
    return elapsed


def plan(fallback: str | None) -> list[tuple[str, str, str | None]]:
    """``(label, isolation, python)`` of every side; bubblewrap falls back to ``fallback`` where needed."""
    sides: list[tuple[str, str, str | None]] = [
        ("unsafe_none", "unsafe_none", None),
        ("namespaces", "namespaces", None),
    ]
    tool, _, _ = build("bubblewrap", None)
    if tool is not None:
        sides.append(("bubblewrap", "bubblewrap", None))
    elif fallback:
        sides += [
            (f"unsafe_none, {fallback}", "unsafe_none", fallback),
            (f"namespaces, {fallback}", "namespaces", fallback),
            (f"bubblewrap, {fallback}", "bubblewrap", fallback),
        ]
    return sides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=40, help="counted calls per side")
    parser.add_argument("--fallback-python", default="/usr/bin/python3")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--md", type=Path, default=None)
    args = parser.parse_args()

    info = machine_info()
    load_start = load_avg()
    tools, notes, built = {}, {}, {}
    for label, isolation, python in plan(args.fallback_python):
        tool, seconds, note = build(isolation, python)
        notes[label] = note
        if tool is not None:
            tools[label], built[label] = tool, seconds

    async def measure() -> dict[str, list[float]]:
        for tool in tools.values():
            for _ in range(3):
                await one_call(tool)
        times: dict[str, list[float]] = {label: [] for label in tools}
        for _ in range(args.calls):
            for label, tool in tools.items():
                times[label].append(await one_call(tool))
        return times

    with CpuWatch() as watch:
        times = asyncio.run(measure())
    load_end = load_avg()

    def baseline(label: str) -> str:
        python = label.split(", ", 1)[1] if ", " in label else None
        return f"unsafe_none, {python}" if python else "unsafe_none"

    lines = [
        f"machine: {info['cpu']}, {info['cores']} cores; Python {info['python']}; load average {load_start} -> "
        f"{load_end}; others' CPU during the calls {fmt_share(watch.others)}",
        "",
        f"`print(1)` through `CodeInterpreterTool.execute`, {args.calls} calls per side (round robin, after 3 "
        "warm-up calls), milliseconds per call; ratio = median / the median of `unsafe_none` with the same "
        "interpreter.",
        "",
        "| side | median ms | p90 ms | min ms | ratio to unsafe_none | tool built in s (incl. probe) |",
        "|---|---|---|---|---|---|",
    ]
    medians = {label: statistics.median(values) for label, values in times.items()}
    for label, values in times.items():
        ratio = medians[label] / medians[baseline(label)] if baseline(label) in medians else float("nan")
        lines.append(
            f"| {label} | {1000 * medians[label]:.1f} | {1000 * _p90(values):.1f} | {1000 * min(values):.1f} | "
            f"{ratio:.2f}x | {built[label]:.2f} |"
        )
    lines += ["", "What each side ran:", ""]
    lines += [f"- {label}: {note}" for label, note in notes.items()]
    result = {
        "benchmark": "sandbox_startup",
        "machine": info,
        "load_avg": [load_start, load_end],
        "cpu_watch": watch.as_dict(),
        "calls": args.calls,
        "sides": {
            label: {"seconds": times.get(label), "built_s": built.get(label), "isolation": notes[label]}
            for label in notes
        },
    }
    write_results(result, "\n".join(lines), args.json, args.md)


if __name__ == "__main__":
    main()
