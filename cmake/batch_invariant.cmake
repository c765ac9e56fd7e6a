# SPECNATIVE_BATCH_INVARIANT=ON: a CPU build in which the target's logits for a position do not
# depend on the batch shape it was computed in (a 1-token baseline step, a k+1-token verify batch,
# a prefill batch, 1 or N sequences per step). The default build is faster, but its logits differ
# between those shapes by up to ~1.7 (Gemma 3 270M Q4_K_M), which turns greedy near-ties into
# mismatches that a lossless check cannot tell from a bug. Measured per quantization type, with
# the cost: bench/results/batch-invariance-cpu.md.
#
# What it turns off, and why (each one picks its kernel by the number of rows in the batch):
#   GGML_LLAMAFILE=OFF   llamafile's sgemm tiles (Q8_0, Q4_0, F16, F32 ... products)
#   GGML_CPU_REPACK=OFF  weights repacked into interleaved rows (Q4_0, Q4_K, Q6_K ... on AVX2):
#                        1 row takes a gemv kernel, more rows a gemm kernel
#   GGML_CPU_TILED_MM=0  ggml's tiled K-quant product for >= 8 rows. It has no build switch, only
#                        this environment variable, read once at the first matrix product; the
#                        extension sets it when it is loaded (csrc/core/batch_invariant.cpp).
# Two run-time settings complete it: flash_attn off (ggml's CPU flash attention has tiled and
# split-KV paths chosen by the batch) and, with several sequences, kv_unified=False: in a shared KV
# stream the other sequences' (masked) cells sit between a sequence's own, which regroups the sums
# of the V x softmax product (residual up to ~2e-3 on F16, 1e-4 on F32; 0 with one stream each).
# GPU backends are not covered: CUDA changes kernels with the batch size (e.g. at 8 rows).
option(SPECNATIVE_BATCH_INVARIANT "CPU kernels whose results do not depend on the batch shape" OFF)

if(SPECNATIVE_BATCH_INVARIANT)
  set(GGML_LLAMAFILE OFF CACHE BOOL "" FORCE)
  set(GGML_CPU_REPACK OFF CACHE BOOL "" FORCE)
  set(_SPECNATIVE_BATCH_INVARIANT_APPLIED ON CACHE INTERNAL "")
  string(APPEND SPECNATIVE_BUILD_FLAGS
         "SPECNATIVE_BATCH_INVARIANT=ON GGML_LLAMAFILE=OFF GGML_CPU_REPACK=OFF GGML_CPU_TILED_MM=0 ")
  message(STATUS "specnative: batch-invariant CPU build (no llamafile, no repack, no tiled K-quant matmul)")
elseif(_SPECNATIVE_BATCH_INVARIANT_APPLIED)
  # Turned off again in the same build dir: drop what we forced, so ggml's defaults come back.
  unset(GGML_LLAMAFILE CACHE)
  unset(GGML_CPU_REPACK CACHE)
  unset(_SPECNATIVE_BATCH_INVARIANT_APPLIED CACHE)
endif()

