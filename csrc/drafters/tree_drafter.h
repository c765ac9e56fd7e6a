// Draft trees: what a tree drafter proposes for one sequence in one round (DraftTree), and the
// interface the round loop drives for a tree (core/tree_round.cpp), beside the chain's Drafter.
//
// Branches are llama.cpp sequence ids: every id of a sequence holds its whole history in the KV
// cache (shared cells, several ids per cell), and one branch's id also holds that branch's path
// beyond it. llama.cpp's public API builds the attention mask from sequence ids and positions
// only (a token attends to the cells of its first id at positions up to its own), so ids per
// branch are the one way to verify a tree in one llama_decode (llama.cpp's examples/speculative
// does the same). A tree node is fed once, carrying the ids of every branch through it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "drafter.h"
#include "engine.h"
#include "engine_internal.h"

namespace specnative {

// One sequence's tree in one round. Node 0 is the root: the pending token, already emitted. The
// other nodes come in order of depth (a parent before its children), each sibling group in its
// draw order (rank 0 first).
struct DraftTree {
    std::vector<int32_t> token;          // [0]: the pending token
    std::vector<int> parent;             // [0]: -1
    std::vector<int> depth;              // [0]: 0
    std::vector<int> rank;               // place among its siblings (draw order)
    std::vector<std::vector<int>> children;  // by node, in draw order
    // Sampling (temperature > 0): by node, the draft distribution its children were drawn from
    // without replacement, in that order (empty for a leaf, and at temperature 0).
    std::vector<std::vector<float>> q;

    void reset(int32_t pending) {
        token.assign(1, pending);
        parent.assign(1, -1);
        depth.assign(1, 0);
        rank.assign(1, 0);
        children.assign(1, {});
        q.assign(1, {});
    }
    int size() const { return static_cast<int>(token.size()); }
    int nodes() const { return size() - 1; }  // drafted nodes (the root excluded)
    int add(int par, int32_t tok) {
        const int i = size();
        token.push_back(tok);
        parent.push_back(par);
        depth.push_back(depth[par] + 1);
        rank.push_back(static_cast<int>(children[par].size()));
        children[par].push_back(i);
        children.emplace_back();
        q.emplace_back();
        return i;
    }
    int max_depth() const { return depth.empty() ? 0 : depth.back(); }
};

// The sequence ids of sequence `s` (of n_seq) in a tree run: j = 0 is its own id, 1..per_seq-1
// its branches' ids, above every sequence's own.
inline int branch_id(int s, int j, int n_seq, int per_seq) {
    return j == 0 ? s : n_seq + s * (per_seq - 1) + (j - 1);
}

class TreeDrafter {
public:
    virtual ~TreeDrafter() = default;
    virtual int n_vocab() const = 0;  // q's length (p is zero-padded alike)
    // A drafter that reads the target's hidden states ingests every target decode: the prefill's
    // (after_target_decode, called with each prefill batch) and the verify's (after_verify).
    // In serving a target batch mixes verify nodes with prompt chunks: the rows from first_row on.
    virtual bool reads_target() const { return false; }
    virtual void after_target_decode(const llama_batch& /*batch*/, int /*first_row*/) {}
    // After the target's prefill: every prompt into the draft cache, every branch id a copy.
    virtual void begin(std::vector<Engine::Sequence>& seqs, int shared_prefix) = 0;
    // Serving (serve_loop.cpp), instead of begin(): slot `seq` starts a new request after the
    // target's prefill gave its first token; the drafter takes in its prompt under all the slot's ids.
    virtual void admit(Engine::Sequence& seq) = 0;
    // The request in slot `seq` finished: its draft cells go under every id of the slot.
    virtual void release(const Engine::Sequence& seq) = 0;
    // A tree for every sequence with max_depth[s] >= 1 (its depth capped there; -1: done, 0: none
    // wanted: the root alone). trees[s] is reset by the drafter.
    virtual void draft(std::vector<Engine::Sequence>& seqs, const std::vector<int>& max_depth,
                       std::vector<DraftTree>& trees) = 0;
    // The target kept `path` (node indices of trees[s], root excluded, root to leaf) and emits
    // `correction` after it (-1: an accepted end-of-generation token ended the sequence). rows:
    // each node's row in the verify batch (the target's outputs are still readable).
    virtual void accept(Engine::Sequence& seq, const DraftTree& tree, const std::vector<int>& rows,
                        const std::vector<int>& path, int32_t correction) = 0;
    // After every sequence's accept of a round (a drafter that reads the target ingests the
    // accepted paths here, all sequences in one go).
    virtual void after_verify() {}
    // Milliseconds inside llama.cpp on a context the engine does not time (a hidden-state head's),
    // and the part of them that removed or copied cache cells.
    virtual double library_ms() const { return 0; }
    virtual double kv_ms() const { return 0; }
};

// The draft model as a tree drafter (model_tree.cpp): shape p.tree, ids per branch_id().
std::unique_ptr<TreeDrafter> make_model_tree_drafter(Engine::Context& draft, const DraftPrefill& prefill,
                                                     const GenerateParams& p, int target_vocab, int n_seq);
// An EAGLE-3 head as a tree drafter (eagle3_tree.cpp): driven directly (llama.cpp's common loop
// drafts chains only), its decoder cache with one id per branch like the target's.
std::unique_ptr<TreeDrafter> make_eagle3_tree_drafter(HiddenDraft& head, Engine::Context& target,
                                                      const GenerateParams& p, int n_seq);

}  // namespace specnative
