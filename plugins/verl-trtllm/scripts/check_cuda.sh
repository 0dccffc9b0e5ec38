#!/usr/bin/env bash
# verl-trtllm on an NVIDIA GPU, in one go: a fresh venv with verl-core + verl-fsdp + verl-trtllm[cuda] (TensorRT-LLM
# from NVIDIA's index), then
#   0. the installed TorchLlmArgs fields against the plugin's bundled snapshot (information, never a failure),
#   1. the CPU tests of the plugin (translation, options, stand-in control flow) in that environment,
#   2. the rollout conformance suite on cuda in bfloat16 (RolloutEngineTests, bf16 tolerance 5e-2; sleep/wake included),
#   3. the FSDP -> trtllm weight sync (greedy text equals the hf engine holding the synced weights),
#   4. a 3-step `verl train` (GRPO on GSM8K, SmolLM2-135M) with the FSDP actor and actor_rollout_ref.rollout.name=trtllm.
# Writes logs and a summary to $OUT (default runs/check_cuda_trtllm); exit status 0 only if every part passed.
# Never run on the CPU development machine (TensorRT-LLM does not install there).
#
#   bash plugins/verl-trtllm/scripts/check_cuda.sh
#
# Environment:
#   VENV            venv to create/reuse (default /tmp/verl-trtllm-cuda)
#   PYTHON          interpreter for the venv (default python3.12, else python3; TensorRT-LLM wheels are cp310/cp312)
#   PIP_EXTRA_ARGS  extra pip arguments, e.g. "--no-index --find-links /wheels" on a machine without the indexes
#   SYSTEM_TRTLLM=1 reuse a tensorrt_llm already installed in the system interpreter (NGC TensorRT-LLM image:
#                   venv --system-site-packages; installs verl-trtllm without the [cuda] extra)
#   STEPS           training steps of the main-job run (default 3)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
VENV=${VENV:-/tmp/verl-trtllm-cuda}
PYTHON=${PYTHON:-$(command -v python3.12 || command -v python3)}
OUT=${OUT:-$ROOT/runs/check_cuda_trtllm}
STEPS=${STEPS:-3}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

note "check_cuda.sh (verl-trtllm) $(date -u +%FT%TZ) on $(hostname) (commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$SUMMARY"

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
    if [ "${SYSTEM_TRTLLM:-0}" = "1" ]; then
        "$PYTHON" -m venv --system-site-packages "$VENV"
    else
        "$PYTHON" -m venv "$VENV"
    fi
fi
PIP=("$VENV/bin/python" -m pip install ${PIP_EXTRA_ARGS:-})
# The CPU development machine caps torch through a pip constraints file; TensorRT-LLM's CUDA torch must not be capped.
export PIP_CONSTRAINT=""
if [ "${SYSTEM_TRTLLM:-0}" = "1" ]; then
    "${PIP[@]}" -e "./core[test]" -e "./plugins/verl-fsdp" -e "./plugins/verl-trtllm[test]" 2>&1 | tail -3
else
    "${PIP[@]}" --extra-index-url https://pypi.nvidia.com \
        -e "./core[test]" -e "./plugins/verl-fsdp" -e "./plugins/verl-trtllm[cuda,test]" 2>&1 | tail -3
fi
"$VENV/bin/python" - <<'PY' | tee -a "$SUMMARY"
import torch, tensorrt_llm
print(f"torch {torch.__version__} cuda {torch.version.cuda} available {torch.cuda.is_available()}; "
      f"tensorrt_llm {tensorrt_llm.__version__}")
PY
note "install: $(( $(date +%s) - start )) s"

status=0
run_part() {  # name, command...
    local name=$1; shift
    local t0=$(date +%s)
    if "$@" > "$OUT/$name.log" 2>&1; then
        note "PASS $name ($(( $(date +%s) - t0 )) s): $(grep -E '[0-9]+ (passed|skipped)' "$OUT/$name.log" | tail -1)"
    else
        status=1
        note "FAIL $name ($(( $(date +%s) - t0 )) s): see $OUT/$name.log"
        tail -30 "$OUT/$name.log" >> "$SUMMARY"
    fi
}

"$VENV/bin/python" -m verl_trtllm.llm_args_snapshot 2>&1 | tee "$OUT/llm_args_snapshot.log" | tee -a "$SUMMARY" || true
T=plugins/verl-trtllm/tests
run_part cpu_tests "$VENV/bin/pytest" "$T/test_trtllm_translate.py" "$T/test_trtllm_options.py" \
    "$T/test_trtllm_engine_standin.py" "$T/test_trtllm_weights.py" -q -p no:cacheprovider
run_part conformance "$VENV/bin/pytest" "$T/test_trtllm_conformance.py" -q -p no:cacheprovider -rs
run_part fsdp_sync "$VENV/bin/pytest" "$T/test_trtllm_gpu_sync.py" -q -p no:cacheprovider -rs
run_part main_job "$VENV/bin/verl" train --run-dir "$OUT/main_job" \
    actor_rollout_ref.actor.strategy=fsdp \
    actor_rollout_ref.rollout.name=trtllm \
    trainer.device=cuda \
    trainer.controller=local \
    actor_rollout_ref.rollout.dtype=bfloat16 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.3 \
    trainer.total_training_steps="$STEPS" \
    data.val_max_samples=16 \
    trainer.val_before_train=false \
    trainer.test_freq="$STEPS" \
    trainer.save_freq=-1 \
    trainer.logger=[console,file] \
    trainer.default_local_dir="$OUT/main_job/ckpt" \
    trainer.rollout_data_dir="$OUT/main_job/rollouts" \
    trainer.validation_data_dir="$OUT/main_job/validation"
if [ -f "$OUT/main_job/metrics.jsonl" ]; then
    "$VENV/bin/python" - "$OUT/main_job/metrics.jsonl" <<'PY' | tee -a "$SUMMARY"
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    keys = ("step", "critic/score/mean", "response_length/mean", "timing_s/gen", "timing_s/update_weights", "timing_s/step")
    print({k: round(r[k], 3) if isinstance(r.get(k), float) else r.get(k) for k in keys if k in r})
PY
fi
note "total: $(( $(date +%s) - start )) s; status $status"
exit $status
