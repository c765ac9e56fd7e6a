// GenerateResult's derived quantities and the counts' arithmetic (engine.h): the one definition
// of each.
#include <cmath>
#include <vector>

#include "engine.h"

namespace specnative {

SeqCounts GenerateResult::totals() const { return sum_counts(counts); }

SeqCounts sum_counts(const std::vector<SeqCounts>& counts) {
    SeqCounts sum;
    for (const SeqCounts& c : counts) {
        sum.drafted += c.drafted;
        sum.accepted += c.accepted;
        sum.rounds += c.rounds;
        sum.rejected += c.rejected;
        sum.emitted += c.emitted;
        auto add = [](std::vector<int64_t>& into, const std::vector<int64_t>& from) {
            if (into.size() < from.size()) into.resize(from.size(), 0);
            for (size_t i = 0; i < from.size(); ++i) into[i] += from[i];
        };
        add(sum.drafted_at, c.drafted_at);
        add(sum.accepted_at, c.accepted_at);
        add(sum.accept_len_hist, c.accept_len_hist);
        add(sum.offered_rank, c.offered_rank);
        add(sum.accepted_rank, c.accepted_rank);
        add(sum.k_chosen_hist, c.k_chosen_hist);
    }
    return sum;
}

AcceptRates accept_rates(const SeqCounts& c) {
    auto ratio = [](int64_t num, int64_t den) { return den > 0 ? static_cast<double>(num) / den : std::nan(""); };
    return {ratio(c.accepted, c.drafted), ratio(c.accepted, c.accepted + c.rejected), ratio(c.emitted, c.rounds)};
}

double GenerateResult::draft_accept_rate() const { return accept_rates(totals()).draft_accept_rate; }
double GenerateResult::token_accept_rate() const { return accept_rates(totals()).token_accept_rate; }
double GenerateResult::mean_accept_len() const { return accept_rates(totals()).mean_accept_len; }

double GenerateResult::round_ms() const {
    // the spec policy's time in the rounds counts; its one-off start-up is not a round's
    const double rounds_ms = times.draft + times.draft_ingest + times.verify + times.resample + times.policy -
                             times.policy_startup;
    return steps > 0 && speculative ? rounds_ms / steps : std::nan("");
}

double GenerateResult::step_ms() const {
    return steps > 0 && !speculative ? times.decode / steps : std::nan("");
}

double GenerateResult::steady_tps() const {
    return steady_ms > 0 ? steady_tokens / (steady_ms / 1000.0) : std::nan("");
}

double GenerateResult::steady_iteration_ms() const {
    return steady_steps > 0 ? steady_ms / steady_steps : std::nan("");
}

double GenerateResult::steady_tau() const {
    return steady_steps > 0 ? static_cast<double>(steady_tokens) / (static_cast<double>(steady_steps) * n_seq)
                            : std::nan("");
}

double GenerateResult::occupancy() const {
    return steps > 0 ? static_cast<double>(active_sum) / (static_cast<double>(steps) * n_seq) : std::nan("");
}

double GenerateResult::tps() const {
    const double decoding_ms = times.draft + times.draft_ingest + times.verify + times.resample + times.decode;
    return decoding_ms > 0 ? decode_tokens / (decoding_ms / 1000.0) : std::nan("");
}

}  // namespace specnative
