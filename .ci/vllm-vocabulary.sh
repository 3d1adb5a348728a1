#!/usr/bin/env bash
# vLLM 0.33.0's tests and accelplat's requirement vocabulary: every condition `accelplat scan`
# replaces and `tools/vllm_capabilities/migrate.py` rewrites keeps its skip/run decision on every
# modelled host (NVIDIA sm_75/80/89/90/100, AMD gfx90a/942/950/1100, Intel Max and Arc B580,
# CPU), vLLM's side from a model of its source, accelplat's from replaying tests/hosts. Static:
# nothing is imported from vLLM, nothing collected; it takes seconds. Prints the figures.
#
# Usage: bash .ci/vllm-vocabulary.sh
# Environment:
#   VLLM_033_DIR  an unpacked vllm-0.33.0 source tree (default: fetched by
#                 .ci/vllm_suite/fetch_sdist.py and checked against the pinned sha256)
#   PYTHON        a Python with accelplat importable (default: python)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python}
SHA256=f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112  # vllm-0.33.0.tar.gz
src=${VLLM_033_DIR:-$("$PY" .ci/vllm_suite/fetch_sdist.py 0.33.0 "$(mktemp -d)" "$SHA256" | tail -n 1)}
started=$(date +%s)
"$PY" tools/vllm_capabilities/prove.py "$src/tests" --check
echo "vllm-vocabulary: $(($(date +%s) - started)) s"
