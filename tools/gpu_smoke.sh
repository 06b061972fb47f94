#!/usr/bin/env bash
# GPU smoke check (one GPU, under 5 minutes): tiny policy from config, vLLM rollouts.
#  1. vLLM's log-probs equal the policy's and MOVE after a weight push (sleep/wake around it).
#  2. The training job (DeepSpeed ZeRO-2, bf16, vLLM rollouts) runs a short budget: prints steps/s.
# Usage: tools/gpu_smoke.sh [PYTHON]   (needs the train + gpu extras installed)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
start=$(date +%s)
echo "== 1/2 vLLM weight sync"; timeout 150 "$PY" -m tools.gpu.vllm_sync_check
echo "== 2/2 training job on GPU"; SMOKE_BUDGET_SECONDS="${SMOKE_BUDGET_SECONDS:-45}" timeout 200 "$PY" -m tools.gpu.train_run "${OUT:-/tmp/ggpo-gpu-smoke}/record.json"
echo "gpu smoke passed in $(( $(date +%s) - start ))s"
