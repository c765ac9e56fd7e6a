// The draft-model drafter: a second GGUF model in its own llama_context proposes k tokens per
// round, one batched llama_decode per draft position for all sequences together, and keeps the
// distribution q each token was drawn from (the rejection rule needs it).
#include "drafter.h"

#include <algorithm>

#include "sampling.h"

namespace specnative {

namespace {

class ModelDrafter final : public Drafter {
public:
    ModelDrafter(Engine::Context& d, const DraftPrefill& prefill, const GenerateParams& p, int target_vocab)
        : d_(d), prefill_(prefill), p_(p), vocab_(std::max(target_vocab, d.n_vocab)) {}

    int n_vocab() const override { return vocab_; }

    void begin(std::vector<Engine::Sequence>& seqs, int shared_prefix) override {
        for (Engine::Sequence& seq : seqs) seq.draft_todo = {seq.pending()};
        prefill_(seqs, shared_prefix);
        row_.assign(seqs.size(), 0);
    }

    // Position j predicts draft j+1 for every sequence that still drafts.
    void draft(std::vector<Engine::Sequence>& seqs, const std::vector<int>& k_max,
               std::vector<std::vector<int32_t>>& drafts, DraftDists& q) override {
        const int n_seq = static_cast<int>(seqs.size());
        const int k_top = *std::max_element(k_max.begin(), k_max.end());
        for (int j = 0; j < k_top; ++j) {
            d_.clear_batch();
            for (int s = 0; s < n_seq; ++s) {
                if (k_max[s] <= j) continue;
                Engine::Sequence& seq = seqs[s];
                if (j == 0) {  // catch up on everything emitted since the draft last ran
                    for (size_t i = 0; i < seq.draft_todo.size(); ++i) {
                        row_[s] = d_.add(seq.draft_todo[i], seq.n_past_draft++, seq.id, i + 1 == seq.draft_todo.size());
                    }
                    seq.draft_todo.clear();
                } else {
                    row_[s] = d_.add(drafts[s].back(), seq.n_past_draft++, seq.id, true);
                }
            }
            d_.decode("draft");
            for (int s = 0; s < n_seq; ++s) {
                if (k_max[s] <= j) continue;
                const float* logits = d_.logits(row_[s]);
                int32_t token;
                if (p_.temperature > 0.0f) {
                    std::vector<float>& qj = q[s][j];
                    softmax(logits, d_.n_vocab, p_.temperature, qj);
                    qj.resize(vocab_, 0.0f);
                    const int64_t index = seqs[s].next_index() + j;
                    token = sample_from_weights(qj.data(), d_.n_vocab, keyed_uniform(p_.seed, seqs[s].id, index, Stream::draft));
                } else {
                    token = argmax(logits, d_.n_vocab);  // the draft needs no margin
                }
                drafts[s].push_back(token);
            }
        }
    }

    // The draft cache holds pending and drafts 1..drafted-1 (the last draft was never fed).
    void accept(Engine::Sequence& seq, const RoundOutcome& o) override {
        if (o.drafted == 0) {
            // the draft did not run; pending is still in draft_todo
        } else if (o.accepted < o.drafted) {
            seq.n_past_draft = o.pos0 + 1 + o.accepted + std::max(o.stale, 0);
            llama_memory_seq_rm(d_.memory(), seq.id, seq.n_past_draft, -1);
        } else {
            seq.draft_todo.push_back(o.last_draft);
        }
        if (!o.stopped_on_eog) seq.draft_todo.push_back(o.correction);
    }

private:
    Engine::Context& d_;
    DraftPrefill prefill_;
    const GenerateParams& p_;
    int vocab_;
    std::vector<int> row_;
};

}  // namespace

std::unique_ptr<Drafter> make_model_drafter(Engine::Context& draft, const DraftPrefill& prefill,
                                            const GenerateParams& p, int target_vocab) {
    return std::make_unique<ModelDrafter>(draft, prefill, p, target_vocab);
}

}  // namespace specnative
