#!/usr/bin/env bash
# The real-GPU proof, section by section, on an NVIDIA host with torch and nvidia-ml-py:
#   bash benchmarks/gpu_proof.sh OUTDIR [facts] [tests] [owners] [detect] [capture] [pack-real] [packed] [pack-pytest]
# Each section writes its log (and JSON where it has one) to OUTDIR and has its own time limit,
# so a slow section costs only itself. The checkout runs uninstalled (PYTHONPATH=.), bytecode
# compiled first, as users run it. BASELINE=DIR names an older tree's checkout for the
# side-by-side detection timing.
set -u
out=${1:?OUTDIR}
shift
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -m compileall -q accelplat benchmarks >/dev/null
[ -n "${BASELINE:-}" ] && python3 -m compileall -q "$BASELINE/accelplat" >/dev/null

section() { printf '\n==> %s (%s)\n' "$1" "$(date +%T)"; }
for what in "$@"; do
  case $what in
  facts)
    section facts
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.reserved,mig.mode.current,compute_mode \
      --format=csv 2>&1 | tee "$out/facts.log"
    timeout 150 python3 benchmarks/gpu_facts.py --json "$out/facts.json" 2>&1 | tee -a "$out/facts.log"
    ;;
  tests)
    section tests
    timeout 240 python3 -m pytest tests/gpu tests/backends/test_cuda.py -q -p no:cacheprovider \
      -x --timeout 120 2>&1 | tail -25 | tee "$out/tests.log"
    ACCELPLAT_PLATFORM=cuda timeout 120 python3 -m pytest --pyargs accelplat.testing._conformance \
      -q -p no:cacheprovider 2>&1 | tail -5 | tee -a "$out/tests.log"
    ;;
  owners)
    section owners
    timeout 300 python3 benchmarks/bench_owners.py --platform cuda --json "$out/owners.json" 2>&1 \
      | tail -40 | tee "$out/owners.log"
    ;;
  detect)
    section detect
    timeout 300 python3 benchmarks/bench_detect.py --runs 21 --no-torch --iterations 5000 \
      --repeats 5 ${BASELINE:+--tree "$BASELINE"} --json "$out/detect.json" 2>&1 | tail -40 \
      | tee "$out/detect.log"
    ;;
  capture)
    section capture
    timeout 60 python3 -m accelplat capture --out "$out/host.tar.gz" 2>&1 | tail -30 | tee "$out/capture.log"
    python3 -m accelplat info --json >"$out/info.json" 2>>"$out/capture.log"
    ;;
  pack-real)
    section pack-real
    # several tests on one GPU at once, each within its budget; MPS enforcement where present
    enforce=""
    command -v nvidia-cuda-mps-control >/dev/null && enforce=mps
    PACK_GPU_LOG="$out/pack-real.jsonl" ACCELPLAT_ENFORCE=${enforce:-auto} timeout 120 python3 -m pytest \
      -p no:cacheprovider -q -n 6 --accelplat-pack tests/gpu/test_pack_real.py 2>&1 | tail -25 \
      | tee "$out/pack-real.log"
    ;;
  packed)
    section packed
    timeout "${PACKED_LIMIT:-300}" python3 benchmarks/packed_suite.py --real --runs "${PACKED_RUNS:-1}" \
      ${PACKED_ARGS:---suite half} --json "$out/packed.json" 2>&1 | tail -40 | tee "$out/packed.log"
    ;;
  pack-pytest)
    section pack-pytest
    timeout 200 python3 benchmarks/pack_pytest.py --json "$out/pack-pytest.json" 2>&1 | tail -30 \
      | tee "$out/pack-pytest.log"
    ;;
  *) echo "unknown section: $what" >&2 ;;
  esac
done
