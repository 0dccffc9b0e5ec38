"""The hybrid engine's switches and weight sync on this CPU: resharded sync vs the full-copy sync, per rank.

For each layout (``--layouts``, ``WORLDxTP``: ``2x1`` = FSDP over 2 ranks feeding an ``hf`` rollout replica on
each rank, ``3x3`` = one replica split over 3 ranks; SmolLM2-135M's 9 heads / 3 key-value heads allow TP 1 or 3)
every rank holds the FSDP2 engine (forward-only: the sync does not touch optimizer state) and an ``hf``
rollout that owns its weights (``sleep_level=2``). Each repetition runs, on every rank:

    sleep -> wake_up(weights) -> sync -> wake_up(kv_cache)

twice, alternating the two syncs, so both see the same machine drift:

* ``resharded``: ``ColocatedCheckpointEngine``: the rollout's layout, each rank receives exactly its slices
  (``verl.engines.weight_sync.reshard``), bucketed;
* ``full-copy``: what the sync did before the hybrid engine: every rank all-gathers every full tensor
  (``FSDPTrainingEngine.iter_weights()`` without a layout, same bucket size) and the rollout slices them.

Per rank and sync it records the wall time; the RSS growth across the sync (the rollout's own weights, which
the level-2 sleep freed, re-allocated and filled) and the transient RSS on top of that at the sync's peak
(``VmHWM`` reset through ``/proc/self/clear_refs``; ``MALLOC_MMAP_THRESHOLD_`` is pinned so freed tensors go
back to the OS and RSS follows live memory); the peak of tensors allocated during the sync measured by a
dispatch-level tracker (``verl.testing.memory.AllocationTracker``, a separate pass); and the bytes received.
The switches' times and the RSS freed by the level-2 sleep are recorded too.

    python benchmarks/hybrid_engine.py --reps 3 --json benchmarks/results/hybrid_engine.json \
        --md benchmarks/results/hybrid_engine.md

Needs verl-core and verl-fsdp (``pip install -e ./core[gguf] -e ./plugins/verl-fsdp``) and the SmolLM2 wheel.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MODEL, CpuWatch, fmt_share, machine_info, median_spread, write_results  # noqa: E402

MIB = float(1 << 20)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rank_main(out: Path, model_path: str, tp: int, reps: int, bucket_mb: int) -> None:
    """One rank: build the engines, run the reps, write ``out/rank<R>.json``."""
    import torch
    import torch.distributed as dist
    from verl_fsdp.engine import FSDPTrainingEngine

    from verl.engines.reference.rollout import HFRolloutEngine
    from verl.engines.reference.training import EngineSettings
    from verl.engines.weight_sync.colocated import ColocatedCheckpointEngine
    from verl.models import load_tokenizer
    from verl.platform.cpu import CpuPlatform
    from verl.testing.memory import AllocationTracker

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    platform = CpuPlatform()
    tok = load_tokenizer(model_path)
    trainer = FSDPTrainingEngine(model_path, EngineSettings(), device="cpu", bucket_megabytes=bucket_mb)
    cfg = SimpleNamespace(
        response_length=8, tensor_model_parallel_size=tp, engine_kwargs={"hf": {"sleep_level": 2}}, dtype="float32"
    )
    rollout = HFRolloutEngine(model_path, tok, cfg, device="cpu")
    sync = ColocatedCheckpointEngine(SimpleNamespace(update_weights_bucket_megabytes=bucket_mb, engine_kwargs={}))
    unique = {t.to_local().untyped_storage().data_ptr(): t for t in trainer.model.state_dict().values()}
    model_bytes = sum(t.numel() * t.element_size() for t in unique.values())  # tied weights once
    info = {
        "rank": rank,
        "world": world,
        "tp": tp,
        "trainer_shard_bytes": sum(t.to_local().numel() * t.element_size() for t in unique.values()),
        "rollout_owned_bytes": rollout.weights.owned_bytes(),
        "model_bytes": model_bytes,
        "reps": [],
    }

    def run_sync(kind: str) -> dict:
        if kind == "resharded":
            return sync.sync(trainer, rollout)
        counts = {"bytes": 0}

        def counted():
            for name, tensor in trainer.iter_weights():  # every full tensor on every rank
                counts["bytes"] += tensor.numel() * tensor.element_size()
                yield name, tensor

        rollout.update_weights(counted())
        return counts

    for rep in range(reps):
        order = ("resharded", "full-copy") if rep % 2 == 0 else ("full-copy", "resharded")
        for kind in order:
            row: dict = {"rep": rep, "kind": kind}
            dist.barrier()
            rss = _rss()
            t0 = time.perf_counter()
            rollout.sleep()
            row["sleep_s"] = time.perf_counter() - t0
            row["rss_freed_by_sleep"] = rss - _rss()
            dist.barrier()
            t0 = time.perf_counter()
            rollout.wake_up(["weights"])
            row["wake_up_weights_s"] = time.perf_counter() - t0
            dist.barrier()
            platform.reset_peak_memory_stats()
            before = _rss()
            t0 = time.perf_counter()
            metrics = run_sync(kind)
            dist.barrier()
            row["sync_s"] = time.perf_counter() - t0
            after = _rss()
            # Growth: the rollout's own weights, re-allocated by the wake-up and filled by the sync. Transient:
            # what the sync needed on top, at its peak, and gave back.
            row["sync_rss_growth"] = after - before
            row["sync_rss_transient"] = platform.memory_stats()["max_allocated_bytes"] - after
            row["bytes_to_rollout"] = metrics["bytes"]
            row["received_bytes"] = metrics.get("received_bytes")
            row["buckets"] = metrics.get("buckets")
            with AllocationTracker() as tracker:  # a second, untimed pass: what the sync allocates
                run_sync(kind)
            row["sync_tracked_peak"] = tracker.peak
            row["sync_tracked_largest"] = tracker.largest
            t0 = time.perf_counter()
            rollout.wake_up(["kv_cache"])
            row["wake_up_kv_cache_s"] = time.perf_counter() - t0
            info["reps"].append(row)
    (out / f"rank{rank}.json").write_text(json.dumps(info))
    dist.barrier()
    dist.destroy_process_group()


def _summarise(layouts: dict[str, list[dict]]) -> tuple[dict, str]:
    rows = []
    for layout, ranks in layouts.items():
        first = ranks[0]
        for kind in ("resharded", "full-copy"):
            per = [r for info in ranks for r in info["reps"] if r["kind"] == kind]

            def med(key, scale=1.0, per=per):
                return median_spread([r[key] / scale for r in per if r.get(key) is not None])

            rows.append(
                {
                    "layout": layout,
                    "kind": kind,
                    "model_mib": first["model_bytes"] / MIB,
                    "rollout_shard_mib": first["rollout_owned_bytes"] / MIB,
                    "sync_s": med("sync_s"),
                    "rss_growth_mib": med("sync_rss_growth", MIB),
                    "rss_transient_mib": med("sync_rss_transient", MIB),
                    "tracked_peak_mib": med("sync_tracked_peak", MIB),
                    "largest_alloc_mib": med("sync_tracked_largest", MIB),
                    "to_rollout_mib": med("bytes_to_rollout", MIB),
                    "received_mib": med("received_bytes", MIB),
                    "sleep_s": med("sleep_s"),
                    "wake_weights_s": med("wake_up_weights_s"),
                    "rss_freed_by_sleep_mib": med("rss_freed_by_sleep", MIB),
                    "others_cpu": fmt_share(first.get("others_cpu_share", float("nan"))),
                }
            )

    def cell(v):
        if isinstance(v, tuple):
            if v[0] != v[0]:  # NaN
                return "-"
            return f"{v[0]:.3g} ({v[1]:.3g}-{v[2]:.3g})"
        return f"{v:.1f}" if isinstance(v, float) else str(v)

    cols = [
        ("layout", "WORLDxTP"),
        ("kind", "sync"),
        ("rollout_shard_mib", "rollout shard MiB"),
        ("sync_s", "sync s"),
        ("rss_growth_mib", "RSS growth MiB"),
        ("rss_transient_mib", "RSS transient MiB"),
        ("tracked_peak_mib", "tensor peak MiB"),
        ("largest_alloc_mib", "largest alloc MiB"),
        ("to_rollout_mib", "into rollout MiB"),
        ("received_mib", "received MiB"),
        ("sleep_s", "sleep s"),
        ("wake_weights_s", "wake weights s"),
        ("rss_freed_by_sleep_mib", "RSS freed by sleep MiB"),
        ("others_cpu", "others' CPU"),
    ]
    lines = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r[k]) for k, _ in cols) + " |" for r in rows]
    return {"rows": rows}, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--layouts", default="2x1,3x3", help="comma-separated WORLDxTP, e.g. 2x1,3x3")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--bucket-mb", type=int, default=64, help="update_weights_bucket_megabytes of both syncs")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--md", type=Path)
    parser.add_argument("--rank-main", nargs=4, metavar=("OUT", "MODEL", "TP", "REPS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_main:
        out, model, tp, reps = args.rank_main
        _rank_main(Path(out), model, int(tp), int(reps), args.bucket_mb)
        return 0
    import tempfile

    from verl.models import resolve_model_path
    from verl.testing.distributed import run_ranks

    model_path = str(resolve_model_path(args.model))
    # A fixed mmap threshold: every large tensor is its own mapping, returned to the OS when freed, so RSS
    # follows the live tensors (glibc's dynamic threshold would keep freed sync buffers in the heap).
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    layouts: dict[str, list[dict]] = {}
    started = time.time()
    for spec in args.layouts.split(","):
        world, tp = (int(x) for x in spec.lower().split("x"))
        with tempfile.TemporaryDirectory() as tmp, CpuWatch() as watch:
            run_ranks(
                Path(__file__).resolve(),
                ["--bucket-mb", str(args.bucket_mb), "--rank-main", tmp, model_path, str(tp), str(args.reps)],
                world_size=world,
                timeout_s=1800,
            )
            layouts[spec] = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(world)]
        for info in layouts[spec]:
            info["others_cpu_share"] = watch.others
    result, table = _summarise(layouts)
    result.update({"machine": machine_info(), "args": vars(args) | {"json": None, "md": None}, "ranks": layouts})
    result["seconds"] = time.time() - started
    header = (
        f"Hybrid engine on {args.model}: per-rank medians (min-max) over {args.reps} reps x all ranks; "
        f"bucket {args.bucket_mb} MiB; model {layouts[next(iter(layouts))][0]['model_bytes'] / MIB:.0f} MiB fp32"
    )
    write_results(result, header + "\n\n" + table, args.json, args.md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
