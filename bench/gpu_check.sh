#!/usr/bin/env bash
# GPU check, one prepared command for a GPU machine without network (Python 3.12, many cores):
# build only the small extension against llama.cpp/ggml-cuda libraries compiled beforehand on a
# machine with nvcc, then run the test suite with every layer offloaded, a short sweep, the
# timer coverage per row and the peer table (llama-bench, llama-speculative-simple, -ngl 99), the
# CUDA model's first test (llama-bench pp1..16 and tg128 beside project --bench), specnative bench,
# serve's results in vllm bench serve's names and the spec policies (static, adaptive, by-batch).
#
#   here, once:   bash bench/build_cuda.sh                (sm_90 libraries; long on 2 cores)
#   here:         bash bench/prepare_device_carry.sh      (fills .carry/, checks the 64 MiB limit)
#   on the GPU:   bash bench/gpu_check.sh                 (with .carry/main beside the tree; ~9 min at most)
#   dry run here: bash bench/prepare_device_carry.sh --dry-run   (CPU libraries, a clean venv)
#
# Chunks are read from CARRY_DIR (.carry/main) and from /tmp/specnative-carry/, where earlier calls
# on the same (still warm) machine copied what did not fit one call (bench/prepare_device_carry.sh
# prints those calls); the Gemma rows run when the model's chunks are there.
# Env: PREBUILT_NAME (cuda; cpu for the dry run), CARRY_DIR, PYTHON (python3), FA (on), WORKDIR
#      (/tmp/specnative-gpu-check), step time limits T_BUILD T_TESTS T_SWEEP T_PEERS T_CELL (seconds).
# Outputs in OUT_DIR (argument, else $OUT, else bench/results/gpu-check), at most 8 plain files:
#   gpu_check.log (every step and table), build.log, pytest.log, results.tar.gz (sweeps, peers).
# Each step has a time limit (the sweeps share T_SWEEP, the new-path cells T_CELL) so that the run stays
# within one 600 s call even when a step hangs (each sweep here takes seconds on a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-bench/results/gpu-check}}
OUT_DIR=$(mkdir -p "$OUT_DIR" && cd "$OUT_DIR" && pwd)
PREBUILT_NAME=${PREBUILT_NAME:-cuda}
CARRY_DIR=${CARRY_DIR:-.carry/main}
PYTHON=${PYTHON:-python3}
case "$PYTHON" in */*) PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")" ;; esac
FA=${FA:-on}
WORKDIR=${WORKDIR:-/tmp/specnative-gpu-check}
T_BUILD=${T_BUILD:-120} T_TESTS=${T_TESTS:-120} T_SWEEP=${T_SWEEP:-100} T_PEERS=${T_PEERS:-60} T_CELL=${T_CELL:-30}
LOG="$OUT_DIR/gpu_check.log"
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1
t0=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - t0 ))s] $*"; }
export PYTHONUNBUFFERED=1
RESULTS="$WORKDIR/results"
rm -rf "$WORKDIR" && mkdir -p "$WORKDIR/site" "$RESULTS"
WORKDIR=$(cd "$WORKDIR" && pwd) RESULTS=$(cd "$RESULTS" && pwd)
pack() {  # the few files that come back; called at the end and kept current after each step
  tar -czf "$OUT_DIR/results.tar.gz" -C "$RESULTS" . 2>/dev/null
}

step "hardware"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv || echo "no nvidia-smi"
nvcc --version 2>/dev/null | tail -1 || echo "no nvcc"
"$PYTHON" --version
# the extension is compiled here: this Python's headers must be installed
"$PYTHON" -c "import os, sysconfig; d = sysconfig.get_paths()['include']; print('Python.h:', os.path.join(d, 'Python.h'), 'present' if os.path.exists(os.path.join(d, 'Python.h')) else 'MISSING')"
echo "cores: $(nproc)"

step "prebuilt llama.cpp ($PREBUILT_NAME) from $CARRY_DIR and /tmp/specnative-carry"
CHUNKS="$WORKDIR/chunks"  # links to every chunk that arrived, wherever it arrived
mkdir -p "$CHUNKS"
for f in "$CARRY_DIR"/* /tmp/specnative-carry/*; do
  [ -f "$f" ] && ln -sf "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" "$CHUNKS/"
done
if ! (cd "$CHUNKS" && sha256sum -c --quiet "$PREBUILT_NAME-prebuilt.sha256"); then
  ls -la "$CHUNKS"; echo "PREBUILT CHUNKS MISSING OR DAMAGED"; exit 1
fi
cat "$CHUNKS"/$PREBUILT_NAME-prebuilt.tar.xz.part* | xz -d | tar -C "$WORKDIR" -xf -
PREBUILT="$WORKDIR/$PREBUILT_NAME-prebuilt"
cat "$PREBUILT/specnative-llama-build.cmake"
# The CUDA runtime and cuBLAS of this Python's nvidia packages, for the peer tools (the wheel's
# own libraries also look in site-packages/nvidia/cu13/lib); the driver comes from the system.
NV_LIB=$("$PYTHON" -c "import nvidia, os; print(next((os.path.join(p, 'cu13', 'lib') for p in nvidia.__path__ if os.path.isdir(os.path.join(p, 'cu13', 'lib'))), ''))" 2>/dev/null)
echo "nvidia libraries: ${NV_LIB:-none}"
DRIVER_LIB=/usr/local/nvidia/lib64  # where NVIDIA's container runtime mounts the driver
[ -d "$DRIVER_LIB" ] || DRIVER_LIB=""
export LD_LIBRARY_PATH="$PREBUILT/lib${NV_LIB:+:$NV_LIB}${DRIVER_LIB:+:$DRIVER_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -f "$PREBUILT/lib/libggml-cuda.so" ]; then
  ldd "$PREBUILT/lib/libggml-cuda.so" | grep -E "cuda|cublas|not found"
fi

step "Python packages carried as wheels"
if ls "$CARRY_DIR"/wheels/*.whl >/dev/null 2>&1; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$WORKDIR/site" "$CARRY_DIR"/wheels/*.whl
fi
export PYTHONPATH="$WORKDIR/site${PYTHONPATH:+:$PYTHONPATH}"

step "build the extension only (SPECNATIVE_PREBUILT_LLAMA, limit ${T_BUILD}s)"
export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
if ! timeout "$T_BUILD" "$PYTHON" -m pip install --no-build-isolation --no-deps --no-compile -v \
     --target "$WORKDIR/site" -C build-dir="$WORKDIR/ext-build" \
     -C cmake.define.SPECNATIVE_PREBUILT_LLAMA="$PREBUILT" . > "$OUT_DIR/build.log" 2>&1; then
  tail -40 "$OUT_DIR/build.log"; echo "BUILD FAILED"; pack; exit 1
fi
grep -E "specnative: prebuilt" "$OUT_DIR/build.log" | head -2
(cd "$WORKDIR" && "$PYTHON" -c "import specnative; print(specnative.__file__); print(specnative.build_info())")

step "test suite, all layers on the GPU (limit ${T_TESTS}s)"
SPECNATIVE_TEST_NGL=-1 timeout "$T_TESTS" "$PYTHON" -m pytest -q --maxfail=10 --durations=5 -p no:cacheprovider \
  > "$OUT_DIR/pytest.log" 2>&1
echo "pytest exit $?"; tail -15 "$OUT_DIR/pytest.log"

# The projection's first test on a real GPU: the committed CPU run's acceptance by position, priced by
# the cost model for the device nvidia-smi names, written before anything is measured here.
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
HW=${PROJECT_HARDWARE:-gpu:$GPU_NAME}
step "projection before measuring: bench/results/tiny-default-sweep on $HW [projected]"
"$PYTHON" -m specnative models fetch tiny > /dev/null
"$PYTHON" -m specnative project bench/results/tiny-default-sweep --hardware "$HW" -o "$RESULTS/projected-before" \
  | head -30 || echo "project exit $? (name a device with PROJECT_HARDWARE=h100-sxm; specnative project --list-hardware)"
pack

step "short sweep: tiny preset, ctx 0/8192, concurrency 1/8, prefix cache on/off, -ngl -1 -fa $FA (limit ${T_SWEEP}s)"
# both quantizations x spec x prefix cache: the factorial ("Do the levers add?"), tidy.csv, the database
timeout "$T_SWEEP" "$PYTHON" -m specnative.sweep --preset tiny --ctx-len 0,8192 -np 1,8 --prefix-cache on,off \
  -ngl -1 -fa "$FA" -r 3 --max-repeats 5 -o "$RESULTS/sweep-tiny" | tail -25
sed -n '/^## Do the levers add/,/^## Read first/p' "$RESULTS/sweep-tiny/summary.md" | head -30
pack

step "projection against measurement: the GPU run just measured, projected to the same device [projected]"
# projection.csv holds the projected step_ms, c and speedup beside measured_*_here from this GPU run
"$PYTHON" -m specnative project "$RESULTS/sweep-tiny" --hardware "$HW" -o "$RESULTS/projected-vs-measured" | head -30 \
  || echo "project exit $?"
pack

step "synthetic acceptance: the break-even alpha per regime on the GPU, tiny preset (limit ${T_CELL}s)"
timeout "$T_CELL" "$PYTHON" -m specnative.sweep --preset tiny --ctx-len 0 -np 1,8 -ngl -1 -fa "$FA" --drafter model \
  --synthetic-acceptance 0.3,0.5,0.7,0.9 -r 3 --max-repeats 3 -o "$RESULTS/sweep-synthetic" | tail -12
sed -n '/^## Which alpha would pay/,/^## [A-Z]/p' "$RESULTS/sweep-synthetic/summary.md" | head -30
pack

step "trees or chains: draft trees beside chains at equal verify budget, tiny preset, -ngl -1 (limit ${T_CELL}s)"
timeout "$T_CELL" "$PYTHON" -m specnative.sweep --preset tiny --ctx-len 0 -np 1,4 -ngl -1 -fa "$FA" -k 8 \
  --draft-shape chain,tree:topk=4,depth=5,budget=8,tree:branches=4,p_split=0.1,budget=8 -r 3 --max-repeats 3 \
  -o "$RESULTS/sweep-trees" | tail -12
sed -n '/^## Trees or chains/,/^## [A-Z]/p' "$RESULTS/sweep-trees/summary.md" | head -30
pack

step "EAGLE-3 head trees beside llama.cpp's EAGLE-3 chain, then served under load: tiny files, -ngl -1 (limit ${T_CELL}s each)"
read -r E3_T E3_H < <("$PYTHON" -c "from specnative.models.tiny_drafters import drafter_pair; print(*drafter_pair('$WORKDIR/hidden', 'eagle3', acceptance='mid'))")
timeout "$T_CELL" "$PYTHON" -m specnative.sweep -m "$E3_T" --drafter eagle3 --drafter-file "eagle3=$E3_H" --ctx-len 0 \
  -np 1,4 -ngl -1 -fa "$FA" -k 8 --draft-shape chain,tree:topk=4,depth=5,budget=8 -r 3 --max-repeats 3 \
  -o "$RESULTS/sweep-trees-eagle3" | tail -6
timeout "$T_CELL" "$PYTHON" -m specnative serve -m "$E3_T" --drafter eagle3 --drafter-file "eagle3=$E3_H" \
  --draft-shape tree:topk=4,depth=5,budget=8 --request-rate inf --max-concurrency 4 --num-requests 8 -n 16 -r 1 \
  -ngl -1 -fa "$FA" -o "$RESULTS/serve-trees-eagle3" | tail -6
pack

step "results database and compare: the run against itself (no decided change expected), runs listed"
"$PYTHON" -m specnative runs --db "$RESULTS/specnative.sqlite" | head -5
"$PYTHON" -m specnative compare "$RESULTS/sweep-tiny" "$RESULTS/sweep-tiny" --fail-on-regression 10 --fail-on-slowdown 10 | head -30
echo "compare exit $?"

step "DFlash cell: tiny forced-high target + tiny DFlash2 draft (llama.cpp's draft-dflash), -ngl -1 (limit ${T_SWEEP}s)"
read -r TINY_T TINY_D < <("$PYTHON" -c "from specnative.models.tiny_drafters import drafter_pair; print(*drafter_pair('$WORKDIR/hidden', 'dflash2'))")
timeout "$T_SWEEP" "$PYTHON" -m specnative.sweep -m "$TINY_T" -md "$TINY_D" --drafter dflash --ctx-len 0 -np 1,4 \
  -ngl -1 -fa "$FA" -r 3 --max-repeats 5 -o "$RESULTS/sweep-dflash" | tail -12
pack
step "serving under load with a hidden-state drafter (tiny DFlash2, continuous batching), -ngl -1 (limit ${T_SWEEP}s)"
timeout "$T_SWEEP" "$PYTHON" -m specnative serve -m "$TINY_T" -md "$TINY_D" --drafter dflash --request-rate 8,inf \
  --max-concurrency 4 --num-requests 8 -n 16 -r 2 -ngl -1 -fa "$FA" -o "$RESULTS/serve-dflash" | tail -12
pack
GEMMA_GGUF=""
if [ -f "$CHUNKS/gemma.sha256" ]; then
  cat "$CHUNKS"/gemma-Q4_K_M.gguf.part* > "$WORKDIR/gemma-Q4_K_M.gguf"
  if (cd "$WORKDIR" && sha256sum -c --quiet "$CHUNKS/gemma.sha256"); then
    GEMMA_GGUF="$WORKDIR/gemma-Q4_K_M.gguf"
  else
    echo "gemma chunks missing or damaged: no gemma rows"
  fi
fi
if [ -n "$GEMMA_GGUF" ]; then
  step "short sweep: gemma3-270m Q8_0 and Q4_K_M targets, Q4_K_M draft (limit ${T_SWEEP}s)"
  "$PYTHON" -c "from specnative.engine import quantize; quantize('$GEMMA_GGUF', '$WORKDIR/gemma-Q8_0.gguf', 'Q8_0')"
  timeout "$T_SWEEP" "$PYTHON" -m specnative.sweep -m "$GEMMA_GGUF" -m "$WORKDIR/gemma-Q8_0.gguf" -md "$GEMMA_GGUF" \
    --ctx-len 0,8192 -np 1,4,8 -ngl -1 -fa "$FA" -r 3 --max-repeats 5 -n 64 -o "$RESULTS/sweep-gemma" | tail -25
  pack
fi

step "timers cover the wall time: (prefill + draft + draft_ingest + verify + resample + decode) / total, every row"
"$PYTHON" - "$RESULTS" <<'PY'
import glob, sys
from specnative.record.schema import read_traces
parts = ["prefill_target_ms", "prefill_draft_ms", "draft_ms", "draft_ingest_ms", "verify_ms", "resample_ms",
         "decode_ms"]
for path in sorted(glob.glob(f"{sys.argv[1]}/sweep-*/traces.csv")):  # closed-loop runs
    t = read_traces(path)
    cover = t[parts].astype(float).fillna(0).sum(axis=1) / t["total_ms"].astype(float)
    for _, row in t.assign(cover=cover).iterrows():
        print(f"  {row['spec_decode']:>3} np={row['concurrency']} ctx={row['ctx_len']:>5} "
              f"q{row['quant_bits']}: {row['cover']:.4f}")
    print(f"{path}: min {cover.min():.4f} over {len(t)} rows", "OK" if cover.min() >= 0.99 else "BELOW 0.99")
