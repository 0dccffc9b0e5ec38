#!/usr/bin/env bash
# verl-vllm on an NVIDIA GPU, in one go: a fresh venv with verl-core + verl-vllm[cuda], then
#   1. the rollout conformance suite on cuda in float32 and bfloat16 (sleep/wake at level 1 included), and
#      the engine tests (seeds, weight updates against the hf engine),
#   2. a 3-step `verl train` (GRPO on GSM8K, SmolLM2-135M) with actor_rollout_ref.rollout.name=vllm on cuda.
# Writes logs and a summary to $OUT (default runs/check_cuda); exit status 0 only if every part passed.
#
#   bash plugins/verl-vllm/scripts/check_cuda.sh
#
# Environment:
#   VENV            venv to create/reuse (default /tmp/verl-vllm-cuda)
#   PYTHON          interpreter for the venv (default python3.11, else python3)
#   PIP_EXTRA_ARGS  extra pip arguments, e.g. "--no-index --find-links /wheels" on a machine without PyPI
#   SYSTEM_VLLM=1   reuse a vllm already installed in the system interpreter (venv --system-site-packages;
#                   installs verl-vllm without the [cuda] extra)
#   STEPS           training steps of the main-job run (default 3)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
VENV=${VENV:-/tmp/verl-vllm-cuda}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
OUT=${OUT:-$ROOT/runs/check_cuda}
STEPS=${STEPS:-3}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

note "check_cuda.sh $(date -u +%FT%TZ) on $(hostname) (commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$SUMMARY"

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
    if [ "${SYSTEM_VLLM:-0}" = "1" ]; then
        "$PYTHON" -m venv --system-site-packages "$VENV"
    else
        "$PYTHON" -m venv "$VENV"
    fi
fi
PIP=("$VENV/bin/python" -m pip install ${PIP_EXTRA_ARGS:-})
# The CPU development machine caps torch through a pip constraints file; a CUDA torch must not be capped.
export PIP_CONSTRAINT=""
if [ "${SYSTEM_VLLM:-0}" = "1" ]; then
    "${PIP[@]}" -e "./core[test]" -e "./plugins/verl-vllm[test]" 2>&1 | tail -3
else
    "${PIP[@]}" -e "./core[test]" -e "./plugins/verl-vllm[cuda,test]" 2>&1 | tail -3
fi
"$VENV/bin/python" - <<'PY' | tee -a "$SUMMARY"
import torch, vllm
print(f"torch {torch.__version__} cuda {torch.version.cuda} available {torch.cuda.is_available()}; vllm {vllm.__version__}")
PY
note "install: $(( $(date +%s) - start )) s"

status=0
run_part() {  # name, command...
    local name=$1; shift
    local t0=$(date +%s)
    if "$@" > "$OUT/$name.log" 2>&1; then
        note "PASS $name ($(( $(date +%s) - t0 )) s): $(grep -E '[0-9]+ passed' "$OUT/$name.log" | tail -1)"
    else
        status=1
        note "FAIL $name ($(( $(date +%s) - t0 )) s): see $OUT/$name.log"
        tail -30 "$OUT/$name.log" >> "$SUMMARY"
    fi
}

export VERL_VLLM_TEST_DEVICE=cuda
run_part conformance "$VENV/bin/pytest" plugins/verl-vllm/tests/test_vllm_conformance.py -q -p no:cacheprovider
run_part engine_tests "$VENV/bin/pytest" plugins/verl-vllm/tests/test_vllm_engine.py -q -p no:cacheprovider
run_part main_job "$VENV/bin/verl" train --run-dir "$OUT/main_job" \
    actor_rollout_ref.rollout.name=vllm \
    trainer.device=cuda \
    actor_rollout_ref.rollout.dtype=bfloat16 \
    actor_rollout_ref.rollout.engine_kwargs.vllm.gpu_memory_utilization=0.3 \
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
    keys = ("step", "critic/score/mean", "response_length/mean", "timing_s/gen", "timing_s/step")
    print({k: round(r[k], 3) if isinstance(r.get(k), float) else r.get(k) for k in keys if k in r})
PY
fi
note "total: $(( $(date +%s) - start )) s; status $status"
exit $status
