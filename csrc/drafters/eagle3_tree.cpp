// An EAGLE-3 head drafting trees (tree_drafter.h) in the shapes of tree_shaper.h, driven directly
// through llama.cpp's staging API: llama.cpp's own common loop (common/speculative.cpp) drafts
// one chain per sequence and keeps the head's state per sequence, so a tree needs its state per
// branch. The head's protocol is the one that loop follows:
//
// - The target publishes the inputs of three of its layers for every token it decodes; the head's
//   encoder turns their concatenation into one feature row g per token (LLAMA_PROCESS_TYPE_ENCODE).
// - The head's decoder cache holds, at position P, the pair (token at P + 1, g at P). The last
//   position whose g is known waits for the token after it ("pending": the last prompt token
//   after the prefill, the deepest accepted node after a verify).
// - A round starts with that pair (the pending token and the waiting g), the seed; each further
//   draft step feeds a drafted token with the pre-norm hidden state the head computed for its
//   parent (llama_get_embeddings_nextn_ith) instead of a target feature.
//
// Branches are decoder-cache sequence ids, one per branch as in the target (branch_id): every id
// holds the sequence's history, a node is fed under its branch's id. After the verify every cell
// past the seed is a draft's guess and goes under every id; the accepted path's target features
// are then encoded and its pairs written once, under every id of the sequence (after_verify: all
// sequences in one encoder call and one decoder call).
#include <cstring>
#include <stdexcept>

#include "phase_clock.h"
#include "tree_shaper.h"

#ifdef SPECNATIVE_HAVE_COMMON
#include "common.h"
#include "../src/llama-ext.h"  // staging API: the extraction switches, llama_process
#endif

namespace specnative {

#ifdef SPECNATIVE_HAVE_COMMON
namespace {

class Eagle3TreeDrafter final : public ShapedTreeDrafter {
public:
    Eagle3TreeDrafter(HiddenDraft& head, Engine::Context& target, const GenerateParams& p, int n_seq)
        : ShapedTreeDrafter(p, target.n_vocab, llama_vocab_n_tokens(llama_model_get_vocab(head.model)), n_seq),
          h_(head), target_(target), batch_(head.ctx), batch_enc_(head.ctx) {
        const llama_model* tm = llama_get_model(target.ctx);
        layer_ids_ = llama_model_target_layer_ids(head.model);
        n_layer_ids_ = llama_model_target_layer_ids_n(head.model);
        n_layer_tgt_ = llama_model_n_layer(tm);
        n_embd_tgt_ = llama_model_n_embd(tm);
        n_embd_dec_ = llama_model_n_embd(head.model);
        if (n_layer_ids_ != 3) {
            throw std::invalid_argument("an EAGLE-3 head reads 3 target layers; this one reads " +
                                        std::to_string(n_layer_ids_));
        }
        for (uint32_t k = 0; k < n_layer_ids_; ++k) {
            if (layer_ids_[k] < 0 || layer_ids_[k] > n_layer_tgt_) {
                throw std::invalid_argument("the EAGLE-3 head reads target layer " + std::to_string(layer_ids_[k]) +
                                            " but the target has " + std::to_string(n_layer_tgt_));
            }
        }
        n_embd_enc_ = static_cast<int>(n_layer_ids_) * n_embd_tgt_;
        for (uint32_t k = 0; k < n_layer_ids_; ++k) {  // the target publishes what the head reads
            if (layer_ids_[k] < n_layer_tgt_) {
                llama_set_embeddings_layer_inp(target.ctx, static_cast<uint32_t>(layer_ids_[k]), true);
            } else {
                llama_set_embeddings_nextn(target.ctx, true, false);
            }
        }
        llama_set_embeddings_nextn(head.ctx, true, true);  // the head's pre-norm state of its outputs
        llama_memory_clear(llama_get_memory(head.ctx), true);
        pending_pos_.assign(n_seq, -1);
        groups_.assign(n_seq, {});
        pending_g_.assign(n_seq, std::vector<float>(n_embd_dec_, 0.0f));
        bridge_g_.assign(n_seq, std::vector<float>(n_embd_dec_, 0.0f));
    }

