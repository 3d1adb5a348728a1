#!/usr/bin/env bash
# vLLM's tests and accelplat's requirement vocabulary, for vLLM 0.33.0 and 0.34.0: every condition
# `accelplat scan` replaces and `tools/vllm_capabilities/migrate.py` rewrites keeps its skip/run
# decision on every modelled host (NVIDIA sm_75/80/89/90/100, AMD gfx90a/942/950/1100, Intel Max
# and Arc B580, CPU) and host setting (VLLM_TARGET_DEVICE=cpu on NVIDIA and AMD GPUs, a CPU build
# of vLLM on an NVIDIA GPU, a GPU build on a host without one), vLLM's side from a model of its
# source, accelplat's from replaying tests/hosts. Then `accelplat scan --diff` lists the platform
# predicates 0.34.0 added to 0.33.0's tests (a figure, not a gate). Static: nothing is imported
# from vLLM, nothing collected. Prints the figures.
#
# Usage: bash .ci/vllm-vocabulary.sh
# Environment:
#   VLLM_033_DIR, VLLM_034_DIR  unpacked vllm-0.33.0 / vllm-0.34.0 source trees (default: fetched
#                               by .ci/vllm_suite/fetch_sdist.py and checked against the pins)
#   PYTHON                      a Python with accelplat importable (default: python)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python}
SHA_033=f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112  # vllm-0.33.0.tar.gz
SHA_034=fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113  # vllm-0.34.0.tar.gz
fetch() { "$PY" .ci/vllm_suite/fetch_sdist.py "$1" "$(mktemp -d)" "$2" | tail -n 1; }
src_033=${VLLM_033_DIR:-$(fetch 0.33.0 "$SHA_033")}
src_034=${VLLM_034_DIR:-$(fetch 0.34.0 "$SHA_034")}
started=$(date +%s)
for src in "$src_033" "$src_034"; do
  echo "vllm-vocabulary: $(basename "$src")"
  "$PY" tools/vllm_capabilities/prove.py "$src/tests" --check
done
proved=$(date +%s)

# The documented example: what 0.34.0 added, through git, as a project's CI would ratchet it.
repo=$(mktemp -d)
git -C "$repo" init -q
cp -r "$src_033/tests" "$repo/"
git -C "$repo" add -A
git -C "$repo" -c user.name=ci -c user.email=ci@localhost commit -qm "vLLM 0.33.0 tests"
rm -rf "$repo/tests"
cp -r "$src_034/tests" "$repo/"
set +e
"$PY" -m accelplat scan "$repo/tests" --diff HEAD >"$repo/diff.txt"
status=$?
set -e
if [ "$status" -gt 1 ]; then
  cat "$repo/diff.txt" >&2
  exit "$status"
fi
echo "vllm-vocabulary: scan --diff 0.33.0 -> 0.34.0: $(head -n 1 "$repo/diff.txt")"
rm -rf "$repo"
echo "vllm-vocabulary: proofs $((proved - started)) s, scan --diff $(($(date +%s) - proved)) s"
