#!/usr/bin/env bash
# vLLM's own tests migrated from platform predicates to declared requirements: checks, by
# collection only, that every test id's skip/run decision is identical before and after, on this
# machine and replaying each recorded GPU machine (tools/vllm_capabilities/*-facts.json).
#
# Usage: bash .ci/vllm-capabilities.sh
# Environment:
#   VLLM_SDIST_DIR  an unpacked vllm-0.32.0 source tree (default: fetched and sha256-checked by
#                   .ci/vllm_suite/fetch_sdist.py, as .ci/vllm-suite.sh does)
# Reuses the .venv-vllm environment .ci/vllm-engine.sh builds.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="$PWD/.venv-vllm/bin/python"
if [ ! -x "$PY" ]; then
  echo "vllm-capabilities: .venv-vllm is missing; run .ci/vllm-engine.sh first" >&2
  exit 1
fi
src=${VLLM_SDIST_DIR:-$("$PY" .ci/vllm_suite/fetch_sdist.py 0.32.0 "$(mktemp -d)" | tail -n 1)}
started=$(date +%s)
"$PY" tools/vllm_capabilities/compare.py "$src" --python "$PY"
echo "vllm-capabilities: $(($(date +%s) - started)) s"
