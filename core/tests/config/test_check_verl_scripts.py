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


RECIPE = r"""#!/usr/bin/env bash
set -xeuo pipefail
max_response_length=$((1024 * 2))
RUNTIME_ENV=${RUNTIME_ENV:-"${PWD}/verl/trainer/runtime_env.yaml"}
export VLLM_USE_V1=1
mkdir -p "/placeholder/ckpts"
cp /models/none/chat_template.jinja "/placeholder/model/chat_template.jinja"
ray job submit --no-wait --runtime-env="${RUNTIME_ENV}" \
    --working-dir "${PWD}" \
    -- python3 -m recipe.dapo.main_dapo \
    data.max_response_length=${max_response_length} \
    data.train_batch_size=512 \
    data.gen_batch_size=$((512 * 3)) \
    algorithm.adv_estimator=grpo \
    algorithm.filter_groups.enable=True \
    algorithm.filter_groups.metric=acc \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size=null \
    actor_rollout_ref.rollout.log_prob_micro_batch_size=null \
    actor_rollout_ref.ref.log_prob_micro_batch_size=null \
    actor_rollout_ref.rollout.n=16 \
    reward_model.reward_manager=dapo \
    reward_model.overlong_buffer.enable=True \
    reward_model.overlong_buffer.len=512 \
    reward_model.overlong_buffer.penalty_factor=1.0 \
    trainer.n_gpus_per_node=8
"""


def test_ray_job_submit_runs_the_command_after_the_separator_and_cp_mkdir_do_nothing(tmp_path) -> None:
    argvs, tail = CVS.capture_commands(RECIPE, tmp_path)
    assert tail == ""  # set -e: a real cp of a missing file would have stopped the script
    (argv,) = argvs
    command = CVS.parse_command(argv)
    assert argv[:3] == ["python3", "-m", "recipe.dapo.main_dapo"] and command.module == CVS.DAPO_MODULE
    assert command.overrides[:3] == (
        "data.max_response_length=2048",
        "data.train_batch_size=512",
        "data.gen_batch_size=1536",
    )
    # main_dapo is main_ppo over the recipe's config, unless the script names another one.
    assert CVS.entry_args(command)[:2] == ("--config-name", "dapo_trainer")
    named = CVS.parse_command(["python3", "-m", CVS.DAPO_MODULE, "--config-name=dapo_megatron_trainer", "a=1"])
    assert CVS.entry_args(named) == named.args


def test_a_recipe_script_loads_over_dapo_trainer_and_a_refused_config_is_named(tmp_path, fake_backends) -> None:
    ok = CVS.check_script("dapo/run.sh", RECIPE, tmp_path, fake_backends)
    assert ok.loads and ok.commands == 1, ok.reasons
    # Over verl's defaults (main_ppo) the same overrides fail: the naive manager takes no overlong buffer.
    plain = RECIPE.replace("recipe.dapo.main_dapo", "verl.trainer.main_ppo").replace(
        "reward_model.reward_manager=dapo ", ""
    )
    failed = CVS.check_script("dapo/plain.sh", plain, tmp_path, fake_backends)
    assert failed.failing_keys == ("reward_model.reward_kwargs.max_resp_len",), failed.reasons
    assert "set reward_model.reward_manager=dapo" in failed.reasons[0]
    mega = CVS.check_script(
        "dapo/m.sh", f"python3 -m {CVS.DAPO_MODULE} --config-name=dapo_megatron_trainer x=1\n", tmp_path, fake_backends
    )
    assert mega.reasons[0].startswith("--config-name=dapo_megatron_trainer: verl's dapo_megatron_trainer.yaml is not")


def test_recipe_scripts_come_from_a_checkout_or_a_git_dir(tmp_path) -> None:
    import subprocess

    checkout = tmp_path / "recipe_repo"
    (checkout / "dapo" / "config").mkdir(parents=True)
    (checkout / "dapo" / "run_b.sh").write_text("echo b\n")
    (checkout / "dapo" / "run_a.sh").write_text("echo a\n")
    (checkout / "dapo" / "config" / "not_a_script.sh").write_text("")  # only the recipe folder's own scripts
    work = tmp_path / "work"
    work.mkdir()
    assert CVS.recipe_scripts(checkout, work) == [("dapo/run_a.sh", "echo a\n"), ("dapo/run_b.sh", "echo b\n")]
    assert (work / "dapo" / "run_a.sh").is_file()  # the scripts' working directory holds the recipe folder
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(checkout)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(checkout), str(bare)], check=True)
    names = [name for name, _ in CVS.recipe_scripts(bare, tmp_path / "work2")]
    assert names == ["dapo/run_a.sh", "dapo/run_b.sh"]