    // The target context goes back to plain decoding.
    ~Eagle3TreeDrafter() override {
        for (uint32_t k = 0; k < n_layer_ids_; ++k) {
            if (layer_ids_[k] >= 0 && layer_ids_[k] < n_layer_tgt_) {
                llama_set_embeddings_layer_inp(target_.ctx, static_cast<uint32_t>(layer_ids_[k]), false);
            }
        }
        llama_set_embeddings_nextn(target_.ctx, false, false);
    }

    bool reads_target() const override { return true; }
    double library_ms() const override { return library_ms_; }
    double kv_ms() const override { return kv_ms_; }

    // Prefill chunks: every sequence's tokens from first_row on, in batch order.
    void after_target_decode(const llama_batch& batch, int first_row) override {
        for (auto& g : groups_) g.clear();  // ingest leaves them empty; kept for their capacity
        for (int i = first_row; i < batch.n_tokens; ++i) {
            const int s = batch.seq_id[i][0];
            if (s >= 0 && s < n_seq_) groups_[s].push_back(Entry{batch.token[i], batch.pos[i], i});
        }
        ingest();
    }

    void begin(std::vector<Engine::Sequence>& seqs, int /*shared_prefix*/) override {
        for (const Engine::Sequence& seq : seqs) check_prompt_ingested(seq);
    }

    // Serving: the slot's prompt went in from the target's prefill chunks (after_target_decode).
    void admit(Engine::Sequence& seq) override { check_prompt_ingested(seq); }

    void release(const Engine::Sequence& seq) override {
        for (int j = 0; j < per_; ++j) remove_from(id_of(seq, j), 0);
        pending_pos_[seq.id] = -1;
    }

    void accept(Engine::Sequence& seq, const DraftTree& tree, const std::vector<int>& rows,
                const std::vector<int>& path, int32_t correction) override {
        const Work& w = work_[seq.id];
        for (int j = 0; j < per_; ++j) remove_from(id_of(seq, j), w.p0 + 1);  // the drafts' guesses
        if (correction < 0) return;  // ended on an accepted end-of-generation token
        std::vector<Entry>& g = groups_[seq.id];
        g.clear();
        g.push_back(Entry{tree.token[0], w.p0 + 1, rows[0]});
        for (int v : path) g.push_back(Entry{tree.token[v], w.p0 + 1 + tree.depth[v], rows[v]});
    }

    void after_verify() override { ingest(); }

protected:
    int start_round(Engine::Sequence& seq, Work& w) override {
        const int s = seq.id;
        if (pending_pos_[s] < 0) {
            throw std::runtime_error("the eagle3 head holds no target feature for sequence " + std::to_string(s));
        }
        w.p0 = pending_pos_[s];  // the cache holds every position before it (accept and ingest saw to that)
        all_ids(s);
        const int row = batch_.add(seq.pending(), w.p0, ids_, true);
        batch_.set_embd(row, llama_embd{pending_g_[s].data(), 1, static_cast<size_t>(n_embd_dec_)});
        return row;
    }

    int append_node(Engine::Sequence& seq, Work& w, int node, int slot) override {
        const float* parent_state = llama_get_embeddings_nextn_ith(h_.ctx, w.row[w.full.parent[node]]);
        if (parent_state == nullptr) throw std::runtime_error("the eagle3 head returned no hidden state for a node");
        if (arena_used_ == arena_.size()) arena_.emplace_back(n_embd_dec_);
        std::vector<float>& state = arena_[arena_used_++];  // kept until the batch is decoded
        std::memcpy(state.data(), parent_state, sizeof(float) * n_embd_dec_);
        const int row = batch_.add(w.full.token[node], w.p0 + w.full.depth[node], id_of(seq, slot), true);
        batch_.set_embd(row, llama_embd{state.data(), 1, static_cast<size_t>(n_embd_dec_)});
        return row;
    }

    bool batch_empty() const override { return batch_.size() == 0; }

    void decode_batch() override {
        process(LLAMA_PROCESS_TYPE_DECODE, batch_, "a tree draft step");
        batch_.clear();
        arena_used_ = 0;
    }

