"""llama.cpp's CUDA backend, per matrix product: which kernel family it runs for a weight type, a
number of activation rows (ne11) and a GPU's compute capability, and what that kernel costs.

Kernel selection follows the vendored ggml-cuda (vendor/llama.cpp/ggml/src/ggml-cuda), encoded here
as tables, not copied:

- `ggml_cuda_mul_mat` (ggml-cuda.cu) tries, in order: MMVF (float weights, few rows), MMF (float
  weights on tensor cores, at most 16 rows), MMVQ (quantized, few rows), MMQ (quantized), and
  cuBLAS for everything else (a quantized matrix is then converted to F16 first);
- MMVF's row limits by type and architecture: `ggml_cuda_should_use_mmvf` (mmvf.cu);
- MMF's: `ggml_cuda_should_use_mmf` (mmf.cu): float weights, at most 16 rows, F16 from Volta on,
  F32 and BF16 from Ampere on;
- MMVQ's: `ggml_cuda_should_use_mmvq` (mmvq.cu): MMVQ_MAX_BATCH_SIZE (8) rows by default, fewer for
  some k-quants on Volta, Ada, Orin, Blackwell (sm_120) and the DGX Spark (sm_121); the
  architectures are matched exactly (an sm_100 B200 takes the default);
- MMQ's: `ggml_cuda_should_use_mmq` (mmq.cu): the types it has tiles for; always from Turing on;
  on Volta below MMQ_DP4A_MAX_BATCH_SIZE (64) rows; on Pascal with dp4a (sm_61) always, without
  it (sm_60) never. Its column tile J is the multiple of 8 up to 128 that needs the fewest tiles
  (`mul_mat_q_switch_J`, mmq.cuh).

Costs (seconds, one group of weights of one type: its bytes B and elements E, r rows):
    MMVQ          B / bw  +  r x E x column_ops(class) / vector rate   (the weights stream once; every
                  column, the first too, redoes the dequantisation and dot products on the CUDA cores)
    MMVF          B / bw  +  (r - 1) x E x column_ops(float) / vector rate   (nothing to dequantise)
    MMQ           max(B / (bw x mmq_bw_efficiency), 2 E x tile(r) / (tensor rate x compute_efficiency))
    MMF           max(B / bw, 2 E x tile(r) / (F16 tensor rate x compute_efficiency))
    cuBLAS        quantized: B + 4 E bytes (converted to F16, written and read) / bw
                  +  2 E x r / (F16 tensor rate x compute_efficiency); float: max of the two
tile(r) is r rounded up to the kernel's column tile: the padding of a partly filled tile is paid.

Kernel sets: "vendored" (the selection above) and "early-2024", llama.cpp's CUDA backend before
MMQ used int8 tensor cores and became the default for large batches (pull request #8075, June
2024; builds such as the one behind pull request #5625's A100 curve, March 2024). There, on a GPU
with FP16 tensor cores, a quantized product of at most MMVQ_MAX_BATCH rows ran MMVQ, one of up to
MMQ_MAX_BATCH_EARLY (32) rows the MMQ of that time, on dp4a (four int8 products per CUDA-core
lane and cycle, no tensor cores), and a larger one cuBLAS after conversion to F16; a float matrix
ran the dequantise-and-dot kernel at one row and cuBLAS above it. The MMQ of that time is priced
as today's MMQ (same tile rule, same efficiencies) at the dp4a rate, four times the CUDA cores'
rate: nothing of that curve is fitted.
    MMQ (dp4a)    max(B / (bw x mmq_bw_efficiency), 2 E x tile(r) / (4 x vector rate x compute_efficiency))
"""
from __future__ import annotations

import math

MMVQ_MAX_BATCH = 8          # mmvq.cuh MMVQ_MAX_BATCH_SIZE (mmvf.cuh MMVF_MAX_BATCH_SIZE likewise)
MMF_MAX_BATCH = 16          # mmf.cu: float tensor-core kernel for at most 16 columns
MMQ_DP4A_MAX_BATCH = 64     # mmq.cuh MMQ_DP4A_MAX_BATCH_SIZE: Volta's dp4a MMQ below this many rows
MMQ_TILE_STEP, MMQ_TILE_MAX = 8, 128   # mmq.cuh mul_mat_q_switch_J: J = 8, 16, ..., 128
KERNELS = ("mmvq", "mmq", "mmvf", "mmf", "cublas", "mmq-dp4a")
KERNEL_SETS = ("vendored", "early-2024")
MMQ_MAX_BATCH_EARLY = 32    # early-2024 ggml-cuda.cu MMQ_MAX_BATCH_SIZE: cuBLAS above it on tensor-core GPUs
DP4A_PER_LANE = 4           # int8 products per dp4a, against one FP32 product per lane and cycle
DEFAULT_CC = 800            # a CUDA device that names no compute capability is priced as an Ampere

