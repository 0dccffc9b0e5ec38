"""Where the ``hf`` engine's generation time goes: the prefill vs the decode steps, against the roofline.

    OMP_NUM_THREADS=2 python benchmarks/decode_split.py --batch-sizes 8 32 64

``rollout.py``'s tokens/s include the prefill (one forward over every prompt position of the batch), which
the decode roofline does not count. This script separates the two on the same prompts and sampling settings:
``generate`` with 1 new token (the prefill and one sampling step) and with ``1 + --steps`` new tokens; the
difference over ``--steps`` is the time of one decode step of the full batch (rows finishing early only make
it shorter; the step count is small enough that few do). Each length runs once untimed first. The
``bare GEMMs`` column times every linear layer of the model at ``batch`` rows and nothing else (the LM head
included), the floor of a decode step with these kernels. The decode
step is compared with the roofline of ``rollout.py`` (``rollout.roofline``) at the bandwidth and matmul peak
measured right before and after (``common.quick_peaks``), and the CPU share of other processes is printed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import rollout  # noqa: E402


def timed_generate(engine, data) -> tuple[float, int]:
    engine.generate(data)
    start = time.perf_counter()
    out = engine.generate(data)
    return time.perf_counter() - start, int(out.batch["response_mask"].sum())


def bare_gemms_ms(model: torch.nn.Module, rows: int, reps: int = 5) -> float:
    """Best time of one pass over every ``nn.Linear`` of ``model`` at ``rows`` input rows, in the product form
    the hf engine uses on this CPU (``(W @ x^T)^T`` where ``decode_linears.skinny_form_helps``, else
    ``x @ W^T``); nothing else of a decode step."""
    from verl.engines.reference.decode_linears import skinny_form_helps

    weights = [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights}
    skinny = skinny_form_helps("cpu")
    best = float("inf")
    with torch.no_grad():
        for _ in range(reps):
            start = time.perf_counter()
            for w in weights:
                x = inputs[w.shape[1]]
                _ = (w @ x.T).T if skinny else torch.nn.functional.linear(x, w)
            best = min(best, time.perf_counter() - start)
    return best * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[8, 32, 64])
    parser.add_argument("--steps", type=int, default=32, help="decode steps timed after the first token")
    parser.add_argument("--max-prompt-length", type=int, default=256)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from verl.models import resolve_model_path
    from verl.protocol import DataProto

    path = resolve_model_path("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    batches = rollout.prompt_batches(tokenizer, args.batch_sizes, args.max_prompt_length)
    params = None
    print(f"threads {torch.get_num_threads()}; {args.steps} decode steps timed per batch")
    print(
        "| batch | prompt columns | real prompt tokens | prefill s | decode step ms | decode tokens/s | "
        "bare GEMMs ms | roofline tokens/s (beside) | fraction | other processes' CPU |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for bs in args.batch_sizes:
        batch = batches[bs]
        data = DataProto.from_dict(tensors={k: batch.batch[k] for k in batch.batch.keys()})
        before = common.quick_peaks()
        with common.CpuWatch() as watch:
            times = {}
            for new_tokens in (1, 1 + args.steps):
                ns = argparse.Namespace(
                    response_length=new_tokens, max_prompt_length=args.max_prompt_length, device="cpu"
                )
                engine, _ = rollout.build_engine("hf", path, tokenizer, ns)
                if params is None:
                    params = sum(p.numel() for p in engine.model.parameters())
                times[new_tokens] = timed_generate(engine, data)
            gemms = bare_gemms_ms(engine.model, bs)
        peaks = common.mean_peaks(before, common.quick_peaks())
        step = (times[1 + args.steps][0] - times[1][0]) / args.steps
        bound = rollout.roofline(params, 4, peaks["bandwidth_GBps"] * 1e9, peaks["fp32_GFLOPs"] * 1e9, bs)
        mask = batch.batch["attention_mask"]
        columns = int(mask.any(dim=0).sum())
        print(
            f"| {bs} | {columns} | {int(mask.sum())} | {times[1][0]:.1f} | {step * 1e3:.0f} | {bs / step:.0f} | "
            f"{gemms:.0f} | {bound:.0f} | {bs / step / bound:.0%} | {watch.others:.1%} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
