#!/usr/bin/env bash
# Runs every benchmark of benchmarks/README.md and writes benchmarks/results/<name>.{json,md}.
# Usage: PYTHON=/path/to/venv/bin/python benchmarks/run_all.sh [--quick]
# PYTHON must have verl-core, verl-vllm[cpu] and verl-fsdp installed (`nox -s "plugin(vllm)"` builds such a venv);
# grpo_step.py and protocol.py create their own TRL / verl-PyPI venvs under ~/.cache/verl/bench on first use.
# Run it on a quiet machine: every table reports the CPU share other processes took meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
OUT=benchmarks/results
mkdir -p "$OUT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind
if [[ "${1:-}" == "--quick" ]]; then
  REPS=1; STEPS=2; SIZES="8 32"
else
  REPS=2; STEPS=3; SIZES="8 32 64"
fi
"$PY" benchmarks/protocol.py --reps 3 --threads "$OMP_NUM_THREADS" --json "$OUT/protocol.json" --md "$OUT/protocol.md"
"$PY" benchmarks/advantage_profile.py --reps 3 --threads "$OMP_NUM_THREADS" --json "$OUT/advantage_profile.json" --md "$OUT/advantage_profile.md"
"$PY" benchmarks/train.py --reps "$REPS" --inner 2 --json "$OUT/train.json" --md "$OUT/train.md"
# verl's default-sized budgets (3072 / 6144 real tokens): padded micro-batches then carry many pad tokens.
"$PY" benchmarks/train.py --reps "$REPS" --inner 2 --train-tokens 3072 --infer-tokens 6144 \
  --json "$OUT/train_3072.json" --md "$OUT/train_3072.md"
# shellcheck disable=SC2086
"$PY" benchmarks/rollout.py --engines hf vllm --batch-sizes $SIZES --reps "$REPS" --json "$OUT/rollout.json" --md "$OUT/rollout.md"
# shellcheck disable=SC2086
"$PY" benchmarks/decode_split.py --batch-sizes $SIZES | tee "$OUT/decode_split.md"
"$PY" benchmarks/host_allocator.py --steps "$STEPS" --json "$OUT/host_allocator.json" --md "$OUT/host_allocator.md"
"$PY" benchmarks/grpo_step.py --steps "$STEPS" --reps "$REPS" ${TRL_VENV:+--trl-venv "$TRL_VENV"} \
  --json "$OUT/grpo_step.json" --md "$OUT/grpo_step.md"
# Needs verl-fsdp in $PYTHON too (pip install -e ./plugins/verl-fsdp).
"$PY" benchmarks/hybrid_engine.py --reps "$((REPS + 1))" --json "$OUT/hybrid_engine.json" --md "$OUT/hybrid_engine.md"
"$PY" benchmarks/lora_rollout.py --steps "$STEPS" --reps "$REPS" --json "$OUT/lora_rollout.json" --md "$OUT/lora_rollout.md"
# The code interpreter's cost per call in each isolation (needs bwrap for its bubblewrap row).
"$PY" benchmarks/sandbox_startup.py --calls "$((REPS * 20))" --json "$OUT/sandbox_startup.json" \
  --md "$OUT/sandbox_startup.md"
