// The common_speculative loop both model-free and hidden-state families share: one
// common_speculative state drafts for every sequence, the way llama-speculative-simple and
// llama-server drive it (common/speculative.h): common_speculative_begin per sequence with its
// prompt, per round common_speculative_get_draft_params + common_speculative_draft for all
// sequences together, common_speculative_accept per sequence. A sequence's history is what the
// target's cache holds: the prompt, then the emitted tokens up to (not including) the pending one.
// The families differ only in how the state is made and what follows a draft or an accept
// (ngram.cpp, hidden.cpp).
#pragma once

#ifdef SPECNATIVE_HAVE_COMMON
#include <string>
#include <vector>

#include "common.h"
#include "drafter.h"
#include "speculative.h"

namespace specnative {

class CommonSpeculativeDrafter : public Drafter {
public:
    int n_vocab() const override { return vocab_; }
    double library_ms() const override { return library_ms_; }
    // Drafts every sequence with k_max[s] >= 1 in one common_speculative_draft call; keeps at
    // most k_max[s] tokens of the target's vocabulary; q one-hot (a deterministic proposal) where it is read.
    void draft(std::vector<Engine::Sequence>& seqs, const std::vector<int>& k_max,
               std::vector<std::vector<int32_t>>& drafts, DraftDists& q) override;
    // common_speculative_accept after every verify (also when nothing was drafted), then the
    // family's own follow-up.
    void accept(Engine::Sequence& seq, const RoundOutcome& outcome) override;

protected:
    CommonSpeculativeDrafter(const GenerateParams& p, int n_seq, int target_vocab);
    // Creates the state for n_seq sequences; `what` names the drafter in the error.
    void init(common_params_speculative& cparams, int n_seq, const std::string& what);
    // A new sequence (or a slot's new request): its history is its prompt.
    void start(const Engine::Sequence& seq);
    // The sequence's history is dropped (the slot's next request starts afresh).
    void forget(const Engine::Sequence& seq);
    // Inside the library timer, right after common_speculative_draft.
    virtual void after_draft(std::vector<Engine::Sequence>& /*seqs*/, const std::vector<int>& /*k_max*/) {}
    // Inside the library timer, right after common_speculative_accept.
    virtual void after_accept(Engine::Sequence& /*seq*/) {}

    common_speculative* state() { return spec_.get(); }
    void release_state() { spec_.reset(); }  // before a family undoes what the state switched on
    double library_ms_ = 0;  // inside common_speculative_* since construction
    const GenerateParams& p_;

private:
    int vocab_;
    common_speculative_ptr spec_;
    std::vector<llama_tokens> history_;  // per sequence id
    std::vector<size_t> synced_;         // emitted tokens already in history_
    std::vector<llama_tokens> result_;   // the proposal llama.cpp writes
};

}  // namespace specnative
#endif
