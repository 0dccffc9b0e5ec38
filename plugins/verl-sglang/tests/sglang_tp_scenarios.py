"""SGLang tensor parallelism in the trainer's world, on recording stand-ins (``python sglang_tp_scenarios.py OUT
MODEL``).

Run on 2 gloo ranks (CPU) by ``test_sglang_tensor_parallel.py``: each rank builds ``SGLangRolloutEngine`` with
``tensor_model_parallel_size=2`` around ``RecordingSGLangSessionEngineStandIn`` (conftest), generates, syncs
weights, sleeps and wakes, and meets a refused load; it writes ``OUT/rank<R>.pt``. It shows which rank calls what
and what crosses the group; a stand-in never shows that SGLang works. Not collected by pytest.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).parent


def main(out: Path, model: Path) -> None:
    from safetensors.torch import load_file
    from verl_sglang.engine import SGLangEngineError, SGLangRolloutEngine

    from verl.models import load_tokenizer
    from verl.testing.conformance import make_prompt_batch, make_rollout_config
    from verl.testing.distributed import load_script

    conftest = load_script(HERE / "conftest.py", "sglang_conftest")

    class AllPayloads(conftest.RecordingSGLangSessionEngineStandIn):
        """Decodes every TP rank's payload (the base decodes the first only)."""

        def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
            result = super().update_weights_from_tensor(named_tensors, load_format, flush_cache)
            if result == (True, "Success"):
                self.per_rank = getattr(self, "per_rank", [])
                for payload in named_tensors:
                    data = self.serializer.deserialize(payload)
                    bucket = self.bucket_cls(flattened_tensor=data["flattened_tensor"], metadata=data["metadata"])
                    self.per_rank.append([n for n, _ in bucket.reconstruct_tensors()])
            return result

    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    from types import SimpleNamespace

    cfg = make_rollout_config(
        tensor_model_parallel_size=2,
        checkpoint_engine=SimpleNamespace(update_weights_bucket_megabytes=2048),
        load_format="auto",
        dtype="auto",
        engine_kwargs={},
        multi_stage_wake_up=True,
    )

    def build():
        return SGLangRolloutEngine(
            model, None, cfg, device="cuda:0", engine_cls=AllPayloads, weight_api=conftest.standin_weight_api()
        )

    result: dict = {}
    # This CPU host has no GPU: the group's first rank cannot see GPUs 0..1 and says so, on every rank.
    try:
        build()
    except (RuntimeError, SGLangEngineError) as exc:
        result["not_visible"] = f"{type(exc).__name__}: {exc}"
    # Stand-in for a node whose two GPUs the first rank sees (nothing here uses CUDA itself).
    torch.cuda.device_count = lambda: 2
    engine = build()
    result.update(has_engine=engine.engine is not None, layout_tp=engine.weight_layout().tp_size)
    tok = load_tokenizer(model)
    out_batch = engine.generate(make_prompt_batch(tok, ["Hi", "Tell me more"], n=2))
    result["responses"] = out_batch.batch["responses"]
    result["log_probs"] = out_batch.batch["rollout_log_probs"]
    weights = load_file(str(model / "model.safetensors"))
    engine.sleep()
    engine.wake_up(["weights"])
    engine.update_weights(iter(weights.items()))
    engine.wake_up(["kv_cache"])
    if engine.engine is not None:
        engine.engine.update_results.append((False, "Failed to update parameter online: boom"))
    try:
        engine.update_weights(iter(weights.items()))
        result["refused"] = None
    except SGLangEngineError as exc:
        result["refused"] = str(exc)
    if engine.engine is not None:
        result["calls"] = engine.engine.names()
        result["server_args"] = engine.engine.server_args
        result["per_rank"] = engine.engine.per_rank
    engine.close()
    torch.save(result, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
