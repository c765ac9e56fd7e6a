"""llama.cpp's Metal backend, per matrix product: which kernel family it runs for a weight type and a
number of activation rows (ne11), and what that kernel costs.

Kernel selection follows the vendored ggml-metal (vendor/llama.cpp/ggml/src/ggml-metal), encoded
here as a table, not copied. `ggml_metal_op_mul_mat` (ggml-metal-ops.cpp) tries, in order:

- mul_mv_ext, the small-batch matrix-vector kernels: F32 activations, a row length (ne00) that is a
  multiple of 128, and 2-8 rows for the float, legacy and a few other types (MV_EXT_TYPES), 4-8
  rows for the k-quants (MV_EXT_KQUANT_TYPES);
- mul_mm, the simdgroup matrix-matrix kernel (`ggml_metal_op_mul_mat_use_mm`, ggml-metal-common.cpp):
  more than 8 rows (MM_MIN_ROWS), a row length of at least 64, and an Apple GPU with simdgroup
  matrices (every M-series chip); it computes tiles of 32 activation rows (NR1 in mul_mm.metal);
- mul_mv, the matrix-vector kernel, otherwise: one row, the k-quants at 2-3 rows, and the types
  without a small-batch kernel (most i-quants) up to 8 rows.

Costs (seconds, one group of weights of one type: its bytes B and elements E, r rows):
    one row (mul_mv)     max(B / bw, 2 E / (ALU rate x compute_efficiency))   (as the Apple-silicon
                         fit of bandwidth and compute efficiency priced it: unchanged)
    mul_mv, mul_mv_ext   B / bw x (1 + (passes - 1) x matvec_pass_share)  +  r x E x column_ops / ALU rate
    mul_mm               max(B / bw, 2 E x tile(r) / (ALU rate x compute_efficiency))
A matrix-vector kernel dequantises the weights again for every activation row (column_ops per
element and row, on the ALUs: `mmvq_column_ops` by class or type for mul_mv_ext, `mv_column_ops`
for mul_mv), and streams them once per pass: mul_mv makes one pass per row; mul_mv_ext one per
group of r1ptg rows that a threadgroup takes (its switch on ne11: 2, 3, 4, 5, 3, 4, 4 rows per
group at 2-8 rows, so 6-8 rows take two passes), each further pass costing `matvec_pass_share` of a
stream (the rest comes from the cache). The ALU rate is the chip's FP32 peak (GPU cores x 128 ALUs
x 2 x clock, `tflops.float`); tile(r) is r rounded up to 32.
"""
from __future__ import annotations

MV_EXT_MAX_ROWS = 8          # ggml_metal_op_mul_mat: the small-batch kernels for ne11 in [2, 8]
MV_EXT_KQUANT_MIN_ROWS = 4   # ... and for the k-quants from 4 rows on
MV_EXT_ROW_MULTIPLE = 128    # ne00 % 128 == 0
MM_MIN_ROWS = 9              # ggml_metal_op_mul_mat_use_mm: ne11 > 8
MM_MIN_ROW_LENGTH = 64       # ... and ne00 >= 64
MM_TILE = 32                 # mul_mm.metal NR1: activation rows per threadgroup tile
MV_EXT_ROWS_PER_GROUP = {2: 2, 3: 3, 4: 4, 5: 5, 6: 3, 7: 4, 8: 4}   # ggml_metal_op_mul_mat's r1ptg by ne11
KERNELS = ("mul_mv", "mul_mv_ext", "mul_mm")

MV_EXT_TYPES = frozenset({"F32", "F16", "BF16", "Q1_0", "Q2_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                          "MXFP4", "IQ4_NL"})
MV_EXT_KQUANT_TYPES = frozenset({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"})


def _mv_ext_ok(t: str, rows: int, row_length: int | None) -> bool:
    if rows > MV_EXT_MAX_ROWS or (row_length is not None and row_length % MV_EXT_ROW_MULTIPLE):
        return False
    if t in MV_EXT_TYPES:
        return rows >= 2
    return t in MV_EXT_KQUANT_TYPES and rows >= MV_EXT_KQUANT_MIN_ROWS


def select(type_name: str, rows: int, row_length: int | None = None) -> str:
    """The kernel family ggml_metal_op_mul_mat runs for a weight matrix of `type_name` with rows of
    `row_length` elements (ne00; None: a multiple of 128, as every model dimension in practice)
    times `rows` activation rows, on an M-series GPU."""
    if rows < 1:
        raise ValueError("a matrix product has at least one row")
    t = type_name.upper()
    if _mv_ext_ok(t, rows, row_length):
        return "mul_mv_ext"
    if rows >= MM_MIN_ROWS and (row_length is None or row_length >= MM_MIN_ROW_LENGTH):
        return "mul_mm"
    return "mul_mv"


MATRIX_VECTOR = ("mul_mv", "mul_mv_ext")


def next_switch(type_name: str, start: int = 1, limit: int = 256, row_length: int | None = None) -> int | None:
    """The smallest row count above `start` at which the product leaves the matrix-vector kernels
    (mul_mv, mul_mv_ext: a cost that grows with every row) for the matrix-matrix kernel, or the
    reverse (None below limit). mul_mv to mul_mv_ext is a change of kernel within the family."""
    first = select(type_name, start, row_length) in MATRIX_VECTOR
    for rows in range(start + 1, limit + 1):
        if (select(type_name, rows, row_length) in MATRIX_VECTOR) != first:
            return rows
    return None


def mm_tile(rows: int) -> int:
    return MM_TILE * -(-rows // MM_TILE)


def passes(kernel: str, rows: int) -> int:
    """How many times a matrix-vector kernel streams the weights for `rows` activation rows."""
    if kernel == "mul_mv_ext":
        return -(-rows // MV_EXT_ROWS_PER_GROUP[rows])
    return rows


def matmul_s(device, type_name: str, n_bytes: float, n_elements: float, rows: int, kernel: str | None = None) -> float:
    """Seconds of one group of weights (one type) times `rows` activation rows on a Metal device;
    kernel: the family to price (default: the vendored choice for rows of a multiple of 128)."""
    from specnative.analysis.projection.shape import type_class

    kernel = kernel or select(type_name, rows)
    if kernel not in KERNELS:
        raise ValueError(f"unknown Metal kernel {kernel!r}: one of {', '.join(KERNELS)}")
    if kernel == "mul_mv_ext" and rows > MV_EXT_MAX_ROWS:
        raise ValueError(f"mul_mv_ext runs at most {MV_EXT_MAX_ROWS} rows, not {rows}")
    bw = device.bandwidth
    alu = device.tflops["float"] * 1e12
    if kernel == "mul_mm":
        return max(n_bytes / bw, 2.0 * n_elements * mm_tile(rows) / (alu * device.compute_efficiency))
    if rows == 1:
        return max(n_bytes / bw, 2.0 * n_elements / (alu * device.compute_efficiency))
    ops = device.column_ops(type_name, type_class(type_name)) if kernel == "mul_mv_ext" else device.mv_column_ops
    stream = n_bytes / bw * (1.0 + (passes(kernel, rows) - 1) * device.matvec_pass_share)
    return stream + rows * n_elements * ops / alu
