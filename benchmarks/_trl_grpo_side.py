"""TRL side of ``benchmarks/grpo_step.py``: ``--steps`` GRPO steps with TRL's ``GRPOTrainer``, timed per step.

Run by the orchestrator with the TRL virtual environment's python (TRL 1.16, the same torch and transformers
versions as our side), never imported by it:

    OMP_NUM_THREADS=2 ~/.cache/verl/bench/venv-trl/bin/python benchmarks/_trl_grpo_side.py \
        --data prompts.jsonl --prompt-ids prompt_ids.json --model MODEL_DIR --steps 4 --out trl.json

What it builds (the equal-settings list is the orchestrator's docstring; this file only applies it):

* the dataset: the orchestrator's rows (our GSM8K pipeline: first ``8 x steps`` train prompts, our instruction
  text) as a conversational ``prompt`` column plus ``ground_truth`` and ``data_source``, in file order
  (``shuffle_dataset=False``); TRL applies the same chat template with the generation prompt, and every
  generation batch's prompt token ids are checked against the ids our ``RLHFDataset`` produced
  (``prompt_ids_match`` in the output);
* the reward: our scorer itself, ``verl.rewards.default.default_compute_score`` (GSM8K, ``method="strict"``,
  ``format_score=0.1``), imported from the repository's ``core/src`` (those modules need only the standard
  library);
* the optimizer: ``torch.optim.AdamW(model.parameters(), lr, betas, weight_decay, fused=True)`` exactly as our
  ``verl.engines.optim.build_optimizer`` builds it (one param group, decay on every parameter, torch's default
  eps 1e-8, the fused kernel), instead of the HF Trainer's default (``adamw_torch_fused`` too, but no decay on
  bias/norm weights), so the optimizer step is the same work on both sides.

Timing: a ``TrainerCallback`` takes ``on_step_begin`` -> ``on_step_end`` of each optimizer step (the HF Trainer
calls ``on_step_begin`` after fetching the step's batches, ``on_step_end`` after the optimizer and scheduler
step, before logging: the same span as our ``timing_s/step``). Inside it, ``_generate_and_score_completions``
(prompt tokenisation, generation, decoding, reward, advantages) and, nested in it, ``_generate_single_turn``
(the ``model.generate`` call) are timed by overriding them in a subclass. Wall-clock stamps (``time.time()``)
of the process start, imports, trainer construction (model load) and each step let the orchestrator separate
start-up from step time.
"""

from __future__ import annotations

import time

T_START = time.time()  # before the heavy imports: start-up is measured from here (and from the launch)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