# Compute capability (ggml's 100 x major + 10 x minor) of the architectures the selection names.
PASCAL, DP4A, VOLTA, TURING, AMPERE, ORIN, ADA, HOPPER, BLACKWELL_DC, BLACKWELL, DGX_SPARK = (
    600, 610, 700, 750, 800, 870, 890, 900, 1000, 1200, 1210)

# ggml_cuda_should_use_mmvq (mmvq.cu): per exact compute capability, the largest ne11 for which a
# quantized type still runs MMVQ where it differs from MMVQ_MAX_BATCH.
MMVQ_MAX_ROWS = {
    ADA: {"Q2_K": 4, "Q3_K": 6},                                             # tuned on RTX 4090
    BLACKWELL: {"Q2_K": 5, "Q3_K": 5, "Q4_K": 5, "Q5_K": 6, "Q6_K": 7},     # tuned on RTX 5090
    DGX_SPARK: {"Q2_K": 6},                                                  # tuned on DGX Spark GB10
    ORIN: {"Q2_K": 1, "Q3_K": 1, "Q4_K": 1, "Q5_K": 1, "Q6_K": 1},          # Jetson Orin
    VOLTA: {"Q2_K": 4, "Q3_K": 6, "Q4_K": 5, "Q5_K": 6, "Q6_K": 7},
}

# ggml_cuda_should_use_mmq (mmq.cu): the quantized types MMQ has tiles for; others go to cuBLAS.
MMQ_TYPES = frozenset({"Q1_0", "Q2_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                       "Q6_K", "IQ1_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS", "IQ4_NL",
                       "MXFP4", "NVFP4"})
FLOAT_TYPES = ("F32", "F16", "BF16")


def cc_of(compute_capability) -> int:
    """ggml's integer compute capability from a spec-sheet one (8.9 -> 890); 0 or None: the default."""
    if not compute_capability:
        return DEFAULT_CC
    value = float(compute_capability)
    return round(value * 100) if value < 100 else int(value)


def _mmvf_max_rows(type_name: str, cc: int) -> int:
    """ggml_cuda_should_use_mmvf (mmvf.cu) for a 2-D weight matrix on NVIDIA: the largest ne11 it
    takes MMVF for (0: never)."""
    if type_name == "F32":
        return 3 if cc >= AMPERE else (4 if cc >= TURING else 3)
    if type_name == "F16":
        # Ampere and later (Ada included: the Ampere branch is tested first): one row
        return 1 if cc >= AMPERE else (3 if cc >= VOLTA else MMVQ_MAX_BATCH)
    if type_name == "BF16":
        return 1 if cc >= AMPERE else MMVQ_MAX_BATCH  # BF16 tensor cores from Ampere on only
    return 0


def _mmf_ok(type_name: str, cc: int, rows: int) -> bool:
    """ggml_cuda_should_use_mmf (mmf.cu), not a mul_mat_id, NVIDIA, dimensions aligned."""
    if rows > MMF_MAX_BATCH:
        return False
    if type_name == "F16":
        return cc >= VOLTA
    return type_name in ("F32", "BF16") and cc >= AMPERE


def mmvq_max_rows(type_name: str, cc: int) -> int:
    """ggml_cuda_should_use_mmvq: the largest ne11 a quantized type runs MMVQ for (0: a float type)."""
    t = type_name.upper()
    if t in FLOAT_TYPES:
        return 0
    return MMVQ_MAX_ROWS.get(cc, {}).get(t, MMVQ_MAX_BATCH)


def _mmq_ok(type_name: str, cc: int, rows: int) -> bool:
    if type_name not in MMQ_TYPES:
        return False
    if cc >= TURING:
        return True
    if cc < DP4A:      # no dp4a: cuBLAS (dense weights)
        return False
    if cc >= VOLTA:    # FP16 tensor cores: cuBLAS is faster from MMQ_DP4A_MAX_BATCH rows on
        return rows < MMQ_DP4A_MAX_BATCH
    return True        # Pascal with dp4a, no tensor cores


