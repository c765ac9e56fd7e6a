#!/usr/bin/env bash
# GPU check, one script, no network: build specnative with CUDA for this GPU, run the test suite
# with every layer offloaded, a short sweep and the peer table, and put everything in one folder.
#
#   here:        bash bench/prepare_device_carry.sh          (packs .carry/: llama.cpp + wheels)
#   on the GPU:  bash bench/gpu_check.sh [OUT_DIR]           (device tool: carry [".carry"])
#
# Env: CUDA_ARCH (default: what nvidia-smi reports, e.g. 90 on an H200), JOBS (default: nproc),
#      GEMMA_GGUF=/path/gemma-3-270m-Q4_K_M.gguf to add the Gemma rows (too big to carry).
# Sized for ~12 minutes on an H200 box: ggml-cuda for one architecture, FA kernels for f16 only.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-bench/results}/gpu-check}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1
t0=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - t0 ))s] $*"; }
export PYTHONUNBUFFERED=1

step "hardware"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv || echo "no nvidia-smi"
nvcc --version | tail -1 || echo "no nvcc"
CUDA_ARCH=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')}
CUDA_ARCH=${CUDA_ARCH:-90}
JOBS=${JOBS:-$(nproc)}
echo "CUDA_ARCH=$CUDA_ARCH JOBS=$JOBS"

step "inputs carried from a machine with network"
if [ ! -d vendor/llama.cpp ] && [ -f .carry/llama.cpp-trimmed.tar.gz ]; then
  tar -C vendor -xzf .carry/llama.cpp-trimmed.tar.gz
  # derived from the pinned, hash-checked source: mark it so the build reuses it offline
  python3 -c "import json;print(json.load(open('vendor/llama.cpp.lock'))['sha256'])" > vendor/llama.cpp/.specnative-pin
fi
if ls .carry/wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/specnative-site .carry/wheels/*.whl
  export PYTHONPATH=/tmp/specnative-site${PYTHONPATH:+:$PYTHONPATH}
fi

step "build (GGML_CUDA=ON, CMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH, peer tools in the same build)"
export SPECNATIVE_CUDA=ON SPECNATIVE_PEER_TOOLS=ON CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
export CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH"
if ! python3 -m pip install --no-build-isolation --no-deps -v . > "$OUT_DIR/build.log" 2>&1; then
  tail -40 "$OUT_DIR/build.log"; echo "BUILD FAILED"; exit 1
fi
grep -E "specnative: (CUDA|CPU flags)|SPECNATIVE_CUDA=ON but" "$OUT_DIR/build.log" | head -3
cd /tmp && python3 -c "import specnative; print(specnative.build_info())"; cd - >/dev/null
BIN_DIR=$(dirname "$(find build -name llama-bench -type f | head -1)")
echo "peer tools in $BIN_DIR"

step "test suite, all layers on the GPU"
SPECNATIVE_TEST_NGL=-1 python3 -m pytest -q -x --durations=5 -p no:cacheprovider > "$OUT_DIR/pytest.log" 2>&1
echo "pytest exit $?"; tail -15 "$OUT_DIR/pytest.log"

step "short sweep: tiny preset, ctx 0/8192, concurrency 1/4/8"
python3 -m specnative.sweep --preset tiny --ctx-len 0,8192 -np 1,4,8 -ngl -1 -r 3 -o "$OUT_DIR/sweep-tiny"
if [ -n "${GEMMA_GGUF:-}" ] && [ -f "$GEMMA_GGUF" ]; then
  step "short sweep: gemma3-270m"
  python3 -c "from specnative.engine import quantize; quantize('$GEMMA_GGUF', '/tmp/gemma-Q8_0.gguf', 'Q8_0')"
  python3 -m specnative.sweep -m "$GEMMA_GGUF" -m /tmp/gemma-Q8_0.gguf -md "$GEMMA_GGUF" \
      --ctx-len 0,8192 -np 1,4,8 -ngl -1 -r 3 -n 64 -o "$OUT_DIR/sweep-gemma"
fi

step "timers cover the wall time (sum of step timers / total, every row)"
python3 - "$OUT_DIR" <<'PY'
import sys, glob
from specnative.schema import read_traces
for path in glob.glob(f"{sys.argv[1]}/sweep-*/traces.csv"):
    t = read_traces(path)
    parts = t[["prefill_target_ms", "prefill_draft_ms", "draft_ms", "verify_ms", "resample_ms", "decode_ms"]].fillna(0)
    cover = parts.sum(axis=1) / t["total_ms"]
    print(f"{path}: min coverage {cover.min():.4f} over {len(t)} rows", "OK" if cover.min() >= 0.99 else "BELOW 0.99")
PY

step "peers side by side (llama-bench, llama-speculative-simple)"
python3 bench/peers.py --models tiny --gpu-layers -1 --tools-dir "$BIN_DIR" --out "$OUT_DIR" || echo "peers failed"

step "pack results"
tar -czf "$OUT_DIR/runs.tar.gz" -C "$OUT_DIR" $(cd "$OUT_DIR" && ls -d sweep-* 2>/dev/null) 2>/dev/null
echo "done in $(( $(date +%s) - t0 ))s; results in $OUT_DIR"
