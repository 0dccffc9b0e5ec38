#!/usr/bin/env bash
# One device check for any accelerator: the machine's facts, `verl plugins`, and the nox device sessions (the
# conformance kits on the device and a 3-step main job) for each backend combination, within a time budget.
# Prepared, never run on a device yet (see docs/platform-vendors.md, "Backend matrix").
#
#   scripts/check_device.sh [cuda|rocm|npu|pretend|auto]      (default auto: the first of nvidia-smi, rocm-smi /
#                                                            amd-smi, npu-smi found; pretend needs VERL_PRETEND_DEVICES)
#
# Environment:
#   OUT             folder for summary.txt and the logs (default runs/check_device); the summary is also printed
#   BUDGET_S        total seconds for everything (default 420: leaves room under a 10-minute call)
#   COMBOS          combinations to run, in order (default "reference-hf fsdp-hf", plus "fsdp-vllm" when vLLM
#                   imports); one that no longer fits in the budget is reported as not run
#   PYTHON          interpreter whose environment holds the machine's torch (default python3)
#   VENV            empty (default): install into $PYTHON's own environment (a rented machine's, thrown away
#                   after); a path: create/reuse a venv there with --system-site-packages. A venv made from an
#                   interpreter that is itself in a venv sees the base interpreter's packages, not that venv's
#                   (so not its torch): leave VENV empty on such machines.
#   PIP_EXTRA_ARGS  extra pip arguments, e.g. "--no-index --find-links wheels" on a machine without PyPI
#
# Installing: verl-core, verl-fsdp (and verl-vllm / verl-npu where they apply) and nox go in, editable.
# Where pip cannot build them (no PyPI and no hatchling), the checkout is used as it is: a stand-in install of
# dist-info folders generated from each pyproject.toml (entry points included) plus the src folders on
# PYTHONPATH, which verl's plugin discovery reads exactly like installed packages. verl-core's own
# dependencies missing from the machine (tensordict, cattrs, ...) must then be carried as wheels, e.g. here:
#   pip download tensordict cattrs nox --only-binary :all: --python-version 3.12 --platform manylinux2014_x86_64 -d wheels
# and PIP_EXTRA_ARGS="--no-index --find-links wheels" there. Each session runs through nox (`nox --no-venv
# --no-install -s "<device>(<combo>)"`, in this environment); without nox the script runs what the session runs
# after its checks (pytest tests/device with the session's variables) and says so.
#
# Exit status: 0 when every combination passed; 1 when one failed, timed out, did not fit in the budget or was
# skipped (the summary gives the session's reason: no such device here, its probe said no, or config load
# refuses the combination on this platform).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DEVICE=${1:-auto}
OUT=${OUT:-$ROOT/runs/check_device}
BUDGET_S=${BUDGET_S:-420}
PYTHON=${PYTHON:-python3}
VENV=${VENV:-}
START=$(date +%s)
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
: > "$OUT/install.log"
note() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }

if [ "$DEVICE" = auto ]; then
    if command -v nvidia-smi >/dev/null; then DEVICE=cuda
    elif command -v rocm-smi >/dev/null || command -v amd-smi >/dev/null; then DEVICE=rocm
    elif command -v npu-smi >/dev/null; then DEVICE=npu
    else note "auto: none of nvidia-smi, rocm-smi, amd-smi, npu-smi on PATH; name the device"; exit 1
    fi
fi
case "$DEVICE" in cuda|rocm|npu|pretend) ;; *) echo "usage: $0 [cuda|rocm|npu|pretend|auto]" >&2; exit 2 ;; esac

note "check_device.sh $DEVICE $(date -u +%FT%TZ) on $(hostname) (commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')), budget ${BUDGET_S}s"
# ---------------------------------------------------------------- 1. machine facts
{
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
    command -v rocm-smi >/dev/null && rocm-smi --showproductname --showdriverversion 2>&1 | grep -v '^=*$' | head -12
    command -v npu-smi >/dev/null && npu-smi info 2>&1 | head -20
    uname -srm
} 2>&1 | tee -a "$SUMMARY"

# ---------------------------------------------------------------- 2. environment
if [ -n "$VENV" ]; then
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv --system-site-packages "$VENV"
    PY="$VENV/bin/python"
else
    PY=$(command -v "$PYTHON")
