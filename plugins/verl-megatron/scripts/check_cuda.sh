#!/usr/bin/env bash
# verl-megatron on NVIDIA GPUs, in one go (prepared; it has not run on a GPU yet, see the plugin README):
# a venv that sees the machine's torch (and its Transformer Engine) with verl-core, verl-megatron[cuda] and
# verl-vllm[cuda] installed editable, then
#   1. the plugin's tests on cuda (VERL_MEGATRON_TEST_DEVICE=cuda; -m "not slow or gpu": the fast tests and every
#      gpu-marked one),
#   2. a 3-step `verl train` of the main job (GRPO on GSM8K, SmolLM2-135M) with strategy=megatron, the Transformer
#      Engine layer spec, bf16 and the vLLM rollout, on one GPU,
#   3. with two GPUs or more: the same at tensor_model_parallel_size=2 with sequence parallelism, on two Ray workers.
# Writes each part's log and summary.txt to $OUT (default runs/check_megatron_cuda); exit status 0 only if every part
# passed (a part that cannot run, e.g. no second GPU, is reported as skipped and does not fail the check).
#
#   bash plugins/verl-megatron/scripts/check_cuda.sh
#
# Environment:
#   VENV            venv to create/reuse (default /tmp/verl-megatron-cuda), made with --system-site-packages from
#                   $PYTHON so that the machine's torch and Transformer Engine (which must match it: it is not an
#                   extra of the plugin) are the ones used
#   PYTHON          interpreter for the venv (default python3.11, else python3)
#   PIP_EXTRA_ARGS  extra pip arguments, e.g. "--no-index --find-links /wheels" on a machine without PyPI
#   SYSTEM_VLLM=1   use the vllm the machine already has (installs verl-vllm without its [cuda] extra); PyPI's vllm
#                   pins its own CUDA torch, which can replace the machine's torch and break Transformer Engine
#   STEPS           training steps of the main-job runs (default 3)
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
VENV=${VENV:-/tmp/verl-megatron-cuda}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
OUT=${OUT:-$ROOT/runs/check_megatron_cuda}
STEPS=${STEPS:-3}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

note "check_cuda.sh (verl-megatron) $(date -u +%FT%TZ) on $(hostname) (commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
if ! command -v nvidia-smi >/dev/null; then
    note "FAIL: nvidia-smi is not on PATH: this check needs an NVIDIA GPU machine"
    exit 1
fi
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee -a "$SUMMARY"
GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)

# ---------------------------------------------------------------- install
start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv --system-site-packages "$VENV" || { note "FAIL: cannot create $VENV"; exit 1; }
PY="$VENV/bin/python"
# The CPU development machine caps torch through a pip constraints file; a CUDA torch must not be capped.
export PIP_CONSTRAINT=""
VLLM_PKG="./plugins/verl-vllm[cuda]"
[ "${SYSTEM_VLLM:-0}" = "1" ] && VLLM_PKG="./plugins/verl-vllm"
# shellcheck disable=SC2086  # PIP_EXTRA_ARGS is a list of arguments
if ! "$PY" -m pip install ${PIP_EXTRA_ARGS:-} -e "./core[test,ray]" -e "./plugins/verl-megatron[cuda,test]" \
        -e "$VLLM_PKG" > "$OUT/install.log" 2>&1; then
    note "FAIL install: see $OUT/install.log"
    tail -20 "$OUT/install.log" | tee -a "$SUMMARY"
    exit 1
fi
"$PY" - <<'PY' 2>&1 | tee -a "$SUMMARY"
import importlib.metadata as md

import torch

print(f"torch {torch.__version__} cuda {torch.version.cuda} available {torch.cuda.is_available()} "
      f"devices {torch.cuda.device_count()}")
for dist in ("megatron-core", "transformer_engine", "transformer-engine", "mbridge", "vllm"):
    try:
        print(f"{dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{dist}: not installed")
try:
    import transformer_engine.pytorch  # noqa: F401  (what transformer_impl=transformer_engine needs)

    print("transformer_engine.pytorch imports")
except Exception as exc:  # TE is the machine's: say why it does not work rather than stop here
    print(f"transformer_engine.pytorch does not import: {type(exc).__name__}: {exc}")
PY
note "install: $(( $(date +%s) - start )) s"

# ---------------------------------------------------------------- parts
status=0
run_part() {  # name, command...
    local name=$1; shift
    local t0
    t0=$(date +%s)
    if "$@" > "$OUT/$name.log" 2>&1; then
        note "PASS $name ($(( $(date +%s) - t0 )) s): $(grep -E '[0-9]+ passed' "$OUT/$name.log" | tail -1)"
    else
        status=1
        note "FAIL $name ($(( $(date +%s) - t0 )) s): see $OUT/$name.log"
        tail -30 "$OUT/$name.log" >> "$SUMMARY"
    fi
}

metrics() {  # run dir: one line per step of its metrics.jsonl
    [ -f "$1/metrics.jsonl" ] || return 0
    "$PY" - "$1/metrics.jsonl" <<'PY' | tee -a "$SUMMARY"
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    keys = ("step", "critic/score/mean", "actor/pg_loss", "actor/grad_norm", "response_length/mean", "timing_s/step")
    print({k: round(r[k], 4) if isinstance(r.get(k), float) else r.get(k) for k in keys if k in r})
PY
}

main_job() {  # run dir, extra overrides...
    local dir=$1; shift
    "$VENV/bin/verl" train examples/gsm8k_grpo_smollm2_cpu.yaml --run-dir "$dir" \
        trainer.device=cuda \
        actor_rollout_ref.actor.strategy=megatron \
        actor_rollout_ref.actor.megatron.transformer_impl=transformer_engine \
        actor_rollout_ref.actor.megatron.dtype=bf16 \
        actor_rollout_ref.rollout.name=vllm \
        actor_rollout_ref.rollout.engine_kwargs.vllm.gpu_memory_utilization=0.3 \
        trainer.total_training_steps="$STEPS" \
        data.val_max_samples=16 \
        trainer.val_before_train=false \
        trainer.test_freq="$STEPS" \
        trainer.save_freq=-1 \
        trainer.logger=[console,file] \
        trainer.default_local_dir="$dir/ckpt" \
        trainer.rollout_data_dir="$dir/rollouts" \
        trainer.validation_data_dir="$dir/validation" \
        "$@"
}

export VERL_MEGATRON_TEST_DEVICE=cuda
run_part plugin_tests "$VENV/bin/python" -m pytest plugins/verl-megatron/tests -m "not slow or gpu" -q -rs \
    -p no:cacheprovider
run_part main_job main_job "$OUT/main_job"
metrics "$OUT/main_job"
if [ "$GPUS" -ge 2 ]; then
    run_part main_job_tp2 main_job "$OUT/main_job_tp2" \
        trainer.controller=ray trainer.n_gpus_per_node=2 \
        actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
        actor_rollout_ref.actor.megatron.sequence_parallel=true
    metrics "$OUT/main_job_tp2"
else
    note "SKIP main_job_tp2: $GPUS GPU(s) here, tensor parallelism with sequence parallel needs 2"
fi
note "total: $(( $(date +%s) - start )) s; status $status"
exit $status
