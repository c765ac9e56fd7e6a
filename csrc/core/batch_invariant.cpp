// Compiled into the extension only with SPECNATIVE_BATCH_INVARIANT=ON (cmake/batch_invariant.cmake).
//
// ggml's CPU backend sends K-quant matrix products (Q4_K, Q6_K, ...) with 8 or more batch rows to
// its tiled kernel, which sums in another order than the per-row dot product a 1-token step uses,
// so the same position gets other logits in a prefill or a wide verify batch. The kernel has no
// build switch: ggml reads GGML_CPU_TILED_MM once, at the first matrix product. Setting it while
// the extension is loaded, before any model can run, keeps every product on the per-row path.
// A value the user set explicitly is kept (GGML_CPU_TILED_MM=1 shows what the tiled kernel changes).
#include <cstdlib>

namespace {

struct DisableTiledMatmul {
    DisableTiledMatmul() { setenv("GGML_CPU_TILED_MM", "0", /*overwrite=*/0); }
};

const DisableTiledMatmul disable_tiled_matmul;

}  // namespace
