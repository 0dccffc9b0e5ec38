"""``examples/gsm8k_dapo_smollm2_cpu.yaml``: the main job (its defaults list) with DAPO's dynamic sampling and
clip-higher; everything else, model, data, batch, samples, steps, reward and seed, is the main job's."""

from __future__ import annotations

from pathlib import Path

import attrs

from verl.config import load_config

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "gsm8k_dapo_smollm2_cpu.yaml"
MAIN = REPO / "examples" / "gsm8k_grpo_smollm2_cpu.yaml"


def _flat(tree: object, prefix: str = "") -> dict[str, object]:
    if attrs.has(type(tree)):
        tree = attrs.asdict(tree, recurse=False)
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, object] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def test_dapo_example_is_the_main_job_plus_the_dapo_keys() -> None:
    dapo, main = _flat(load_config(EXAMPLE, [])), _flat(load_config(MAIN, []))
    assert dapo["algorithm.filter_groups.enable"] is True
    assert dapo["algorithm.filter_groups.metric"] == "score"
    assert dapo["algorithm.filter_groups.max_num_gen_batches"] == 10
    assert dapo["data.gen_batch_size"] == 2 * dapo["data.train_batch_size"] == 16
    assert (dapo["actor_rollout_ref.actor.clip_ratio_low"], dapo["actor_rollout_ref.actor.clip_ratio_high"]) == (
        0.2,
        0.28,
    )
    # The run is compared with the main job's record: nothing else may differ.
    changed = {k for k in main if dapo.get(k) != main[k]}
    assert changed == {
        "algorithm.filter_groups.enable",
        "algorithm.filter_groups.metric",
        "algorithm.filter_groups.max_num_gen_batches",
        "data.gen_batch_size",
        "actor_rollout_ref.actor.clip_ratio_high",
        "trainer.experiment_name",
        "trainer.default_local_dir",  # checkpoints/<project>/<experiment>
        "trainer.rollout_data_dir",
        "trainer.validation_data_dir",
    }, changed
