"""LoRA memory arithmetic for docs/lora.md: adapter parameters and fp32 AdamW state vs full fine-tuning.

    python scripts/lora_memory.py [MODEL] [--ranks 8 16]

MODEL is a HF folder or a verl.models alias (default: the embedded SmolLM2-135M-Instruct). The model is built
from its config on the meta device (no weights are read) and given peft adapters exactly as the training engines
do (:func:`verl.engines.lora.adapter_param_count`, target_modules=all-linear). Bytes assume fp32 parameters and
gradients and AdamW's two fp32 moments per trainable parameter.
"""

from __future__ import annotations

import argparse

import torch


def table(model_path: str, ranks: list[int]) -> list[dict]:
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl.engines.lora import LoraSettings, adapter_param_count
    from verl.models import resolve_model_path

    config = AutoConfig.from_pretrained(str(resolve_model_path(model_path)))
    rows = []
    for rank in ranks:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        counts = adapter_param_count(model, LoraSettings(rank=rank, alpha=2 * rank))
        rows.append({"rank": rank, **counts})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16])
    args = parser.parse_args()
    mib = 1 << 20
    rows = table(args.model, args.ranks)
    base = rows[0]["base"]
    print("| setting | trainable params | share of base | grads + AdamW state (fp32) |")
    print("|---|---:|---:|---:|")
    print(f"| full fine-tune | {base:,} | 100% | {base * 12 / mib:,.1f} MiB |")
    for row in rows:
        n = row["adapter"]
        print(f"| LoRA r={row['rank']} | {n:,} | {100 * n / base:.2f}% | {n * 12 / mib:,.1f} MiB |")
    print(f"\nfrozen base weights (fp32, held once, also by the reference policy): {base * 4 / mib:,.1f} MiB")


if __name__ == "__main__":
    main()
