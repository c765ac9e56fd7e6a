#include "synthetic.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "llama.h"
#include "sampling.h"

namespace specnative {

void check_synthetic(const std::vector<double>& conditional, int k, bool spec) {
    if (conditional.empty()) return;
    if (!spec) throw std::invalid_argument("synthetic acceptance applies to speculative runs (spec=True)");
    if (static_cast<int>(conditional.size()) < k) {
        throw std::invalid_argument("synthetic acceptance needs a probability for each of the k = " +
                                    std::to_string(k) + " draft positions, got " +
                                    std::to_string(conditional.size()));
    }
    for (const double v : conditional) {
        if (!std::isfinite(v) || v < 0.0 || v > 1.0) {
            throw std::invalid_argument("synthetic acceptance probabilities must be finite and within [0, 1]");
        }
    }
}

bool synthetic_keep(const GenerateParams& p, const llama_vocab* vocab, uint64_t key, int64_t index, int i,
                    int32_t x) {
    if (p.stop_at_eog && llama_vocab_is_eog(vocab, x)) return false;
    return keyed_uniform(p.seed, key, static_cast<uint64_t>(index), Stream::synthetic) < p.synthetic[i];
}

}  // namespace specnative
