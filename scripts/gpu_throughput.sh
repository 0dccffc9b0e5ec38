#!/usr/bin/env bash
# The GPU throughput benchmark (benchmarks/gpu_throughput.py) on a machine with an NVIDIA GPU and no network.
#
#   scripts/gpu_throughput.sh --prepare      # here, with PyPI and the SmolLM2 wheel: fills .gpu_bench/
#   scripts/gpu_throughput.sh [ARGS ...]     # there: installs what .gpu_bench carries, runs the benchmark
#
# --prepare copies SmolLM2's tokenizer (verl-core converts the model once) to .gpu_bench/tokenizer and downloads
# the wheels verl-core needs that a bare PyTorch image lacks (tensordict, cattrs and their small dependencies, for
# Python WHEEL_PY, default 3.12 as on the GPU image, manylinux x86_64) to .gpu_bench/wheels, and adds .gpu_bench to
# .git/info/exclude. Carry that folder to the GPU machine (the device tool: carry=[".gpu_bench"]; about 5 MB).
#
# There: the wheels go into a private site folder, the checkout's packages (core, verl-fsdp, verl-vllm when vLLM
# imports) onto PYTHONPATH with stand-in metadata (scripts/checkout_site.py), then the benchmark runs with ARGS
# (default: --size 0.5b --steps 3) under a BUDGET_S-second limit (default 480, under a 10-minute call). vLLM and
# verl 0.9 are gigabytes: each side that needs them runs where the machine has them (VERL_PYTHON=<a python with
# verl 0.9 and vLLM>) and is reported as not run otherwise. Results: $OUT/gpu_throughput.{md,json} (OUT default
# runs/gpu_throughput), printed at the end.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
BENCH=.gpu_bench
WHEELS="tensordict cattrs pyvers orjson"

if [ "${1:-}" = "--prepare" ]; then
    mkdir -p "$BENCH/tokenizer" "$BENCH/wheels"
    grep -qx "/$BENCH/" .git/info/exclude 2>/dev/null || echo "/$BENCH/" >> .git/info/exclude
    "$PY" - "$BENCH/tokenizer" <<'PY' || exit 1
import sys
from verl.models import load_tokenizer, resolve_model_path
load_tokenizer(resolve_model_path("smollm2-135m-instruct")).save_pretrained(sys.argv[1])
print(f"tokenizer -> {sys.argv[1]}")
PY
    # shellcheck disable=SC2086
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${WHEEL_PY:-3.12}" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$BENCH/wheels" $WHEELS || exit 1
    du -sh "$BENCH"
    exit 0
fi

OUT=${OUT:-$ROOT/runs/gpu_throughput}
mkdir -p "$OUT"
SITE=$(mktemp -d /tmp/verl-gpu-site.XXXXXX)
if compgen -G "$BENCH/wheels/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE/wheels" "$BENCH"/wheels/*.whl \
        > "$OUT/setup.log" 2>&1 || { echo "installing the carried wheels failed: $OUT/setup.log"; exit 1; }
    export PYTHONPATH="$SITE/wheels:${PYTHONPATH:-}"
fi
FOLDERS=(core plugins/verl-fsdp)
"$PY" -c "import vllm" >/dev/null 2>&1 && FOLDERS+=(plugins/verl-vllm)
export PYTHONPATH="$("$PY" scripts/checkout_site.py "$SITE/checkout" "${FOLDERS[@]}"):$PYTHONPATH"
# One setup file beside the results: a device machine returns at most 8 files (md, json, setup, a log per side).
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$OUT/setup.log"
"$PY" -c "import torch, verl, tensordict; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" \
    2>&1 | tee -a "$OUT/setup.log"
ARGS=("$@")
[ ${#ARGS[@]} -eq 0 ] && ARGS=(--size 0.5b --steps 3)
# Model, data and run folders stay off $OUT (only results and logs go back from a device machine).
timeout "${BUDGET_S:-480}" "$PY" benchmarks/gpu_throughput.py --tokenizer "$BENCH/tokenizer" --out "$OUT" \
    --work "${WORK:-/tmp/verl-gpu-throughput}" "${ARGS[@]}"
rc=$?
[ "$rc" = 124 ] && echo "stopped at the ${BUDGET_S:-480}s budget: the sides finished so far are in $OUT"
exit "$rc"
