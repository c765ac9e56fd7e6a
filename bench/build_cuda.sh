#!/usr/bin/env bash
# Developer script (not run by CI): compile llama.cpp's CUDA backend for one GPU architecture on a
# machine with nvcc but without cuBLAS or a GPU, and pack the Python-independent part (libllama,
# libggml*, llama-bench, llama-speculative-simple, headers) for a GPU machine without network,
# where only the small extension is then built (SPECNATIVE_PREBUILT_LLAMA, see bench/gpu_check.sh).
#
#   bash bench/build_cuda.sh               # CUDA_ARCH=90 (H100/H200), JOBS=2
#   BACKEND=cpu bash bench/build_cuda.sh   # the same package without CUDA: dry run of gpu_check.sh
#
# cuBLAS comes from the `nvidia-cublas` package, installed into bench/scratch/cuda-deps (not
# system-wide); the driver library is not needed to link (cmake/cuda_pip_libraries.cmake).
# Outputs (NAME = cuda or cpu), all under the git-ignored bench/scratch/ and .carry/:
#   bench/scratch/NAME-build/        the CMake build (separate from the editable install's build/)
#   bench/scratch/NAME-prebuilt/     lib/ include/ bin/ llama.cpp/ (common sources) specnative-llama-build.cmake
#   .carry/NAME-prebuilt.tar.xz.partNN   the same, compressed, split to travel (bench/gpu_check.sh)
#   bench/scratch/NAME-build-summary.md     wall time, compile time by kernel family, sizes
#                                           (a kept copy: bench/results/cuda-build/build-summary.md)
# Env: CUDA_ARCH (90), JOBS (2), NICE (19), CUBLAS_VERSION (13.1.0.3, CUDA 13.0 update 2),
#      EXTRA_CMAKE_ARGS (e.g. "-DGGML_CUDA_FA=OFF" to measure an option), PART_MIB (40).
set -euo pipefail
cd "$(dirname "$0")/.."
BACKEND=${BACKEND:-cuda}
CUDA_ARCH=${CUDA_ARCH:-90}
JOBS=${JOBS:-2}
NICE=${NICE:-19}
CUBLAS_VERSION=${CUBLAS_VERSION:-13.1.0.3}
PART_MIB=${PART_MIB:-40}
WORK=bench/scratch
BUILD=$WORK/$BACKEND-build
PREBUILT=$WORK/$BACKEND-prebuilt
DEPS=$WORK/cuda-deps
# The CPU backend portable (x86-64-v3: AVX2/FMA/F16C/BMI2) because it runs on another machine's CPU.
OPTIONS=(-DSPECNATIVE_CPU_AUTO=OFF -DGGML_NATIVE=OFF)
if [ "$BACKEND" = cuda ]; then
  # The options that keep the compile reasonable; bench/results/cuda-build/README.md says what
  # each costs at run time. FA kernels for f16 K/V only (the KV cache type the engine uses);
  # CUDA graphs on (llama.cpp's default, no compile cost); no NCCL (one GPU).
  OPTIONS+=(-DSPECNATIVE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH"
    -DGGML_CUDA_FA=ON -DGGML_CUDA_FA_QUANTS=f16-f16 -DGGML_CUDA_GRAPHS=ON -DGGML_CUDA_NCCL=OFF
    -DSPECNATIVE_CUBLAS_ROOT="$PWD/$DEPS/nvidia/cu13")
  echo "== cuBLAS $CUBLAS_VERSION from the package registry into $DEPS (not system-wide)"
  if [ ! -f "$DEPS/nvidia/cu13/include/cublas_v2.h" ]; then
    python3 -m pip install --quiet --no-deps --target "$DEPS" "nvidia-cublas==$CUBLAS_VERSION"
  fi
else
  OPTIONS+=(-DSPECNATIVE_CUDA=OFF)
fi

echo "== configure $BUILD"
python3 vendor/fetch_llama_cpp.py >/dev/null
t_start=$(date +%s)
# RPATH: the packed libraries and tools find each other ($ORIGIN, $ORIGIN/../lib) and, once in a
# wheel in site-packages/specnative, pip's cuBLAS and CUDA runtime ($ORIGIN/../nvidia/cu13/lib).
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DSPECNATIVE_PEER_TOOLS=ON -DGGML_CCACHE=OFF \
  -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" \
  -DCMAKE_BUILD_RPATH='$ORIGIN;$ORIGIN/../lib;$ORIGIN/../nvidia/cu13/lib' \
  "${OPTIONS[@]}" ${EXTRA_CMAKE_ARGS:-} > "$WORK/$BACKEND-configure.log"
grep -E "specnative:|CUDA Toolkit found|Using CMAKE_CUDA_ARCH|FlashAttention" "$WORK/$BACKEND-configure.log" || true
if [ "$BACKEND" = cuda ] && ! grep -q "specnative: CUDA backend on" "$WORK/$BACKEND-configure.log"; then
  echo "CUDA backend not enabled, see $WORK/$BACKEND-configure.log"; exit 1
fi

echo "== build (nice $NICE, $JOBS jobs): libllama, libggml*, llama-bench, llama-speculative-simple"
t_build=$(date +%s)
nice -n "$NICE" cmake --build "$BUILD" -j "$JOBS" \
  --target llama ggml llama-bench llama-speculative-simple
t_end=$(date +%s)

echo "== pack $PREBUILT"
rm -rf "$PREBUILT" && mkdir -p "$PREBUILT"/{lib,include,bin}
cp -a "$BUILD"/bin/lib*.so* "$PREBUILT/lib/"
cp -a "$BUILD"/bin/llama-bench "$BUILD"/bin/llama-speculative-simple "$PREBUILT/bin/"
cp -a vendor/llama.cpp/include/*.h vendor/llama.cpp/ggml/include/*.h "$PREBUILT/include/"
# The part of the source tree the extension itself compiles (llama.cpp's n-gram drafters,
# cmake/llama_drafters.cmake): common/, src/ headers, nlohmann json. The GPU machine has no tree.
mkdir -p "$PREBUILT/llama.cpp/src" "$PREBUILT/llama.cpp/vendor"
cp -a vendor/llama.cpp/common "$PREBUILT/llama.cpp/"
cp -a vendor/llama.cpp/src/*.h "$PREBUILT/llama.cpp/src/"
cp -a vendor/llama.cpp/vendor/nlohmann "$PREBUILT/llama.cpp/vendor/"
cp "$BUILD/specnative-llama-build.cmake" "$PREBUILT/"
mkdir -p .carry
rm -f .carry/$BACKEND-prebuilt.tar.xz.part* .carry/$BACKEND-prebuilt.sha256
tar -C "$WORK" -cf - "$BACKEND-prebuilt" | xz -T"$JOBS" -6 \
  | split -b "${PART_MIB}M" -d - ".carry/$BACKEND-prebuilt.tar.xz.part"
( cd .carry && sha256sum $BACKEND-prebuilt.tar.xz.part* > $BACKEND-prebuilt.sha256 )

python3 bench/cuda_build_summary.py --build "$BUILD" --prebuilt "$PREBUILT" --carry .carry \
  --name "$BACKEND-prebuilt" \
  --wall-configure $((t_build - t_start)) --wall-build $((t_end - t_build)) --jobs "$JOBS" \
  --options "${OPTIONS[*]} ${EXTRA_CMAKE_ARGS:-}" | tee "$WORK/$BACKEND-build-summary.md"
