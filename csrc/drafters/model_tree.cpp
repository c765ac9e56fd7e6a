// The draft model drafting trees (tree_drafter.h) in the shapes of tree_shaper.h. Its cache holds
// every token it has been fed: a round starts with the tokens it has not seen yet (the last
// round's accepted tail and the pending token), fed under every id of the sequence. In serving a
// slot's prompt is fed when its request starts decoding and copied to the slot's other ids. After the
// round the id holding the longest part of the accepted path is kept, and every other id drops
// its own cells and takes a copy of that path; what no id held yet is fed at the next round.
#include "tree_shaper.h"

namespace specnative {
namespace {

class ModelTreeDrafter final : public ShapedTreeDrafter {
public:
    ModelTreeDrafter(Engine::Context& d, const DraftPrefill& prefill, const GenerateParams& p, int target_vocab,
                     int n_seq)
        : ShapedTreeDrafter(p, target_vocab, d.n_vocab, n_seq), d_(d), prefill_(prefill) {
        d_.clear_batch();  // a round's batch is built from empty (decode_batch clears it after each decode)
    }

    void begin(std::vector<Engine::Sequence>& seqs, int shared_prefix) override {
        for (Engine::Sequence& seq : seqs) seq.draft_todo = {seq.pending()};
        prefill_(seqs, shared_prefix);
        for (const Engine::Sequence& seq : seqs) {
            for (int j = 1; j < per_; ++j) {
                const int id = id_of(seq, j);
                llama_memory_seq_rm(d_.memory(), id, -1, -1);
                llama_memory_seq_cp(d_.memory(), seq.id, id, -1, -1);
            }
        }
        d_.clear_batch();
    }

    void admit(Engine::Sequence& seq) override {
        release(seq);
        d_.clear_batch();
        const int32_t n = static_cast<int32_t>(seq.prompt.size());
        for (int32_t i = 0; i < n; ++i) {
            if (d_.batch_full()) decode_batch();
            d_.add(seq.prompt[i], i, seq.id, false);
        }
        if (!batch_empty()) decode_batch();
        for (int j = 1; j < per_; ++j) copy_cells(seq.id, id_of(seq, j), 0, n);
        seq.n_past_draft = n;
        seq.draft_todo = {seq.pending()};
    }

    void release(const Engine::Sequence& seq) override {
        for (int j = 0; j < per_; ++j) remove_from(id_of(seq, j), 0);
    }

    void accept(Engine::Sequence& seq, const DraftTree& tree, const std::vector<int>& /*rows*/,
                const std::vector<int>& path, int32_t correction) override {
        const auto [keep_slot, held] = best_slot(seq, path);
        const int32_t from = work_[seq.id].p0 + 1;
        d_.remove_from(id_of(seq, keep_slot), from + held);
        align_slots(seq, keep_slot, held);
        seq.n_past_draft = from + held;
        seq.draft_todo.clear();
        for (size_t i = static_cast<size_t>(held); i < path.size(); ++i) seq.draft_todo.push_back(tree.token[path[i]]);
        if (correction >= 0) seq.draft_todo.push_back(correction);
    }

protected:
    int start_round(Engine::Sequence& seq, Work& w) override {
        w.p0 = seq.n_past_draft + static_cast<int32_t>(seq.draft_todo.size()) - 1;
        ids_.resize(per_);
        for (int j = 0; j < per_; ++j) ids_[j] = id_of(seq, j);
        int row = -1;
        for (size_t i = 0; i < seq.draft_todo.size(); ++i) {
            const bool last = i + 1 == seq.draft_todo.size();
            row = d_.add_shared(seq.draft_todo[i], seq.n_past_draft++, ids_.data(), per_, last);
        }
        seq.draft_todo.clear();
        return row;
    }
    int append_node(Engine::Sequence& seq, Work& w, int node, int slot) override {
        return d_.add(w.full.token[node], w.p0 + w.full.depth[node], id_of(seq, slot), true);
    }
    bool batch_empty() const override { return d_.batch.n_tokens == 0; }
    void decode_batch() override {
        d_.decode("tree draft");
        d_.clear_batch();
    }
    const float* row_logits(int row) override { return d_.logits(row); }
    int draft_vocab() const override { return d_.n_vocab; }
    void remove_from(int id, int32_t pos) override { d_.remove_from(id, pos); }
    void copy_cells(int src, int dst, int32_t p0, int32_t p1) override {
        const ScopedMs inside_llama(d_.llama_ms);
        const ScopedMs kv(d_.kv_removal_ms);
        llama_memory_seq_cp(d_.memory(), src, dst, p0, p1);
    }

private:
    Engine::Context& d_;
    DraftPrefill prefill_;
    std::vector<int> ids_;
};

}  // namespace

std::unique_ptr<TreeDrafter> make_model_tree_drafter(Engine::Context& draft, const DraftPrefill& prefill,
                                                     const GenerateParams& p, int target_vocab, int n_seq) {
    return std::make_unique<ModelTreeDrafter>(draft, prefill, p, target_vocab, n_seq);
}

}  // namespace specnative
