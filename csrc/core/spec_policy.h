// The spec policy (PolicyParams in engine.h): before each round's draft it caps every decoding
// sequence's budget to the draft length it chooses; after the round it sees what the round cost
// and what each sequence accepted. The round loop (round_loop.cpp) and serving (serve_loop.cpp)
// call it; chains only. Not part of the public API.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine.h"
#include "engine_internal.h"

namespace specnative {

// What one round cost (ms), as the loop's step timers charged it.
struct RoundCost {
    int rows = 0;           // target rows verified; 0 where prompt chunks rode along (serving)
    double draft_ms = 0;    // the draft phase (a draft model's catch-up on emitted tokens included)
    double catch_up_ms = 0; // the part of draft_ms that was that catch-up (no draft step)
    double verify_ms = 0;   // the target's verify decode
    double other_ms = 0;    // reading features, accepting, resampling
};

// The round's cost from the step timers before and after it; `rows` as RoundCost's.
inline RoundCost round_cost(const StepTimes& before, const StepTimes& after, int rows, double catch_up_ms) {
    return RoundCost{rows, after.draft - before.draft, catch_up_ms, after.verify - before.verify,
                     after.draft_ingest - before.draft_ingest + after.resample - before.resample};
}

class SpecPolicy {
public:
    virtual ~SpecPolicy() = default;
    // Once, before the first round, with the sequences that decode (generate) or none yet (serve):
    // an adaptive policy times the target's decode at the row counts it will choose between, each
    // after one decode of the draft model (`draft`; null: a drafter without one), as in a round.
    virtual void start(Engine::Context& /*target*/, Engine::Context* /*draft*/,
                       const std::vector<Engine::Sequence>& /*seqs*/) {}
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

// Acceptance counts by draft position: [i] rounds whose walk reached position i+1, and kept it.
struct Tally {
    std::vector<double> reached, kept;
    void reset(int k) {
        reached.assign(k, 0.0);
        kept.assign(k, 0.0);
    }
};

// What an adaptive run learned that outlives it, for the next run under the same decoding
// settings (its key: drafter, its options, temperatures, acceptance rule).
struct PolicyLearned {
    std::map<int, Tally> pooled;       // by task label: acceptance by position
    double verify_scale = 1.0;         // the drafting rounds' verify over the start-up timings
    double step_scale = 1.0;           // the rounds without a draft, likewise
    std::map<int, double> draft_step_ms, other_ms;  // by sequences decoding in the round
};
struct PolicyMemory {
    std::map<std::string, PolicyLearned> by_setting;
};

// The adaptive policy's arithmetic, apart for tests. E(0..k): the expected tokens a chain of
// 0..k emits, from the acceptance at each position given the earlier ones were kept.
std::vector<double> expected_tokens(const std::vector<double>& acceptance);
// The draft lengths k_s (0..budget[s]; 0 where budget[s] < 0) that maximise
// sum_s expect[s][k_s] / cost_ms(sum_s (k_s + 1) rows, max_s k_s).
std::vector<int> best_lengths(const std::vector<std::vector<double>>& expect, const std::vector<int>& budget,
                              const std::function<double(int rows, int depth)>& cost_ms);

// Whether sequence s, held at k = 0 with the others at ks, would raise the batch's rate at some k
// were every draft of it kept: if not, no acceptance it could measure switches it on, and probing
// it is waste (a draft model as dear as the target, whose catch-up after idle rounds costs more
// than it brings). `expect` and `ks` are copies: the test changes them.
bool pays_if_always_kept(std::vector<std::vector<double>> expect, std::vector<int> ks, const std::vector<int>& budget,
                         int s, const std::function<double(int rows, int depth)>& cost_ms);

// The policy p.policy names, for chains of at most p.k tokens over n_slots sequence slots; an
// adaptive one starts from `memory` (none: from its prior) and leaves what it learned there.
std::unique_ptr<SpecPolicy> make_policy(const GenerateParams& p, int n_slots, PolicyMemory* memory);

// Checks a policy's parameters (std::invalid_argument naming what is wrong).
void check_policy(const PolicyParams& params, int k_max, bool tree);

}  // namespace specnative
