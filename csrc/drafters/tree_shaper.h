// The shapes of a draft tree, apart from the drafter that fills them (tree_drafter.h):
//
// - topk (EAGLE-2's dynamic tree, SGLang's --speculative-eagle-topk / -num-steps /
//   -num-draft-tokens): the root gets `topk` children; at each further depth the `topk` nodes of
//   the last depth with the largest cumulative draft probability (the product of q along the
//   path) are fed to the drafter, each gets `topk` children; after `depth` levels the `budget`
//   nodes of largest cumulative probability are verified (their ancestors always come with them).
// - split (llama.cpp's examples/speculative): branches draft one token per step, all in one draft
//   batch; a branch splits when its further candidates' draft probabilities exceed p_split (each
//   consecutive one from the second, at most `branches` branches); a branch stops once the tree
//   holds `budget` nodes, and the draft stops after the step that reached it (or `budget` steps).
//
// At temperature 0 a node's children are its most probable tokens, ranked by the draft's
// softmax at temperature 1 (its cumulative probability; the split test). When sampling they are
// drawn without replacement from q (the draft's softmax at its temperature), and how many
// children a node keeps is decided before they are drawn (from q alone, and from nodes ranked
// above it), never from the children's own values: so the children are a draw from q without
// replacement that the recursive rejection rule verifies exactly (tree_acceptor.h). With topk
// that makes the budget select whole sibling groups in order of their parent's cumulative
// probability, a group's first siblings filling what room is left; at temperature 0 it takes the
// `budget` best nodes.
//
// Every branch of a sequence is a draft-cache sequence id (branch_id): every id holds the
// sequence's history; a frontier node is fed with its branch's id, a branch that splits copies its
// path to a free id first. A family (the draft model, the EAGLE-3 head) says how a round starts,
// how a node is fed and decoded, and what its cache keeps after the verify.
#pragma once

#include <utility>
#include <vector>

#include "sampling.h"
#include "tree_drafter.h"

namespace specnative {

class ShapedTreeDrafter : public TreeDrafter {
public:
    int n_vocab() const override { return vocab_; }
    void draft(std::vector<Engine::Sequence>& seqs, const std::vector<int>& max_depth,
               std::vector<DraftTree>& trees) override;

protected:
    struct Fed {  // a node fed in the last draft batch, its branch slot and output row
        int node, slot, row;
    };
    struct Branch {  // split shape: a branch's slot, its last node, whether it still drafts
        int slot, node;
        bool drafting;
    };
    struct Work {  // one sequence's draft in progress
        bool live = false;
        int cap = 0;      // the deepest the tree may go this round
        int32_t p0 = 0;   // the root's position in the draft cache
        DraftTree full;   // every node drafted (topk: candidates beyond the budget too)
        std::vector<double> cum;  // log cumulative draft probability by node
        std::vector<int> row;     // by node: its output row in the last draft batch (-1: none)
        std::vector<int> holds;   // by slot: the node whose path the slot's id holds (0: the root)
        std::vector<Fed> feed;
        std::vector<Branch> branches;
        std::vector<int> to_full;  // the selected tree's node -> full tree's node
    };

    ShapedTreeDrafter(const GenerateParams& p, int target_vocab, int draft_vocab, int n_seq);

    // ---- what a family provides ---------------------------------------------------------------
    // Appends the round's first entries of `seq` to the draft batch (whatever its cache still
    // lacks, ending with the root under every id of the sequence), sets w.p0, returns the root's row.
    virtual int start_round(Engine::Sequence& seq, Work& w) = 0;
    // Appends `node` at position p0 + its depth under its slot's id (its parent's output row is
    // w.row[parent], from the batch just decoded); returns its row.
    virtual int append_node(Engine::Sequence& seq, Work& w, int node, int slot) = 0;
    virtual bool batch_empty() const = 0;
    virtual void decode_batch() = 0;  // decodes and clears the batch; rows stay readable
    virtual const float* row_logits(int row) = 0;
    virtual int draft_vocab() const = 0;
    virtual void remove_from(int id, int32_t pos) = 0;                      // the draft cache's
    virtual void copy_cells(int src, int dst, int32_t p0, int32_t p1) = 0;  // the draft cache's

    // ---- what the families share --------------------------------------------------------------
    int id_of(const Engine::Sequence& seq, int slot) const { return branch_id(seq.id, slot, n_seq_, per_); }
    // After the verify: the slot whose id holds the longest part of the accepted path `path` (the
    // selected tree's nodes), and how many of the path's nodes that is.
    std::pair<int, int> best_slot(const Engine::Sequence& seq, const std::vector<int>& path);
    // Every other id of the sequence: its cells from p0 + 1 dropped, a copy of the kept slot's first
    // `held` path positions taken.
    void align_slots(const Engine::Sequence& seq, int keep_slot, int held);

    const GenerateParams& p_;
    const TreeShape shape_;
    int vocab_;
    int n_seq_;
    int per_;
    std::vector<Work> work_;

private:
    void children_of(const Engine::Sequence& seq, Work& w, int node, const float* logits, int n,
                     std::vector<std::pair<int32_t, double>>& out);
    int add_node(Work& w, int parent, int32_t token, double logp);
    void feed_node(Engine::Sequence& seq, Work& w, int node, int slot);
    void branch_off(Engine::Sequence& seq, Work& w, int from, int to);
    void expand_topk(Engine::Sequence& seq, Work& w, int step);
    void expand_split(Engine::Sequence& seq, Work& w, int step);
    const float* split_probs(const float* logits);
    void select(Work& w, DraftTree& out);

    std::vector<int32_t> top_;
    std::vector<std::pair<int32_t, double>> kids_;
    std::vector<float> weights_, split_;
    std::vector<char> on_path_;
    SoftmaxNorm norm_;
};

}  // namespace specnative
