#!/usr/bin/env bash
# vLLM's own tests as the acceptance suite for accelplat's drop-in helpers.
#
# Gets the vLLM source distribution matching the CPU engine that .ci/vllm-engine.sh installs,
# makes two copies of its tests/ tree, migrates one (.ci/vllm_suite/migrate.py: vLLM's helper
# definitions in tests/utils.py give way to an import from accelplat.integrations.vllm, and
# tests/conftest.py imports them from there), writes offline stand-ins for the hub models the
# chosen tests name (.ci/vllm_suite/standins.py), runs the chosen tests in both copies, and
# compares the outcomes test id by test id (.ci/vllm_suite/compare.py). A difference must be in
# .ci/vllm_suite/allowlist.txt, which is the "Differences from vLLM" table of
# docs/migrating-vllm-tests.md. The last line printed gives the counts.
#
# Usage: bash .ci/vllm-suite.sh
# Environment:
#   VLLM_SUITE_PYTHON  interpreter with vLLM installed (default: .venv-vllm/bin/python, the
#                      environment .ci/vllm-engine.sh builds)
#   VLLM_SDIST_DIR     an already unpacked vllm-0.32.0 source tree (default: fetch it from PyPI)
#   VLLM_SUITE_WORK    working directory (default: a new temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
VLLM_VERSION=0.32.0
PY=${VLLM_SUITE_PYTHON:-$REPO/.venv-vllm/bin/python}
WORK=${VLLM_SUITE_WORK:-$(mktemp -d)}
HERE=$REPO/.ci/vllm_suite

# The chosen tests: tests that build engines through VllmRunner (vllm_runner) and HfRunner
# (hf_runner) with small models, two of them in a forked child each
# (create_new_process_for_each_test), and the spawn decorator's own tests.
TESTS=(
  "tests/samplers/test_ignore_eos.py::test_ignore_eos[512-half-distilbert/distilgpt2]"
  "tests/models/language/generation/test_common.py::test_models[False-False-5-32-facebook/opt-125m]"
  "tests/models/language/generation/test_common.py::test_models[True-False-5-32-facebook/opt-125m]"
  "tests/v1/e2e/general/test_context_length.py::test_decoder_max_context_length_validation[2047-1-JackFram/llama-160m-2048]"
  "tests/v1/e2e/general/test_context_length.py::test_decoder_max_context_length_validation[2048-1-JackFram/llama-160m-2048]"
  "tests/utils_/test_spawn_decorator.py"
)

if [ ! -x "$PY" ]; then
  echo "vllm-suite: $PY not found; build the vLLM environment with .ci/vllm-engine.sh first" >&2
  exit 1
fi
started=$(date +%s)
if [ -n "${VLLM_SDIST_DIR:-}" ]; then
  src=$VLLM_SDIST_DIR
else
  src=$("$PY" "$HERE/fetch_sdist.py" "$VLLM_VERSION" "$WORK/sdist" | tail -n 1)
fi
# vLLM's conftest needs tblib (a vLLM test requirement the engine does not install).
"$PY" -c "import tblib" 2>/dev/null || "$PY" -m pip install -q tblib

for tree in original migrated; do
  rm -rf "${WORK:?}/$tree"
  mkdir -p "$WORK/$tree"
  cp -r "$src/tests" "$src/pyproject.toml" "$WORK/$tree/"
done
"$PY" "$HERE/migrate.py" "$WORK/migrated"
"$PY" "$HERE/standins.py" "$WORK/hf" >/dev/null 2>&1
prepared=$(date +%s)

run() {
  local tree=$1
  (
    cd "$WORK/$tree"
    env HF_HOME="$WORK/hf" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
      VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_HOST_IP=127.0.0.1 VLLM_CPU_KVCACHE_SPACE=1 \
      PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" \
      "$PY" -m pytest -p no:cacheprovider -p no:accelplat \
      -q -rs --junitxml="$WORK/$tree.xml" "${TESTS[@]}" >"$WORK/$tree.log" 2>&1
  ) || true
  echo "vllm-suite: $tree run: $(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|xfailed|error)' "$WORK/$tree.log" | tail -n 1)"
}
run original
run migrated
finished=$(date +%s)
echo "vllm-suite: preparation $((prepared - started)) s, runs $((finished - prepared)) s; logs in $WORK"
"$PY" "$HERE/compare.py" "$WORK/original.xml" "$WORK/migrated.xml" "$HERE/allowlist.txt"
