// The spec policy (PolicyParams in engine.h): before each round's draft it caps every decoding
// sequence's budget to the draft length it chooses; after the round it sees what the round cost
// and what each sequence accepted. The round loop (round_loop.cpp) and serving (serve_loop.cpp)
// call it; chains only. Not part of the public API.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine.h"
#include "engine_internal.h"

namespace specnative {

// What one round cost (ms), as the loop's step timers charged it.
struct RoundCost {
    int rows = 0;           // target rows verified; 0 where prompt chunks rode along (serving)
    double draft_ms = 0;    // the draft phase (a draft model's catch-up on emitted tokens included)
    double verify_ms = 0;   // the target's verify decode
    double other_ms = 0;    // reading features, accepting, resampling
};

// The round's cost from the step timers before and after it; `rows` as RoundCost's.
inline RoundCost round_cost(const StepTimes& before, const StepTimes& after, int rows) {
    return RoundCost{rows, after.draft - before.draft, after.verify - before.verify,
                     after.draft_ingest - before.draft_ingest + after.resample - before.resample};
}

class SpecPolicy {
public:
    virtual ~SpecPolicy() = default;
    // Once, before the first round, with the sequences that decode (generate) or none yet (serve):
    // an adaptive policy times the target's decode at the row counts it will choose between.
    virtual void start(Engine::Context& /*target*/, const std::vector<Engine::Sequence>& /*seqs*/) {}
    virtual bool measures_at_start() const { return false; }
    // Caps budget[s] (>= 0: sequence s decodes this round) to its draft length for this round and
    // records it in the sequence's k_chosen_hist. `decoding`: sequences with budget >= 0.
    void decide(std::vector<Engine::Sequence>& seqs, std::vector<int>& budget, int decoding);
    // After every sequence's accept of the round that `budget` allowed.
    virtual void observe(const std::vector<Engine::Sequence>& /*seqs*/, const std::vector<int>& /*budget*/,
                         const RoundCost& /*cost*/) {}
    virtual bool is_static() const { return false; }

protected:
    virtual void cap(std::vector<Engine::Sequence>& seqs, std::vector<int>& budget, int decoding) = 0;
};

// The adaptive policy's arithmetic, apart for tests. E(0..k): the expected tokens a chain of
// 0..k emits, from the acceptance at each position given the earlier ones were kept.
std::vector<double> expected_tokens(const std::vector<double>& acceptance);
// The draft lengths k_s (0..budget[s]; 0 where budget[s] < 0) that maximise
// sum_s expect[s][k_s] / cost_ms(sum_s (k_s + 1) rows, max_s k_s).
std::vector<int> best_lengths(const std::vector<std::vector<double>>& expect, const std::vector<int>& budget,
                              const std::function<double(int rows, int depth)>& cost_ms);

// The policy `params` names, for chains of at most k_max tokens over n_slots sequence slots.
std::unique_ptr<SpecPolicy> make_policy(const PolicyParams& params, int k_max, int n_slots);

// Checks a policy's parameters (std::invalid_argument naming what is wrong).
void check_policy(const PolicyParams& params, int k_max, bool tree);

}  // namespace specnative
