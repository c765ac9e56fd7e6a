// The acceptance rule at one node of a draft tree (the tree walk, tree_round.cpp, asks it node by
// node along the accepted path), beside the chain's Acceptor, which stays the chain's hot path.
//
// Greedy (and `match`): the target's own token at the node (argmax, or the position-keyed sample)
// is kept when it equals one of the node's children: the walk follows the longest path matching
// the target, and the output is the baseline's token for token.
// Rejection (temperature > 0): recursive rejection over the siblings, the multi-draft rule of
// SpecInfer (Miao et al. 2024) in the form for siblings drawn without replacement (Jeon et al.
// 2024, recursive speculative decoding): the node's children x_1..x_m were drawn in that order
// without replacement from the draft's q. With r_0 = p, sibling i is proposed from
// q_i = q without x_1..x_{i-1}, renormalized; it is kept with probability min(1, r_{i-1}(x_i) /
// q_i(x_i)); after a rejection r_i = norm(max(0, r_{i-1} - q_i)). If every sibling is rejected the
// token is drawn from r_m. The emitted token is then distributed as p exactly, for any q.
//
// Tests swap in a planted fault (planted_faults.cpp) that overrides one hook the way real
// implementations have been broken.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "acceptor.h"
#include "engine.h"
#include "sampling.h"

namespace specnative {

// What the rule decided at one node: the child it moved on to (its rank, -1: none) and the token
// emitted there (that child's token, or the correction / bonus token).
struct NodeVerdict {
    int rank = -1;
    int32_t token = -1;
};

struct TreeScratch {
    SoftmaxNorm norm;
    std::vector<float> r;  // the residual being updated
};

// A node to judge: its verify row's logits, the children's tokens in draw order and the q they
// were drawn from (null at temperature 0 or for a leaf).
struct NodeToJudge {
    const float* logits;
    const std::vector<int32_t>& children;
    const std::vector<float>* q;
    int64_t index;  // the emitted token's index in its sequence's output
};

class TreeAcceptor {
public:
    virtual ~TreeAcceptor() = default;

    NodeVerdict judge(const NodeToJudge& node, int n_vocab, int vocab, const GenerateParams& p, AcceptRule rule,
                      uint64_t key, std::vector<float>& margins, TreeScratch& scratch) const;

    // The sibling the walk tries at step i (0-based).
    virtual int sibling_at(int i) const { return i; }
    // q_i(x) of the sibling x tried at a step: q(x) renormalized without the siblings drawn
    // before it (`rest`: q's mass left after them), 0 if x is one of them.
    virtual float sibling_q(const std::vector<float>& q, int32_t x, double rest, bool drawn_before) const {
        return drawn_before || !(rest > 0.0) ? 0.0f : static_cast<float>(q[x] / rest);
    }
    // The step whose accept uniform (sibling_position) the test at step i uses: its own.
    virtual int uniform_step(int i) const { return i; }
    // After the sibling of step i was rejected: r <- max(0, r - q_i), q_i = q * scale outside
    // the siblings drawn before it (drawn[0..n_drawn)), where q_i is 0.
    virtual void update_residual(std::vector<float>& r, const std::vector<float>& q, double scale,
                                 const int32_t* drawn, int n_drawn) const;
    // The node whose verify row gives the bonus token at the end of a fully accepted path (`leaf`).
    virtual int bonus_node(int leaf, int parent) const {
        (void)parent;
        return leaf;
    }
    // Whether the round's KV cleanup drops the other branches' own cells before copying the
    // accepted path to their ids.
    virtual bool drops_branch_cells() const { return true; }
};

// The uniform position of sibling step i at output index `index` (the accept stream; step 0 of a
// chain-like node is not the chain's: trees draw their own).
inline uint64_t sibling_position(int64_t index, int step) {
    return static_cast<uint64_t>(index) + (static_cast<uint64_t>(step + 1) << 48);
}

// The rule for `fault` (any fault of the chain's, or none: the correct one).
std::unique_ptr<TreeAcceptor> make_tree_acceptor(Fault fault);

}  // namespace specnative
