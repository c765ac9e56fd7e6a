// Teacher-forced target passes: the evidence of the lossless verdict.
//
// forced_pass feeds given continuations through the target, `chunk` positions per sequence per
// llama_decode with all sequences in the same batch (chunk 1 is the baseline's shape, k+1 a
// verify batch's), and hands every position's logits to a visitor. On top of it:
//   numeric_noise: the same tokens along two shapes -> how much the target's logits move by
//                  batch shape alone (the control);
//   replay:        a speculative output along the baseline's shape -> at each position, what the
//                  baseline's rule picks and how far the emitted token is from it.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "drafter.h"
#include "engine.h"
#include "engine_internal.h"
#include "sampling.h"

namespace specnative {

void Engine::forced_pass(const std::vector<std::vector<int32_t>>& prompts,
                         const std::vector<std::vector<int32_t>>& forced, int chunk, const ForcedVisit& visit,
                         bool share_prefix) {
    require_open();
    if (forced.size() != prompts.size()) {
        throw std::invalid_argument(std::to_string(prompts.size()) + " prompts but " +
                                    std::to_string(forced.size()) + " forced continuations");
    }
    if (chunk < 1) throw std::invalid_argument("chunk must be at least 1");
    if (static_cast<int64_t>(chunk) * static_cast<int64_t>(prompts.size()) > params_.n_batch) {
        throw std::invalid_argument("chunk " + std::to_string(chunk) + " x " + std::to_string(prompts.size()) +
                                    " sequences exceeds n_batch=" + std::to_string(params_.n_batch));
    }
    size_t longest = 0;
    for (size_t s = 0; s < forced.size(); ++s) {
        if (forced[s].empty()) throw std::invalid_argument("forced continuation " + std::to_string(s) + " is empty");
        for (int32_t t : forced[s]) {
            if (t < 0 || t >= target_->n_vocab) {
                throw std::invalid_argument("forced continuation " + std::to_string(s) + " has token id " +
                                            std::to_string(t) + " outside the vocabulary");
            }
        }
        longest = std::max(longest, forced[s].size());
    }
    GenerateParams p;
    p.n_predict = static_cast<int>(longest);
    const int shared = share_prefix ? validate(prompts, p) : (validate(prompts, p), 0);

    std::vector<Sequence> seqs(prompts.size());
    for (size_t s = 0; s < prompts.size(); ++s) {
        seqs[s].id = static_cast<int>(s);
        seqs[s].prompt = prompts[s];
    }
    forget_last_run();  // the KV state is the replay's from here on
    Context& t = *target_;
    // The prompts' cells and last logits are reused when the cache holds them (a fresh prefill
    // would compute the same); not under a hidden drafter's settings (share_prefix false).
    prefill(t, seqs, shared, [&](Sequence& seq, const float* logits) { visit(seq.id, 0, logits); }, {},
            /*reuse_prompts=*/share_prefix);

    // Token i of a continuation sits at position prompt_len + i; its logits predict index i + 1.
    std::vector<std::pair<int, int64_t>> rows;  // (sequence, index) of each batch row
    for (size_t from = 0; from + 1 < longest; from += chunk) {
        t.clear_batch();
        rows.clear();
        for (size_t s = 0; s < forced.size(); ++s) {
            const size_t end = std::min(from + chunk, forced[s].size() - 1);
            for (size_t i = from; i < end; ++i) {
                t.add(forced[s][i], static_cast<int32_t>(prompts[s].size() + i), static_cast<int>(s), true);
                rows.emplace_back(static_cast<int>(s), static_cast<int64_t>(i + 1));
            }
        }
        if (rows.empty()) continue;
        t.decode("teacher-forced pass");
        for (size_t r = 0; r < rows.size(); ++r) visit(rows[r].first, rows[r].second, t.logits(static_cast<int>(r)));
    }
}

namespace {
// How far logits `b` moved against `a`: over the vocabulary, and over a's candidates (the tokens
// within kCandidateWindow x the full spread of a's maximum).
struct DeltaSpread {
    float max_abs = 0.0f;           // max |a - b|
    float spread = 0.0f;            // max(a - b) - min(a - b): the most any pairwise gap moved
    float candidate_spread = 0.0f;  // the same over the candidates only
};

float spread_above(const float* a, const float* b, size_t n_vocab, float floor) {
    float lo = INFINITY, hi = -INFINITY;
    for (size_t v = 0; v < n_vocab; ++v) {
        if (a[v] < floor) continue;
        const float delta = a[v] - b[v];
        lo = std::min(lo, delta);
        hi = std::max(hi, delta);
    }
    return hi - lo;
}

DeltaSpread delta_spread(const float* a, const float* b, size_t n_vocab) {
    DeltaSpread d;
    float lo = INFINITY, hi = -INFINITY, top = -INFINITY;
    for (size_t v = 0; v < n_vocab; ++v) {
        const float delta = a[v] - b[v];
        d.max_abs = std::max(d.max_abs, std::fabs(delta));
        lo = std::min(lo, delta);
        hi = std::max(hi, delta);
        top = std::max(top, a[v]);
    }
    d.spread = hi - lo;
    d.candidate_spread = spread_above(a, b, n_vocab, top - kCandidateWindow * d.spread);
    return d;
}
}  // namespace

NoiseProbe Engine::numeric_noise(const std::vector<std::vector<int32_t>>& prompts,
                                 const std::vector<std::vector<int32_t>>& forced, int chunk_a, int chunk_b,
                                 const std::string& settings_of, float temperature, uint64_t seed) {
    check_temperature(temperature);
    if (!settings_of.empty()) check_hidden_drafter(settings_of);
    // Pass A's logits are kept whole (positions x vocabulary floats) so that pass B can compare
    // every entry; offsets[s] is where sequence s starts in that buffer.
    std::vector<size_t> offsets(forced.size() + 1, 0);
    for (size_t s = 0; s < forced.size(); ++s) offsets[s + 1] = offsets[s] + forced[s].size();
    require_open();
    const size_t n_vocab = static_cast<size_t>(target_->n_vocab);
    const double gib = static_cast<double>(offsets.back()) * n_vocab * sizeof(float) / (1ull << 30);
    if (gib > 4.0) {
        throw std::invalid_argument("numeric_noise would hold " + std::to_string(gib) +
                                    " GiB of logits; give fewer or shorter continuations");
    }
    std::vector<float> logits_a(offsets.back() * n_vocab);
    forced_pass(prompts, forced, chunk_a, [&](int s, int64_t index, const float* logits) {
        std::copy(logits, logits + n_vocab, logits_a.begin() + (offsets[s] + index) * n_vocab);
    });
    // A pass feeds every token but the last; one more 1-token step on top of the cache it built
    // gives the logits a pending token sees after a run (what pending_logits() reads).
    auto final_step = [&]() {
        Context& t = *target_;
        t.clear_batch();
        for (size_t s = 0; s < forced.size(); ++s) {
            t.add(forced[s].back(), static_cast<int32_t>(prompts[s].size() + forced[s].size() - 1),
                  static_cast<int>(s), true);
        }
        t.decode("noise control: final step");
        std::vector<float> out(forced.size() * n_vocab);
        for (size_t s = 0; s < forced.size(); ++s) {
            std::copy(t.logits(static_cast<int>(s)), t.logits(static_cast<int>(s)) + n_vocab, out.begin() + s * n_vocab);
        }
        return out;
    };
    const std::vector<float> final_a = final_step();

    // Pass B under the drafter's target settings (the drafter is made, never asked for drafts).
    GenerateParams settings_params;
    settings_params.drafter.type = settings_of;
    const std::unique_ptr<Drafter> settings =
        settings_of.empty() ? nullptr
                            : make_hidden_drafter(*hidden_, *target_, settings_params, static_cast<int>(prompts.size()), true);
    NoiseProbe probe;
    SoftmaxNorm norm;
    for (size_t s = 0; s < forced.size(); ++s) {
        probe.final_logits_a.emplace_back(final_a.begin() + s * n_vocab, final_a.begin() + (s + 1) * n_vocab);
    }
    // ... and with the speculative run's cache layout (no shared prefix cells, drafter_hidden.cpp)
    forced_pass(prompts, forced, chunk_b, [&](int s, int64_t index, const float* logits_b) {
        const float* a = logits_a.data() + (offsets[s] + index) * n_vocab;
        const DeltaSpread d = delta_spread(a, logits_b, n_vocab);
        probe.seq.push_back(s);
        probe.index.push_back(static_cast<int32_t>(index));
        probe.max_abs_delta.push_back(d.max_abs);
        probe.spread.push_back(d.spread);
        probe.candidate_spread.push_back(d.candidate_spread);
        probe.argmax_a.push_back(argmax(a, static_cast<int32_t>(n_vocab)));
        probe.argmax_b.push_back(argmax(logits_b, static_cast<int32_t>(n_vocab)));
        if (temperature > 0.0f) {  // the baseline's keyed draw there, on either shape's logits
            const double u = keyed_uniform(seed, s, index, Stream::target);
            const int32_t n = static_cast<int32_t>(n_vocab);
            softmax_norm(a, n, temperature, norm);
            probe.draw_a.push_back(sample_softmax(a, n, norm, u));
            softmax_norm(logits_b, n, temperature, norm);
            probe.draw_b.push_back(sample_softmax(logits_b, n, norm, u));
        }
    }, /*share_prefix=*/settings_of.empty());
    const std::vector<float> final_b = final_step();
    for (size_t s = 0; s < forced.size(); ++s) {
        probe.state_spread.push_back(delta_spread(final_a.data() + s * n_vocab, final_b.data() + s * n_vocab, n_vocab).spread);
    }
    return probe;
}

ReplayCheck Engine::replay(const std::vector<std::vector<int32_t>>& prompts,
                           const std::vector<std::vector<int32_t>>& forced, float temperature, uint64_t seed,
                           const std::vector<uint64_t>& keys) {
    check_temperature(temperature);
    if (!keys.empty() && keys.size() != forced.size()) {
        throw std::invalid_argument("replay: " + std::to_string(keys.size()) + " keys for " +
                                    std::to_string(forced.size()) + " continuations");
    }
    require_open();
    const int32_t n_vocab = target_->n_vocab;
    ReplayCheck check;
    check.final_logits.resize(forced.size());
    std::vector<float> probs;
    SoftmaxNorm norm;
    // One placeholder token per continuation (never fed) makes the pass visit the position after
    // the last emitted token too.
    for (size_t s = 0; s < forced.size(); ++s) {
        if (forced[s].empty()) throw std::invalid_argument("forced continuation " + std::to_string(s) + " is empty");
    }
    std::vector<std::vector<int32_t>> extended = forced;
    for (auto& tokens : extended) tokens.push_back(0);
    forced_pass(prompts, extended, 1, [&](int s, int64_t index, const float* logits) {
        if (index == static_cast<int64_t>(forced[s].size())) {
            check.final_logits[s].assign(logits, logits + n_vocab);
            return;
        }
        const int32_t emitted = forced[s][index];
        int32_t pick;
        if (temperature <= 0.0f) {
            pick = argmax(logits, n_vocab);
        } else {  // the baseline's draw: inverse CDF at the position-keyed uniform
            softmax_norm(logits, n_vocab, temperature, norm);
            softmax(logits, n_vocab, norm, probs);
            const double u = keyed_uniform(seed, keys.empty() ? s : keys[s], index, Stream::target);
            pick = sample_softmax(logits, n_vocab, norm, u);
            // The draw's CDF in vocabulary order
            double below = 0.0, total = 0.0;
            for (int32_t v = 0; v < n_vocab; ++v) {
                if (v == emitted) below = total;
                total += probs[v];
            }
            check.u.push_back(u);
            check.cdf_lo.push_back(below / total);
            check.cdf_hi.push_back((below + probs[emitted]) / total);
        }
        check.seq.push_back(s);
        check.index.push_back(static_cast<int32_t>(index));
        check.emitted.push_back(emitted);
        check.pick.push_back(pick);
        check.gap.push_back(logits[pick] - logits[emitted]);
    });
    return check;
}

}  // namespace specnative