CORE_SRC = Path(__file__).resolve().parents[1] / "core" / "src"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags (the orchestrator passes all of them)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="jsonl rows: prompt (messages), ground_truth, ...")
    parser.add_argument("--prompt-ids", type=Path, default=None, help="json {user text: our prompt token ids}")
    parser.add_argument("--model", required=True, help="HF model folder (the one our side resolves)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4, help="completions per prompt (num_generations)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.999))
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--clip-grad", type=float, default=1.0)
    parser.add_argument("--clip-eps", type=float, default=0.2)
    parser.add_argument("--format-score", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output-dir", type=Path, required=True, help="GRPOConfig.output_dir (nothing is saved)")
    parser.add_argument("--out", type=Path, required=True, help="write the per-step timings here (JSON)")
    return parser.parse_args(argv)


def load_rows(path: Path) -> list[dict[str, Any]]:
    """The orchestrator's jsonl rows, in file order."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def make_reward(format_score: float) -> Any:
    """A TRL reward function that scores with our GSM8K scorer (the same call our reward manager makes)."""
    sys.path.insert(0, str(CORE_SRC))
    from verl.rewards.default import default_compute_score

    def gsm8k_strict(completions: list, ground_truth: list, data_source: list, **_: Any) -> list[float]:
        """``default_compute_score(data_source, text, ground_truth, method="strict", format_score=...)["score"]``."""
        scores = []
        for completion, truth, source in zip(completions, ground_truth, data_source, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            result = default_compute_score(source, text, truth, method="strict", format_score=format_score)
            scores.append(float(result["score"] if isinstance(result, dict) else result))
        return scores

    return gsm8k_strict


def main(argv: list[str] | None = None) -> int:
    """Build GRPOConfig/GRPOTrainer with the benchmark's settings, train ``--steps`` steps, write the timings."""
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    t_imports = time.time()
    rows = load_rows(args.data)
    expected_ids: dict[str, list[int]] = json.loads(args.prompt_ids.read_text()) if args.prompt_ids else {}
    dataset = Dataset.from_list(
        [{"prompt": r["prompt"], "ground_truth": r["ground_truth"], "data_source": r["data_source"]} for r in rows]
    )
    reward = make_reward(args.format_score)
    steps: list[dict[str, Any]] = []
    checks = {"prompt_batches": 0, "prompt_ids_match": True, "prompt_ids_mismatch_example": None}

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with timers around generation+scoring and generation, and our AdamW."""

        def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
            if self.optimizer is None:
                params = (self.model if model is None else model).parameters()
                # As verl.engines.optim.build_optimizer: one group, decay on all parameters, default eps, the
                # fused kernel (also the HF Trainer's default implementation, adamw_torch_fused).
                self.optimizer = torch.optim.AdamW(
                    params, lr=args.lr, betas=tuple(args.betas), weight_decay=args.weight_decay, fused=True
                )
            return self.optimizer

        def _tokenize_prompts(self, prompts: list) -> Any:
            out = super()._tokenize_prompts(prompts)
            checks["prompt_batches"] += 1
            if expected_ids:
                for prompt, ids in zip(prompts, out[0], strict=True):
                    want = expected_ids.get(prompt[-1]["content"])
                    if want is None or list(ids) != want:
                        checks["prompt_ids_match"] = False
                        checks["prompt_ids_mismatch_example"] = {"trl": list(ids), "ours": want}
            return out

        def _generate_single_turn(self, *a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            out = super()._generate_single_turn(*a, **k)
            if steps:
                steps[-1]["generate_s"] += time.perf_counter() - start
            return out

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            start = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            if steps:
                rec = steps[-1]
                rec["gen_score_s"] += time.perf_counter() - start
                rec["response_tokens"] += int(out["completion_mask"].sum())
                rec["rows"] += int(out["completion_ids"].shape[0])
                rec["max_response_len"] = max(rec["max_response_len"], int(out["completion_mask"].sum(1).max()))
            return out

    class StepTimer(TrainerCallback):
        """One record per optimizer step: wall stamps, seconds, and the step's logged metrics."""

        def on_step_begin(self, targs: Any, state: Any, control: Any, **kwargs: Any) -> None:
            steps.append(
                {
                    "step": state.global_step + 1,
                    "t_begin": time.time(),
                    "_p": time.perf_counter(),
                    "gen_score_s": 0.0,
                    "generate_s": 0.0,
                    "response_tokens": 0,
                    "rows": 0,
                    "max_response_len": 0,
                    "threads": torch.get_num_threads(),
                }
            )

        def on_step_end(self, targs: Any, state: Any, control: Any, **kwargs: Any) -> None:
            rec = steps[-1]
            rec["seconds"] = time.perf_counter() - rec.pop("_p")
            rec["t_end"] = time.time()

        def on_log(self, targs: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            keep = ("reward", "reward_std", "completions/mean_length", "grad_norm", "loss", "entropy", "step_time")
            logged = {k: float(v) for k, v in (logs or {}).items() if k in keep and v is not None}
            if steps and logged:  # the step's own log line (the end-of-training summary has none of these keys)
                steps[-1]["logged"] = logged

    config = GRPOConfig(
        output_dir=str(args.output_dir),
        max_steps=args.steps,
        per_device_train_batch_size=args.prompts_per_step,  # completions per micro-batch
        gradient_accumulation_steps=args.samples,  # 8 x 4 = 32 completions = one optimizer step
        num_generations=args.samples,
        max_completion_length=args.max_new_tokens,
        temperature=args.temperature,
        top_p=1.0,
        top_k=0,  # TRL: 0 = off
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=args.weight_decay,
        adam_beta1=args.betas[0],
        adam_beta2=args.betas[1],
        adam_epsilon=1e-8,
        max_grad_norm=args.clip_grad,
        beta=0.0,
        num_iterations=1,
        epsilon=args.clip_eps,
        loss_type="dapo",
        scale_rewards="group",
        mask_truncated_completions=False,
        gradient_checkpointing=False,  # GRPOConfig's default is True; our side runs without it
        bf16=False,
        fp16=False,
        use_cpu=True,
        model_init_kwargs={"dtype": "float32"},
        shuffle_dataset=False,
        seed=args.seed,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_steps=1,
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = TimedGRPOTrainer(
        model=args.model, reward_funcs=reward, args=config, train_dataset=dataset, callbacks=[StepTimer()]
    )
    t_built = time.time()
    model = trainer.model
    tok = trainer.processing_class
    result: dict[str, Any] = {
        "t_start": T_START,
        "t_imports": t_imports,
        "t_trainer_built": t_built,
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "threads_at_start": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "model_dtype": str(next(model.parameters()).dtype),
        "num_params": sum(p.numel() for p in model.parameters()),
        "eos_token_ids": list(trainer.eos_token_ids),
        "pad_token_id": tok.pad_token_id,
        "tokenizer_parses_responses": bool(
            getattr(tok, "response_template", None) or getattr(tok, "response_schema", None)
        ),
        "config": {
            k: getattr(config, k)
            for k in (
                "per_device_train_batch_size",
                "gradient_accumulation_steps",
                "steps_per_generation",
                "generation_batch_size",
                "num_generations",
                "max_completion_length",
                "temperature",
                "top_p",
                "top_k",
                "learning_rate",
                "lr_scheduler_type",
                "weight_decay",
                "adam_beta1",
                "adam_beta2",
                "adam_epsilon",
                "max_grad_norm",
                "beta",
                "num_iterations",
                "epsilon",
                "loss_type",
                "scale_rewards",
                "gradient_checkpointing",
                "bf16",
                "use_cpu",
                "shuffle_dataset",
            )
        },
        "steps": steps,
        "checks": checks,
    }
    result["config"] = {
        k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v)) for k, v in result["config"].items()
    }
    try:
        trainer.train()
        opt = trainer.optimizer
        inner = getattr(opt, "optimizer", opt)
        result["optimizer"] = {
            "class": f"{type(inner).__module__}.{type(inner).__name__}",
            "param_groups": len(inner.param_groups),
            "defaults": {k: str(v) for k, v in inner.defaults.items()},
        }
    finally:
        result["t_train_end"] = time.time()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