PY

step "peers side by side: llama-bench, llama-speculative-simple, -ngl 99 (limit ${T_PEERS}s)"
timeout "$T_PEERS" "$PYTHON" bench/peers.py --models tiny --gpu-layers 99 --flash-attn "$FA" \
  --tools-dir "$PREBUILT/bin" --max-wait 20 --out "$RESULTS/peers-closed-loop" ${PEERS_ARGS:-} || echo "peers exit $?"
cat "$RESULTS"/peers-closed-loop/*.md 2>/dev/null | head -60
if [ -x "$PREBUILT/bin/llama-speculative-simple" ]; then
  step "hidden-state drafters beside llama-speculative-simple --spec-type draft-*, tiny files (limit 30s)"
  timeout 30 "$PYTHON" bench/peerkit/hidden_peer.py --build "$PREBUILT" -t "$(nproc)" \
    --out "$RESULTS/hidden-state-drafters/peer.json" || echo "hidden peer exit $?"
fi

step "the CUDA model's first test: llama-bench pp1..16 and tg128 here beside project --bench for $HW [projected]"
# the forward-time curve against rows (where the kernels switch) measured by the vendored llama-bench,
# and what the kernel-aware projection says for the same model and device, with the error per test
read -r TINY_Q4 _ TINY_DRAFT < <("$PYTHON" -m specnative models fetch tiny | awk '{print $2}' | tr '\n' ' ')
if [ -x "$PREBUILT/bin/llama-bench" ]; then
  timeout "$T_PEERS" "$PREBUILT/bin/llama-bench" -m "$TINY_Q4" -p 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 -n 0 \
    -ngl 99 -fa "$([ "$FA" = on ] && echo 1 || echo 0)" -r 3 -o csv > "$RESULTS/llama-bench-curve.csv" || echo "llama-bench exit $?"
  timeout "$T_PEERS" "$PREBUILT/bin/llama-bench" -m "$TINY_Q4" -p 0 -n 128 -ngl 99 -r 3 -o csv \
    > "$RESULTS/llama-bench-tg.csv" || echo "llama-bench exit $?"
fi
"$PYTHON" -m specnative project --bench pp1-16,tg128 --model "$TINY_Q4" --hardware "$HW" --flash-attn "$FA" \
  --output csv > "$RESULTS/project-bench.csv" || echo "project --bench exit $?"
"$PYTHON" - "$RESULTS" <<'PY'
import csv, sys
from pathlib import Path
res = Path(sys.argv[1])
measured = {}
for name in ("llama-bench-curve.csv", "llama-bench-tg.csv"):
    path = res / name
    for row in csv.DictReader(path.open()) if path.is_file() and path.stat().st_size else []:
        test = f"pp{row['n_prompt']}" if int(row["n_prompt"]) else f"tg{row['n_gen']}"
        measured[test] = float(row["avg_ts"])
projected = list(csv.DictReader((res / "project-bench.csv").open())) if (res / "project-bench.csv").is_file() else []
for row in projected:
    here = measured.get(row["test"])
    error = f"{float(row['avg_ts']) / here - 1:+.1%}" if here else "n/a"
    print(f"  {row['test']:>6} {row['kernel']:>8} projected {float(row['avg_ts']):10.1f} t/s  measured "
          f"{here if here else float('nan'):10.1f} t/s  error {error}")
PY
pack

step "specnative bench (llama-bench's shape with speculation) and serve results in vllm bench serve's names, -ngl 99"
timeout "$T_CELL" "$PYTHON" -m specnative bench -m "$TINY_Q4" -md "$TINY_DRAFT" -p 0 -n 64 --spec-draft-n-max 4,8 \
  -ngl 99 -fa "$([ "$FA" = on ] && echo 1 || echo 0)" -r 3 -o md | tee "$RESULTS/bench-verb.md" | tail -8 \
  || echo "bench exit $?"
timeout "$T_CELL" "$PYTHON" -m specnative serve --preset tiny --request-rate 8,inf --max-concurrency 4 --num-requests 8 \
  -n 16 -r 1 -ngl -1 -fa "$FA" --save-result -o "$RESULTS/serve-vllm-names" | tail -4 || echo "serve exit $?"
head -c 1500 "$RESULTS/serve-vllm-names/vllm_results.jsonl" 2>/dev/null; echo
pack

step "spec policies on the GPU: serve with adaptive and by-batch beside static (the verify cost curve by rows, where the kernels switch), -ngl -1"
for POLICY in static adaptive "by-batch:[[1,2,8],[3,8,2]]"; do
  timeout "$T_CELL" "$PYTHON" -m specnative serve --preset tiny -k 8 --spec-policy "$POLICY" --request-rate 8,inf \
    --max-concurrency 4 --num-requests 8 -n 24 -r 1 -ngl -1 -fa "$FA" -o "$RESULTS/serve-policy-${POLICY%%:*}" \
    | tail -3 || echo "serve --spec-policy $POLICY exit $?"
done
pack

step "pack results"
pack
ls -la "$OUT_DIR"
echo "done in $(( $(date +%s) - t0 ))s; results in $OUT_DIR"
