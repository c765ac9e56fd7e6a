#!/usr/bin/env bash
# Fills .carry/ (git-ignored) with what bench/gpu_check.sh needs on a GPU machine without network,
# and sizes each device call to the 64 MiB of files that may travel with it.
#
#   bash bench/prepare_device_carry.sh            # the CUDA libraries of bench/build_cuda.sh
#   bash bench/prepare_device_carry.sh --gemma    # also Gemma 3 270M Q4_K_M (241 MiB: ~5 staging calls)
#   bash bench/prepare_device_carry.sh --dry-run  # CPU libraries; runs bench/gpu_check.sh here,
#                                                 # in a clean venv, into bench/scratch/gpu-check-dry
# Layout and the device calls it prints:
#   .carry/main/     the main call: carry [".carry/main"], `bash bench/gpu_check.sh`, timeout_s 540
#   .carry/stage-N/  what does not fit the main call, one call each BEFORE it, on the same warm
#                    machine (it is given back after ~30 s idle): carry [".carry/stage-N"],
#                    `mkdir -p /tmp/specnative-carry && cp .carry/stage-N/* /tmp/specnative-carry/`
# Everything is cut into 8 MiB chunks and listed in a .sha256 file that gpu_check.sh verifies.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=cuda GEMMA=0
for arg in "$@"; do
  case "$arg" in
    --gemma) GEMMA=1 ;;
    --dry-run) MODE=cpu ;;
    *) echo "usage: $0 [--gemma] [--dry-run]" >&2; exit 2 ;;
  esac
done
LIMIT_MIB=${LIMIT_MIB:-64}
MARGIN_MIB=${MARGIN_MIB:-2}
CHUNK=8M
CARRY=.carry
[ "$MODE" = cpu ] && CARRY=.carry/dry

# 1. The prebuilt llama.cpp: made by bench/build_cuda.sh (BACKEND=cpu for the dry run).
if ! ls .carry/$MODE-prebuilt.tar.xz.part* >/dev/null 2>&1; then
  echo "== no .carry/$MODE-prebuilt.*: building it (bench/build_cuda.sh)"
  BACKEND=$MODE bash bench/build_cuda.sh
fi
rm -rf "$CARRY/main" "$CARRY"/stage-*
mkdir -p "$CARRY/main/wheels" "$CARRY/chunks"
cat .carry/$MODE-prebuilt.tar.xz.part* | split -b $CHUNK -d -a 3 - "$CARRY/chunks/$MODE-prebuilt.tar.xz.part"
(cd "$CARRY/chunks" && sha256sum $MODE-prebuilt.tar.xz.part* > ../main/$MODE-prebuilt.sha256)

# 2. Pure-Python dependencies the GPU image lacks (it has numpy, pandas, matplotlib, scipy,
#    pybind11, scikit-build-core, pytest, pyyaml, tqdm).
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$CARRY/main/wheels" "gguf==0.19.0"

# 3. Optional: the Gemma model, chunked, checked against the whole file's sha256 on arrival.
if [ "$GEMMA" = 1 ]; then
  gguf=$(python3 -c "from specnative.models.presets import gemma_files; print(gemma_files()['Q4_K_M'])")
  split -b $CHUNK -d -a 3 "$gguf" "$CARRY/chunks/gemma-Q4_K_M.gguf.part"
  (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") | sed 's/ .*/  gemma-Q4_K_M.gguf/' \
    > "$CARRY/main/gemma.sha256"
fi

# 4. Fill the main call up to the limit, then stage folders of up to LIMIT-MARGIN MiB each.
tree_bytes=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
main_bytes=$(du -sb "$CARRY/main" | cut -f1)
limit=$(( (LIMIT_MIB - MARGIN_MIB) * 1048576 ))
budget=$(( limit - tree_bytes - main_bytes ))
stage=0 stage_budget=0
for chunk in $(ls "$CARRY/chunks" | grep prebuilt) $(ls "$CARRY/chunks" | grep -v prebuilt); do
  size=$(stat -c %s "$CARRY/chunks/$chunk")
  if [ "$size" -le "$budget" ]; then
    mv "$CARRY/chunks/$chunk" "$CARRY/main/"; budget=$((budget - size)); continue
  fi
  if [ "$size" -gt "$stage_budget" ]; then
    stage=$((stage + 1)); mkdir -p "$CARRY/stage-$stage"; stage_budget=$((limit - tree_bytes))
  fi
  mv "$CARRY/chunks/$chunk" "$CARRY/stage-$stage/"; stage_budget=$((stage_budget - size))
done
rmdir "$CARRY/chunks"

echo "== what travels (the working tree is $((tree_bytes / 1048576)) MiB in every call)"
du -sh "$CARRY/main" "$CARRY"/stage-* 2>/dev/null || true
if [ "$MODE" = cpu ]; then
  echo "== dry run of bench/gpu_check.sh here (CPU libraries, clean venv)"
  venv=bench/scratch/dry-venv
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q numpy pandas matplotlib scipy pytest pyyaml tqdm scikit-build-core pybind11
  fi
  mkdir -p /tmp/specnative-carry
  for dir in "$CARRY"/stage-*; do [ -d "$dir" ] && cp "$dir"/* /tmp/specnative-carry/; done
  CARRY_DIR="$CARRY/main" PREBUILT_NAME=cpu PYTHON="$venv/bin/python" \
    WORKDIR=bench/scratch/gpu-check-dry-tmp bash bench/gpu_check.sh bench/scratch/gpu-check-dry
  exit
fi
echo "== device calls, in this order, back to back:"
for dir in "$CARRY"/stage-*; do
  [ -d "$dir" ] && echo "  carry [\"$dir\"]: mkdir -p /tmp/specnative-carry && cp $dir/* /tmp/specnative-carry/"
done
echo "  carry [\"$CARRY/main\"]: bash bench/gpu_check.sh    (timeout_s 540)"