def _select_early_2024(t: str, rows: int, cc: int) -> str:
    """ggml_cuda_mul_mat before MMQ ran on int8 tensor cores (the "early-2024" kernel set)."""
    if t in FLOAT_TYPES:
        return "mmvf" if rows == 1 else "cublas"
    if rows <= MMVQ_MAX_BATCH:
        return "mmvq"
    legacy_or_kquant = t in MMQ_TYPES and not t.startswith(("IQ", "MXFP", "NVFP", "Q1_", "Q2_0"))
    if not legacy_or_kquant or cc < DP4A:
        return "cublas"
    return "mmq-dp4a" if cc < VOLTA or rows <= MMQ_MAX_BATCH_EARLY else "cublas"


def check_kernel_set(kernel_set: str) -> str:
    if kernel_set not in KERNEL_SETS:
        raise ValueError(f"unknown CUDA kernel set {kernel_set!r}: one of {', '.join(KERNEL_SETS)}")
    return kernel_set


def select(type_name: str, rows: int, cc: int, kernel_set: str = "vendored") -> str:
    """The kernel family ggml_cuda_mul_mat runs for a weight matrix of `type_name` times `rows`
    activation rows on a GPU of compute capability `cc` (ggml's integer form), in the vendored
    source or an earlier kernel set (KERNEL_SETS)."""
    t = type_name.upper()
    if rows < 1:
        raise ValueError("a matrix product has at least one row")
    if check_kernel_set(kernel_set) == "early-2024":
        return _select_early_2024(t, rows, cc)
    if t in FLOAT_TYPES:
        if rows <= _mmvf_max_rows(t, cc):
            return "mmvf"
        return "mmf" if _mmf_ok(t, cc, rows) else "cublas"
    if rows <= mmvq_max_rows(t, cc):
        return "mmvq"
    return "mmq" if _mmq_ok(t, cc, rows) else "cublas"


def next_switch(type_name: str, cc: int, start: int = 1, limit: int = 256, kernel_set: str = "vendored") -> int | None:
    """The smallest row count above `start` whose kernel differs from `start`'s (None below limit)."""
    first = select(type_name, start, cc, kernel_set)
    for rows in range(start + 1, limit + 1):
        if select(type_name, rows, cc, kernel_set) != first:
            return rows
    return None


def mmq_tile(rows: int) -> int:
    """Columns MMQ computes for `rows`: its J (a multiple of 8 up to 128, fewest tiles) times the tiles."""
    best_j, best_tiles = MMQ_TILE_STEP, math.inf
    for j in range(MMQ_TILE_STEP, MMQ_TILE_MAX + 1, MMQ_TILE_STEP):
        tiles = -(-rows // j)
        if tiles < best_tiles:
            best_j, best_tiles = j, tiles
        if tiles == 1:
            break
    return best_j * int(best_tiles)


def weight_class(type_name: str) -> str:
    from specnative.analysis.projection.shape import type_class

    return type_class(type_name)


def matmul_s(device, type_name: str, n_bytes: float, n_elements: float, rows: int, kernel: str | None = None) -> float:
    """Seconds of one group of weights (one type) times `rows` activation rows on a CUDA device; kernel:
    the family to price (default: the one the vendored source selects)."""
    cls = weight_class(type_name)
    kernel = kernel or select(type_name, rows, device.cc, device.cuda_kernels)
    bw = device.mem_bw_gbs * 1e9 * device.bw_efficiency
    if kernel in ("mmvq", "mmvf"):
        ops = device.column_ops(type_name, cls)
        vector = max(device.vector_tflops, 1e-6) * 1e12
        # a quantized matrix's first column pays its dequantisation too (not hidden under the stream)
        columns = rows if kernel == "mmvq" else rows - 1
        return n_bytes / bw + columns * n_elements * ops / vector
    tensor = (device.tflops.get(type_name.upper()) or device.tflops.get(cls) or device.tflops["float"]) * 1e12
    if kernel == "mmq-dp4a":
        tensor = DP4A_PER_LANE * max(device.vector_tflops, 1e-6) * 1e12
    if kernel in ("mmq", "mmf", "mmq-dp4a"):
        share = 1.0 if kernel == "mmf" else device.mmq_bw_efficiency  # MMF streams F16 tiles as MMVF does
        return max(n_bytes / (bw * share),
                   2.0 * n_elements * mmq_tile(rows) / (tensor * device.compute_efficiency))
    f16 = device.tflops["float"] * 1e12 * device.compute_efficiency
    if cls == "float":
        return max(n_bytes / bw, 2.0 * n_elements * rows / f16)
    return (n_bytes + 4.0 * n_elements) / bw + 2.0 * n_elements * rows / f16
