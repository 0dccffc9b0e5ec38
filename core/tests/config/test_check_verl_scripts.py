"""scripts/check_verl_scripts.py: command extraction from hand-written run scripts (no verl checkout needed)."""

from __future__ import annotations

from pathlib import Path

from verl.testing.distributed import load_script

REPO = Path(__file__).resolve().parents[3]
CVS = load_script(REPO / "scripts" / "check_verl_scripts.py", "check_verl_scripts")

SNIPPET = r"""#!/usr/bin/env bash
set -xeuo pipefail
DEVICE=${DEVICE:-$(python3 -c 'import torch_npu' 2>/dev/null && echo npu || echo gpu)}
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-8B}
max_prompt_length=$((1024 * 2))
case "${DEVICE}" in
    gpu) rollout_tp=2 ;;
    npu) rollout_tp=4 ;;
esac
ROLLOUT=(
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.tensor_model_parallel_size=${rollout_tp}
)
ray stop --force
python3 -m verl.trainer.main_ppo \
    --config-path=config --config-name='ppo_trainer' \
    data.max_prompt_length=${max_prompt_length} \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    data.train_files="['$HOME/a.parquet', '$HOME/b.parquet']" \
    trainer.logger='["console","wandb"]' \
    "${ROLLOUT[@]}" \
    +actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_seqs=8 \
    hydra.run.dir=/tmp/x \
    "$@"
"""


def test_bash_expands_the_script_and_the_recorder_captures_main_ppo(tmp_path) -> None:
    argvs, tail = CVS.capture_commands(SNIPPET, tmp_path)
    assert tail == ""
    assert len(argvs) == 1  # `ray stop` is silenced, the npu probe fails before recording
    command = CVS.parse_command(argvs[0])
    assert command.module == "verl.trainer.main_ppo"
    assert (command.config_path, command.config_name) == ("config", "ppo_trainer")
    home = command.overrides[2].split("'")[1].rsplit("/", 1)[0]
    assert command.overrides == (
        "data.max_prompt_length=2048",
        "actor_rollout_ref.model.path=Qwen/Qwen3-8B",
        f"data.train_files=['{home}/a.parquet', '{home}/b.parquet']",
        'trainer.logger=["console","wandb"]',
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",  # the gpu branch of the case
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_seqs=8",
    )
    assert command.dropped == ("hydra.run.dir=/tmp/x (Hydra setting)",)


def test_uv_and_torchrun_launchers_and_other_modules() -> None:
    uv = CVS.parse_command(["uv", "run", "--extra", "vllm", "python3", "-m", "verl.trainer.main_ppo", "a.b=1"])
    assert (uv.module, uv.overrides) == ("verl.trainer.main_ppo", ("a.b=1",))
    sft = CVS.parse_command(["torchrun", "--nproc_per_node=8", "-m", "verl.trainer.sft_trainer", "-cn", "sft", "x=1"])
    assert (sft.module, sft.config_name, sft.overrides) == ("verl.trainer.sft_trainer", "sft", ("x=1",))
    deleted = CVS.parse_command(["python3", "-m", "verl.trainer.main_ppo", "~actor_rollout_ref.model.lora"])
    assert deleted.overrides == ("~actor_rollout_ref.model.lora",)


def test_required_variables_and_arguments_get_placeholders(tmp_path) -> None:
    text = (
        "set -u\n"
        'if [ "$#" -lt 2 ]; then echo "Usage: run.sh <nproc> <save_path>" >&2; exit 1; fi\n'
        ': "${DATA_ROOT:?set DATA_ROOT}"\n'
        'python3 -m verl.trainer.main_ppo data.train_files="$DATA_ROOT/t.parquet" trainer.default_local_dir="$2"\n'
    )
    argvs, tail, env, args = CVS.capture_with_inputs(text, tmp_path)
    assert env == {"DATA_ROOT": "/placeholder/data_root"} and len(args) == 2
    assert CVS.parse_command(argvs[0]).overrides == (
        "data.train_files=/placeholder/data_root/t.parquet",
        f"trainer.default_local_dir={args[1]}",
    )


def test_check_script_reports_the_failing_key_and_what_fails_next(tmp_path, fake_backends) -> None:
    text = (
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.bogus_knob=1 trainer.controller=local "
        "trainer.n_gpus_per_node=8\n"
    )
    result = CVS.check_script("x.sh", text, tmp_path, fake_backends)
    assert not result.loads and result.failing_keys == ("actor_rollout_ref.rollout.bogus_knob",)
    # Behind the unknown key: an explicit local controller cannot run 8 workers (the loader stops at unknown
    # keys first, so this shows only once the bogus key is dropped).
    assert "trainer.controller" in result.next_keys
    ok = CVS.check_script(
        "ok.sh", "python3 -m verl.trainer.main_ppo data.train_batch_size=256\n", tmp_path, fake_backends
    )
    assert ok.loads and ok.commands == 1


def test_config_path_and_name_are_translated_as_main_ppo_does(tmp_path, fake_backends) -> None:
    own = tmp_path / "cfg"
    own.mkdir()
    (own / "mine.yaml").write_text("defaults: [ppo_trainer, _self_]\ndata:\n  train_batch_size: 512\n")
    ok = CVS.check_script(
        "own.sh",
        f"python3 -m verl.trainer.main_ppo --config-path={own} --config-name=mine a=1\n",
        tmp_path,
        fake_backends,
    )
    assert not ok.loads and ok.failing_keys == ("a",)  # the file loaded; only the override is unknown
    mega = CVS.check_script(
        "m.sh",
        "python3 -m verl.trainer.main_ppo --config-path=config --config-name='ppo_megatron_trainer.yaml' x.y=1\n",
        tmp_path,
        fake_backends,
    )
    # The refused config is counted, and the overrides are still checked over verl's defaults.
    assert mega.failing_keys == ("--config-name=ppo_megatron_trainer", "x")
