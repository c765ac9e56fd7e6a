// Test-only harness of the acceptance rule (never used by the engine): the chain's Acceptor and
// the tree's TreeAcceptor, planted faults included, fed synthetic p and q without a model, so
// that tests can draw the rule millions of times and compare what it emits with p.
//
// The synthetic sequence: the target's logits and the draft's q depend on the depth only (row d:
// the distributions at the d-th token of a round), so the token emitted at depth d, given that
// the walk reached it, must be distributed as softmax(logits[d] / T) exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "acceptor.h"

namespace specnative {

// Rows of equal length: logits[0..depth] (row depth: the bonus row), q[0..depth).
struct RuleInputs {
    const std::vector<std::vector<float>>& logits;
    const std::vector<std::vector<float>>& q;
    float temperature;
    int64_t n_draws;
    uint64_t seed;
};

// How often each token was emitted at each depth, [depth + 1][vocab] flattened.
// A chain: each draw proposes drafts x_i ~ q[i] (i < depth) and walks them as the chain walk
// (chain_round.cpp) does: the verify row, the q that weighs x_i, keep or replace, the bonus
// after all were kept.
std::vector<int64_t> chain_rule_draws(Fault fault, const RuleInputs& in);
// A tree: each node at depth d < depth gets `siblings` children drawn from q[d] without
// replacement (as the tree drafters draw them), and the walk follows the accepted child as
// the tree walk (tree_round.cpp) does, down to the leaf at `depth` and its bonus token.
std::vector<int64_t> tree_rule_draws(Fault fault, const RuleInputs& in, int siblings);

// The rejection kernel alone (rejection_step): x ~ q, then accept or resample; the histogram of
// the emitted token, and how many draws were accepted.
int64_t kernel_draws(const float* p, const float* q, int32_t n, int64_t n_draws, uint64_t seed,
                     std::vector<int64_t>& hist);

}  // namespace specnative
