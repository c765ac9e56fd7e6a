#include "common_loop.h"

#ifdef SPECNATIVE_HAVE_COMMON
#include <stdexcept>

#include "phase_clock.h"

namespace specnative {

CommonSpeculativeDrafter::CommonSpeculativeDrafter(const GenerateParams& p, int n_seq, int target_vocab)
    : p_(p), vocab_(target_vocab), history_(n_seq), synced_(n_seq, 0), result_(n_seq) {}

void CommonSpeculativeDrafter::init(common_params_speculative& cparams, int n_seq, const std::string& what) {
    const ScopedMs timer(library_ms_);
    spec_.reset(common_speculative_init(cparams, static_cast<uint32_t>(n_seq)));
    if (!spec_) throw std::runtime_error("llama.cpp could not set up the drafter " + what);
}

void CommonSpeculativeDrafter::start(const Engine::Sequence& seq) {
    history_[seq.id] = seq.prompt;
    synced_[seq.id] = 0;
    const ScopedMs timer(library_ms_);
    common_speculative_begin(spec_.get(), seq.id, history_[seq.id]);
}

void CommonSpeculativeDrafter::forget(const Engine::Sequence& seq) {
    history_[seq.id].clear();
    synced_[seq.id] = 0;
}

void CommonSpeculativeDrafter::draft(std::vector<Engine::Sequence>& seqs, const std::vector<int>& k_max,
                                     std::vector<std::vector<int32_t>>& drafts, DraftDists& q) {
    for (size_t s = 0; s < seqs.size(); ++s) {
        Engine::Sequence& seq = seqs[s];
        common_speculative_draft_params& dp = common_speculative_get_draft_params(spec_.get(), seq.id);
        dp.drafting = false;
        if (k_max[s] < 1) continue;
        llama_tokens& history = history_[seq.id];
        for (; synced_[seq.id] + 1 < seq.out.size(); ++synced_[seq.id]) history.push_back(seq.out[synced_[seq.id]]);
        result_[seq.id].clear();
        dp.drafting = true;
        dp.n_max = k_max[s];  // llama.cpp truncates the proposal to this
        dp.pos0 = seq.n_past_target;
        dp.id_last = seq.pending();
        dp.prompt = &history;
        dp.result = &result_[seq.id];
    }
    {
        const ScopedMs timer(library_ms_);
        common_speculative_draft(spec_.get());
        after_draft(seqs, k_max);
    }
    for (size_t s = 0; s < seqs.size(); ++s) {
        if (k_max[s] < 1) continue;
        for (llama_token token : result_[seqs[s].id]) {
            // a static cache made with another tokenizer can hold ids the target lacks
            if (static_cast<int>(drafts[s].size()) == k_max[s] || token < 0 || token >= vocab_) break;
            drafts[s].push_back(token);
        }
        if (draft_dists_read(p_)) {  // a deterministic proposal (the top candidate): q is one-hot
            for (size_t j = 0; j < drafts[s].size(); ++j) {
                q[s][j].assign(vocab_, 0.0f);
                q[s][j][drafts[s][j]] = 1.0f;
            }
        }
    }
}

void CommonSpeculativeDrafter::accept(Engine::Sequence& seq, const RoundOutcome& o) {
    const ScopedMs timer(library_ms_);
    common_speculative_accept(spec_.get(), seq.id, static_cast<uint16_t>(o.accepted));
    after_accept(seq);
}

}  // namespace specnative
#endif
