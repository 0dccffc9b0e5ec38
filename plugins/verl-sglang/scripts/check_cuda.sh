#!/usr/bin/env bash
# verl-sglang on an NVIDIA GPU, in one go: a fresh venv with verl-core + verl-fsdp + verl-sglang[cuda], then
#   1. the rollout conformance suite on cuda in bfloat16 (eager, and with CUDA graphs + deterministic sampling),
#   2. an FSDP -> SGLang weight sync through the hybrid cycle (sleep, wake weights, sync, wake KV cache),
#   3. a 3-step `verl train` (GRPO on GSM8K, SmolLM2-135M) with actor_rollout_ref.rollout.name=sglang,
#   4. the CPU tests of the plugin (translation, options, stand-ins, real ServerArgs / buckets) in that venv.
# Writes logs and a summary to $OUT (default runs/check_cuda_sglang); exit status 0 only if every part passed.
#
#   bash plugins/verl-sglang/scripts/check_cuda.sh
#
# Environment:
#   VENV            venv to create/reuse (default /tmp/verl-sglang-cuda)
#   PYTHON          interpreter for the venv (default python3.11, else python3)
#   PIP_EXTRA_ARGS  extra pip arguments, e.g. "--no-index --find-links /wheels" on a machine without PyPI
#   SYSTEM_SGLANG=1 reuse an sglang already installed in the system interpreter (venv --system-site-packages;
#                   installs verl-sglang without the [cuda] extra)
#   STEPS           training steps of the main-job run (default 3)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
VENV=${VENV:-/tmp/verl-sglang-cuda}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
OUT=${OUT:-$ROOT/runs/check_cuda_sglang}
STEPS=${STEPS:-3}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

note "check_cuda.sh (verl-sglang) $(date -u +%FT%TZ) on $(hostname) (commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$SUMMARY"

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
    if [ "${SYSTEM_SGLANG:-0}" = "1" ]; then
        "$PYTHON" -m venv --system-site-packages "$VENV"
    else
        "$PYTHON" -m venv "$VENV"
    fi
fi
PIP=("$VENV/bin/python" -m pip install ${PIP_EXTRA_ARGS:-})
# The CPU development machine caps torch through a pip constraints file; sglang pins its own CUDA torch.
export PIP_CONSTRAINT=""
EXTRA="cuda,test"
[ "${SYSTEM_SGLANG:-0}" = "1" ] && EXTRA="test"
"${PIP[@]}" -e "./core[test]" -e "./plugins/verl-fsdp[test]" -e "./plugins/verl-sglang[$EXTRA]" 2>&1 | tail -3
"$VENV/bin/python" - <<'PY' | tee -a "$SUMMARY"
import importlib.metadata as md, torch
from verl_sglang.backend import sglang_available
versions = {}
for d in ("sglang", "sglang-kernel", "sgl-kernel", "flashinfer-python", "torch_memory_saver"):
    try:
        versions[d] = md.version(d)
    except md.PackageNotFoundError:
        pass
print(f"torch {torch.__version__} cuda {torch.version.cuda} available {torch.cuda.is_available()}; {versions}")
print(f"verl-sglang available: {sglang_available()}")
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

T="plugins/verl-sglang/tests"
run_part conformance "$VENV/bin/pytest" "$T/test_sglang_conformance.py" -q -p no:cacheprovider -rs
run_part fsdp_sync "$VENV/bin/pytest" "$T/test_sglang_gpu_sync.py" -q -p no:cacheprovider -rs
run_part main_job "$VENV/bin/pytest" "$T/test_sglang_main_job.py" -q -p no:cacheprovider -rs \
    --basetemp "$OUT/main_job"
run_part cpu_tests "$VENV/bin/pytest" "$T" -q -p no:cacheprovider -m "not gpu"
# A skipped GPU part is not a pass: the summary must show tests that ran.
if grep -E "^PASS (conformance|fsdp_sync|main_job).*skipped" "$SUMMARY" | grep -vq "passed"; then
    status=1
    note "FAIL: a GPU part was skipped (see its log for the reason)"
fi
note "total: $(( $(date +%s) - start )) s; status $status"
exit $status
