// The draft-model drafter: a second GGUF model in its own llama_context proposes k tokens per
// round, one batched llama_decode per draft position for all sequences together, and keeps the
// distribution q each token was drawn from where the rule reads it (the rejection rule when
// sampling); otherwise a draft is the argmax (temperature 0) or the keyed sample, no table.
// With draft_p_min > 0 a sequence stops drafting for the round at the first position whose top
// draft probability is below p (llama.cpp's --spec-draft-p-min), so it proposes 0..k tokens.
#include "drafter.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>

#include "sampling.h"

namespace specnative {

namespace {

// The number llama.cpp's draft-model path compares with p_min (common/speculative.cpp at the
// pinned commit): its draft sampler is top_k(10) then dist, so the top candidate's p is the softmax
// at temperature 1 over the 10 largest draft logits; the check comes before the token is added,
// whatever the generation temperature. Returns that top-1 probability.
float top1_prob_top10(const float* logits, int n_vocab) {
    constexpr int kTop = 10;
    std::array<float, kTop> top;  // min-heap of the largest logits seen
    int n = 0;
    for (int i = 0; i < n_vocab; ++i) {
        const float l = logits[i];
        if (n < kTop) {
            top[n++] = l;
            std::push_heap(top.begin(), top.begin() + n, std::greater<float>());
        } else if (l > top[0]) {
            std::pop_heap(top.begin(), top.end(), std::greater<float>());
            top[kTop - 1] = l;
            std::push_heap(top.begin(), top.end(), std::greater<float>());
        }
    }
    const float l_max = *std::max_element(top.begin(), top.begin() + n);
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += std::exp(static_cast<double>(top[i]) - l_max);
    return static_cast<float>(1.0 / sum);
}

class ModelDrafter final : public Drafter {
public:
    ModelDrafter(Engine::Context& d, const DraftPrefill& prefill, const GenerateParams& p, int target_vocab, int n_seq)
        : d_(d), prefill_(prefill), p_(p), vocab_(std::max(target_vocab, d.n_vocab)), keep_q_(draft_dists_read(p)),
          row_(n_seq, 0), stopped_(n_seq, 0) {}

    int n_vocab() const override { return vocab_; }

    void begin(std::vector<Engine::Sequence>& seqs, int shared_prefix) override {
        for (Engine::Sequence& seq : seqs) seq.draft_todo = {seq.pending()};
        prefill_(seqs, shared_prefix);
    }

    // The prompt into the slot's draft cells, in batches of at most n_batch (no logits: the
    // first draft position is computed from pending, in the next round's first draft batch).
    void admit(Engine::Sequence& seq) override {
        d_.remove_from(seq.id, 0);  // nothing is left from the slot's last request (release)
        size_t from = 0;
        if (shared_ > 0) {  // the prefix's cells from the holder (fed there once), then the rest
            if (!holder_filled_) {
                feed(seq.prompt, 0, static_cast<size_t>(shared_), holder_);
                holder_filled_ = true;
            }
            llama_memory_seq_cp(d_.memory(), holder_, seq.id, -1, -1);
            from = static_cast<size_t>(shared_);
        }
        stopped_[seq.id] = 0;
        if (p_.policy.kind != PolicyParams::Kind::static_k) {
            // A policy may keep this sequence at k = 0 to the end: its prompt waits in draft_todo for
            // the first round that drafts for it (the catch-up), so a request never drafted for costs
            // the draft nothing and its first token comes as soon as without speculation.
            seq.n_past_draft = static_cast<int32_t>(from);
            seq.draft_todo.assign(seq.prompt.begin() + static_cast<std::ptrdiff_t>(from), seq.prompt.end());
            seq.draft_todo.push_back(seq.pending());
            return;
        }
        feed(seq.prompt, from, seq.prompt.size(), seq.id);
        seq.n_past_draft = static_cast<int32_t>(seq.prompt.size());
        seq.draft_todo = {seq.pending()};
    }

    void release(const Engine::Sequence& seq) override { d_.remove_from(seq.id, 0); }
    double catch_up_ms() const override { return catch_up_ms_; }

    void share_prefix(int length, int holder) override {
        if (length == 0 && holder_filled_) d_.remove_from(holder_, 0);
        shared_ = length;
        holder_ = holder;
        holder_filled_ = false;
    }