    const float* row_logits(int row) override { return llama_get_logits_ith(h_.ctx, row); }
    int draft_vocab() const override { return llama_vocab_n_tokens(llama_model_get_vocab(h_.model)); }

    void remove_from(int id, int32_t pos) override {
        const ScopedMs inside(library_ms_);
        const ScopedMs kv(kv_ms_);
        llama_memory_seq_rm(llama_get_memory(h_.ctx), id, pos, -1);
    }

    void copy_cells(int src, int dst, int32_t p0, int32_t p1) override {
        const ScopedMs inside(library_ms_);
        const ScopedMs kv(kv_ms_);
        llama_memory_seq_cp(llama_get_memory(h_.ctx), src, dst, p0, p1);
    }

private:
    struct Entry {  // a token the target decoded: its position and its row in the target's batch
        int32_t token;
        int32_t pos;
        int row;
    };

    // Every prompt position but the last is in the head's cache, the last waits for its next token.
    void check_prompt_ingested(const Engine::Sequence& seq) const {
        const int32_t n = static_cast<int32_t>(seq.prompt.size());
        const llama_pos pos_max = llama_memory_seq_pos_max(llama_get_memory(h_.ctx), seq.id);
        if (pos_max < n - 2 || pending_pos_[seq.id] != n - 1) {
            throw std::runtime_error("the eagle3 draft cache of sequence " + std::to_string(seq.id) +
                                     " ends at position " + std::to_string(pos_max) + " after a prompt of " +
                                     std::to_string(n) + " tokens: a prefill chunk was not ingested");
        }
    }

    void all_ids(int s) {
        ids_.resize(per_);
        for (int j = 0; j < per_; ++j) ids_[j] = branch_id(s, j, n_seq_, per_);
    }

    void process(llama_process_type type, common_batch& batch, const char* what) {
        const ScopedMs inside(library_ms_);
        const int32_t rc = llama_process(h_.ctx, type, batch.get());
        if (rc != 0) {
            throw std::runtime_error(std::string("the eagle3 head failed on ") + what + " (llama_process returned " +
                                     std::to_string(rc) + "): " + last_llama_errors());
        }
        llama_synchronize(h_.ctx);  // its clock stops after the device work
    }

    // Encodes the target features of every entry in groups_ (rows of the target's last decode) and
    // writes each sequence's pairs (token at P + 1, g at P) under all its ids; each sequence's last
    // entry becomes its pending position.
    void ingest() {
        int n = 0;
        for (const auto& g : groups_) n += static_cast<int>(g.size());
        if (n == 0) return;
        features_.resize(static_cast<size_t>(n) * n_embd_enc_);
        for (uint32_t k = 0; k < n_layer_ids_; ++k) {
            const float* layer = layer_ids_[k] < n_layer_tgt_
                                     ? llama_get_embeddings_layer_inp(target_.ctx, static_cast<uint32_t>(layer_ids_[k]))
                                     : llama_get_embeddings_nextn(target_.ctx);
            if (layer == nullptr) throw std::runtime_error("the target did not publish a layer the eagle3 head reads");
            int i = 0;
            for (const auto& g : groups_) {
                for (const Entry& e : g) {
                    std::memcpy(features_.data() + static_cast<size_t>(i++) * n_embd_enc_ + k * n_embd_tgt_,
                                layer + static_cast<size_t>(e.row) * n_embd_tgt_, sizeof(float) * n_embd_tgt_);
                }
            }
        }
        encode(n);
        batch_.clear();
        int i = 0;
        for (int s = 0; s < n_seq_; ++s) {
            const std::vector<Entry>& g = groups_[s];
            if (g.empty()) continue;
            const int first = i;
            all_ids(s);
            // the pair a previous chunk left waiting, now that its next token is known
            const llama_pos max_pos = llama_memory_seq_pos_max(llama_get_memory(h_.ctx), s);
            if (pending_pos_[s] >= 0 && pending_pos_[s] + 1 == g.front().pos && pending_pos_[s] > max_pos) {
                bridge_g_[s] = pending_g_[s];
                const int row = batch_.add(g.front().token, pending_pos_[s], ids_, false);
                batch_.set_embd(row, llama_embd{bridge_g_[s].data(), 1, static_cast<size_t>(n_embd_dec_)});
            }
            for (size_t j = 0; j + 1 < g.size(); ++j) {
                const int row = batch_.add(g[j + 1].token, g[j].pos, ids_, false);
                batch_.set_embd(row, llama_embd{g_rows_.data() + static_cast<size_t>(first + j) * n_embd_dec_, 1,
                                                static_cast<size_t>(n_embd_dec_)});
            }
            i += static_cast<int>(g.size());
            pending_pos_[s] = g.back().pos;
            std::memcpy(pending_g_[s].data(), g_rows_.data() + static_cast<size_t>(i - 1) * n_embd_dec_,
                        sizeof(float) * n_embd_dec_);
        }
        if (batch_.size() > 0) process(LLAMA_PROCESS_TYPE_DECODE, batch_, "the accepted tokens' features");
        batch_.clear();
        for (auto& g : groups_) g.clear();
    }

