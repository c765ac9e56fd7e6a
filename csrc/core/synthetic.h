// Synthetic acceptance: a benchmarking rule that keeps each draft with a requested probability
// instead of by what the target says, with llama.cpp's conventions (--spec-synth-rates,
// --spec-synth-len). The drafter drafts and the target verifies the real k + 1 batch; only the
// decision is drawn. Its output is not the target's: a synthetic run is never lossless.
//
// Kept drafts are emitted as drafted; at the first synthetic rejection the round emits the
// target's own token at that verify row (argmax, or its keyed sample at T > 0); a round that keeps
// every draft emits the bonus token as a real round does. Rollback and counts are the real ones.
#pragma once

#include <cstdint>
#include <vector>

#include "engine.h"

struct llama_vocab;

namespace specnative {

// Throws std::invalid_argument unless `conditional` (GenerateParams::synthetic) holds at least k
// probabilities, each finite and within [0, 1], and the run is speculative.
void check_synthetic(const std::vector<double>& conditional, int k, bool spec);

// Whether draft position i (0-based) of a round, token x at generated index `index` of the sequence
// keyed `key`, is kept: the position-keyed uniform (seed, key, index, Stream::synthetic) is below
// conditional[i]. A drafted end-of-generation token is never kept when the run stops at one: it
// would end the sequence early (llama.cpp's rule).
bool synthetic_keep(const GenerateParams& p, const llama_vocab* vocab, uint64_t key, int64_t index, int i,
                    int32_t x);

}  // namespace specnative