fi
export PATH="$(dirname "$PY"):$PATH"  # pytest and verl as the sessions call them
# The pretend accelerator trains on the CPU: a machine without torch gets the CPU build pinned for CI.
if [ "$DEVICE" = pretend ] && ! "$PY" -c "import torch" >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    "$PY" -m pip install -q ${PIP_EXTRA_ARGS:-} "${VERL_TORCH_PIN:-torch==2.13.0}" > "$OUT/install.log" 2>&1
fi
FOLDERS=(core plugins/verl-fsdp)
[ "$DEVICE" = npu ] && [ -d plugins/verl-npu ] && FOLDERS+=(plugins/verl-npu)
[ "$DEVICE" = pretend ] && FOLDERS+=(examples/pretend-accelerator)
HAVE_VLLM=0
"$PY" -c "import vllm" >/dev/null 2>&1 && HAVE_VLLM=1 && FOLDERS+=(plugins/verl-vllm)
EDITABLE=()
for f in "${FOLDERS[@]}"; do EDITABLE+=(-e "./$f"); done
MODE=installed
# shellcheck disable=SC2086  # PIP_EXTRA_ARGS is a list of arguments
NOX_PKG=()
"$PY" -c "import nox" >/dev/null 2>&1 || NOX_PKG=(nox)
if ! "$PY" -m pip install -q ${PIP_EXTRA_ARGS:-} "${EDITABLE[@]}" "${NOX_PKG[@]}" >> "$OUT/install.log" 2>&1; then
    MODE="checkout (pip could not install: see install.log)"
    SITE=$(mktemp -d /tmp/verl-standin-site.XXXXXX)  # outside $OUT: only the summary and logs go back

    export PYTHONPATH="$("$PY" scripts/checkout_site.py "$SITE" "${FOLDERS[@]}"):${PYTHONPATH:-}"
    [ ${#NOX_PKG[@]} -gt 0 ] && { "$PY" -m pip install -q ${PIP_EXTRA_ARGS:-} nox >> "$OUT/install.log" 2>&1 || true; }
fi
"$PY" - <<'PY' 2>&1 | tee -a "$SUMMARY"
import importlib, sys
print(f"python {sys.version.split()[0]} at {sys.executable}")
try:
    import torch
    print(f"torch {torch.__version__} cuda {torch.version.cuda} hip {getattr(torch.version, 'hip', None)} "
          f"cuda.is_available {torch.cuda.is_available()} devices {torch.cuda.device_count()}")
except Exception as exc:
    print(f"torch does not import: {type(exc).__name__}: {exc}")
missing = [m for m in ("verl", "tensordict", "cattrs", "transformers", "pluggy", "attrs", "pytest", "nox")
           if importlib.util.find_spec(m) is None]
print("missing modules: " + (", ".join(missing) if missing else "none"))
PY
note "environment: $MODE; vLLM importable: $HAVE_VLLM; $(( $(date +%s) - START ))s so far"

# ---------------------------------------------------------------- 3. verl plugins
"$PY" -m verl.cli.main plugins > "$OUT/plugins.txt" 2>&1
note "verl plugins (exit $?):"
grep -E "^Platform of this machine|^  (cpu|cuda|rocm|npu|pretend) " "$OUT/plugins.txt" | tee -a "$SUMMARY"

# ---------------------------------------------------------------- 4. device sessions
COMBOS=${COMBOS:-"reference-hf fsdp-hf$([ "$HAVE_VLLM" = 1 ] && echo ' fsdp-vllm')"}
HAVE_NOX=0
"$PY" -c "import nox" >/dev/null 2>&1 && HAVE_NOX=1
status=0
for combo in $COMBOS; do
    session="$DEVICE($combo)"
    budget=$(left)
    if [ "$budget" -lt 60 ]; then
        note "NOT RUN $session: ${budget}s of the budget left"
        status=1
        continue
    fi
    t0=$(date +%s)
    log="$OUT/${DEVICE}-${combo}.log"
    if [ "$HAVE_NOX" = 1 ]; then
        timeout "$budget" "$PY" -m nox --no-venv --no-install -s "$session" > "$log" 2>&1
        rc=$?
        verdict=$(grep -E "^nox > Session " "$log" | tail -1 | sed 's/^nox > //')  # "Session X skipped: why", ...
    else
        training=${combo%%-*}
        rollout=${combo#*-}
        platform=$DEVICE
        VERL_TEST_DEVICE=$platform VERL_TEST_TRAINING=$training VERL_TEST_ROLLOUT=$rollout VERL_TEST_STEPS=3 \
            timeout "$budget" "$PY" -m pytest tests/device -v -rs > "$log" 2>&1
        rc=$?
        verdict="(without nox: pytest tests/device) $(tail -1 "$log")"
    fi
    secs=$(( $(date +%s) - t0 ))
    if [ "$rc" = 124 ]; then
        note "TIMEOUT $session after ${secs}s (budget)"; status=1
    elif [ "$rc" = 0 ] && [[ "$verdict" == *skipped* ]]; then
        note "SKIP $session (${secs}s): $verdict"; status=1  # the device check did not run: not a pass
    elif [ "$rc" = 0 ]; then
        note "OK $session (${secs}s): ${verdict:-see $log}"
    else
        note "FAIL $session (${secs}s, exit $rc): ${verdict:-}"; status=1
        grep -E "^(FAILED|ERROR)|Error|error:" "$log" | head -12 | tee -a "$SUMMARY"
    fi
    grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|skipped" "$log" | grep -E "[0-9]+ (passed|failed|skipped)" | tail -1 \
        | sed 's/^/    /' | tee -a "$SUMMARY"
done
note "done in $(( $(date +%s) - START ))s: status $status"
exit $status