    // features_ (n rows) through the head's encoder into g_rows_, in chunks of its n_ubatch.
    void encode(int n) {
        g_rows_.resize(static_cast<size_t>(n) * n_embd_dec_);
        const int chunk = static_cast<int>(llama_n_ubatch(h_.ctx));
        for (int i = 0; i < n; i += chunk) {
            const int m = std::min(chunk, n - i);
            batch_enc_.clear();
            // the encoder reads no position; placeholders after what the cache holds, as llama.cpp does
            llama_pos pos = llama_memory_seq_pos_max(llama_get_memory(h_.ctx), 0) + 1;
            for (int j = 0; j < m; ++j, ++pos) {
                batch_enc_.add_embd(llama_embd{features_.data() + static_cast<size_t>(i + j) * n_embd_enc_, 1,
                                               static_cast<size_t>(n_embd_enc_)},
                                    &pos, 0, true);
            }
            process(LLAMA_PROCESS_TYPE_ENCODE, batch_enc_, "the target's features");
            const float* g = llama_get_embeddings_nextn(h_.ctx);
            if (g == nullptr) throw std::runtime_error("the eagle3 head's encoder returned no features");
            std::memcpy(g_rows_.data() + static_cast<size_t>(i) * n_embd_dec_, g, sizeof(float) * m * n_embd_dec_);
        }
    }

    HiddenDraft& h_;
    Engine::Context& target_;
    common_batch batch_;      // decoder input: (token, embedding) pairs
    common_batch batch_enc_;  // encoder input: target feature rows
    const int32_t* layer_ids_ = nullptr;
    uint32_t n_layer_ids_ = 0;
    int n_layer_tgt_ = 0, n_embd_tgt_ = 0, n_embd_dec_ = 0, n_embd_enc_ = 0;
    std::vector<llama_pos> pending_pos_;          // by sequence: the position whose pair waits
    std::vector<std::vector<float>> pending_g_;   // by sequence: its g
    std::vector<std::vector<float>> bridge_g_;    // by sequence: a waiting g fed in this ingest
    std::vector<std::vector<Entry>> groups_;      // by sequence: target tokens to ingest
    std::vector<float> features_, g_rows_;
    std::vector<std::vector<float>> arena_;       // parents' hidden states fed in the batch being built
    size_t arena_used_ = 0;
    std::vector<llama_seq_id> ids_;
    double library_ms_ = 0, kv_ms_ = 0;
};

}  // namespace

std::unique_ptr<TreeDrafter> make_eagle3_tree_drafter(HiddenDraft& head, Engine::Context& target,
                                                      const GenerateParams& p, int n_seq) {
    if (head.kind != "eagle3") {
        throw std::invalid_argument("draft trees from a hidden-state file need an EAGLE-3 head, not " + head.kind);
    }
    return std::make_unique<Eagle3TreeDrafter>(head, target, p, n_seq);
}

#else

std::unique_ptr<TreeDrafter> make_eagle3_tree_drafter(HiddenDraft&, Engine::Context&, const GenerateParams&, int) {
    throw std::invalid_argument("EAGLE-3 draft trees need llama.cpp's common library, which this build does not link");
}

#endif

}  // namespace specnative