    // Position j predicts draft j+1 for every sequence that still drafts.
    void draft(std::vector<Engine::Sequence>& seqs, const std::vector<int>& k_max,
               std::vector<std::vector<int32_t>>& drafts, DraftDists& q) override {
        const int n_seq = static_cast<int>(seqs.size());
        const int k_top = *std::max_element(k_max.begin(), k_max.end());
        std::fill(stopped_.begin(), stopped_.end(), 0);
        catch_up(seqs, k_max);
        for (int j = 0; j < k_top; ++j) {
            d_.clear_batch();
            bool any = false;
            for (int s = 0; s < n_seq; ++s) {
                if (k_max[s] <= j || stopped_[s]) continue;
                any = true;
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
            if (!any) break;  // every sequence stopped early
            d_.decode("draft");
            for (int s = 0; s < n_seq; ++s) {
                if (k_max[s] <= j || stopped_[s]) continue;
                const float* logits = d_.logits(row_[s]);
                if (p_.draft_p_min > 0.0f && top1_prob_top10(logits, d_.n_vocab) < p_.draft_p_min) {
                    stopped_[s] = 1;  // checked before the token is added, as llama.cpp does
                    continue;
                }
                int32_t token;
                if (p_.temperature > 0.0f) {
                    softmax_norm(logits, d_.n_vocab, p_.draft_temperature > 0.0f ? p_.draft_temperature : p_.temperature,
                                 norm_);
                    const int64_t index = seqs[s].next_index() + j;
                    token = sample_softmax(logits, d_.n_vocab, norm_, keyed_uniform(p_.seed, seqs[s].key, index, Stream::draft));
                    if (keep_q_) {
                        std::vector<float>& qj = q[s][j];  // kept whole: a rejection's residual needs it
                        softmax(logits, d_.n_vocab, norm_, qj);
                        qj.resize(vocab_, 0.0f);
                    }
                } else {
                    token = argmax(logits, d_.n_vocab);  // the draft needs no margin
                }
                drafts[s].push_back(token);
            }
        }
    }

    // The draft cache holds pending and drafts 1..drafted-1 (the last draft was never fed), or,
    // when the p_min rule stopped the draft early, pending and drafts 1..drafted (the position
    // that failed the check was computed from the last draft).
    void accept(Engine::Sequence& seq, const RoundOutcome& o) override {
        if (o.drafted == 0) {
            // the draft did not run (pending is still in draft_todo), or it ran and stopped at
            // the first position (draft_todo was fed: the cache ends at pending)
        } else if (o.accepted < o.drafted) {
            seq.n_past_draft = o.pos0 + 1 + o.accepted + std::max(o.stale, 0);
            d_.remove_from(seq.id, seq.n_past_draft);
        } else if (!stopped_[seq.id]) {  // a stopped draft fed its last token already
            seq.draft_todo.push_back(o.last_draft);
        }
        if (!o.stopped_on_eog) seq.draft_todo.push_back(o.correction);
    }

private:
    // A sequence that drafted nothing for some rounds (a spec policy's k = 0) has one emitted token
    // per such round to catch up on: all but its last two go in draft batches of their own first,
    // so that the first draft position's batch keeps at most two rows per sequence, as every round
    // of a fixed k has.
    void catch_up(std::vector<Engine::Sequence>& seqs, const std::vector<int>& k_max) {
        const ScopedMs timer(catch_up_ms_);
        d_.clear_batch();
        for (size_t s = 0; s < seqs.size(); ++s) {
            std::vector<int32_t>& todo = seqs[s].draft_todo;
            if (k_max[s] <= 0 || todo.size() <= 2) continue;
            const size_t early = todo.size() - 2;
            for (size_t i = 0; i < early; ++i) {
                d_.add(todo[i], seqs[s].n_past_draft++, seqs[s].id, false);
                if (d_.batch_full()) {
                    d_.decode("draft catch-up");
                    d_.clear_batch();
                }
            }
            todo.erase(todo.begin(), todo.begin() + static_cast<std::ptrdiff_t>(early));
        }
        if (d_.batch.n_tokens > 0) d_.decode("draft catch-up");
    }

    // Prompt tokens [from, to) into draft sequence `seq` at their positions, in batches of at most
    // n_batch (no logits: drafting starts from the pending token).
    void feed(const std::vector<int32_t>& prompt, size_t from, size_t to, int seq) {
        d_.clear_batch();
        for (size_t i = from; i < to; ++i) {
            d_.add(prompt[i], static_cast<int32_t>(i), seq, false);
            if (d_.batch_full()) {
                d_.decode("draft prefill");
                d_.clear_batch();
            }
        }
        if (d_.batch.n_tokens > 0) d_.decode("draft prefill");
    }

    int shared_ = 0;              // serving's shared prefix (share_prefix), 0: none
    int holder_ = -1;             // the draft sequence that keeps it
    bool holder_filled_ = false;
    Engine::Context& d_;
    DraftPrefill prefill_;
    const GenerateParams& p_;
    int vocab_;
    bool keep_q_;  // the rule reads q (draft_dists_read): its table is written per drafted token
    std::vector<int> row_;
    SoftmaxNorm norm_;  // scratch: the draft softmax being sampled
    // By sequence (index = id): the p_min rule ended this round's draft, after its last draft
    // token was fed to compute the position that failed the check.
    std::vector<char> stopped_;
    double catch_up_ms_ = 0.0;  // catch_up's decodes, all rounds so far
};

}  // namespace

std::unique_ptr<Drafter> make_model_drafter(Engine::Context& draft, const DraftPrefill& prefill,
                                            const GenerateParams& p, int target_vocab, int n_seq) {
    return std::make_unique<ModelDrafter>(draft, prefill, p, target_vocab, n_seq);
}

}  // namespace specnative
