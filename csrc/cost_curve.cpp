// The verify-cost curve: what one target decode costs with 1..k_max+1 positions per sequence at a
// cell's prompts and concurrency (a verify batch with k drafts has k+1), and what one draft
// position costs (one token per sequence through the draft model). These are the ingredients of
// the predicted speedup at every k <= k_max (pick_k.py) from one measurement at k_max.
//
// Each shape is timed `repeats` times and the median kept; Context::decode waits for the device
// (llama_synchronize) before the clock stops, and every timed batch is rolled back
// (llama_memory_seq_rm) so that all of them see the same context: the prompts.
#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "engine.h"
#include "engine_internal.h"

namespace specnative {

namespace {

double median_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median wall time of `repeats` decodes of `positions` tokens per sequence placed after each
// prompt (every row asks for logits, as a verify batch does); the cache is rolled back to the
// prompts after each. The tokens are the prompt's last one repeated: cost does not depend on ids.
double time_decode(Engine::Context& c, const std::vector<std::vector<int32_t>>& prompts, int positions,
                   int repeats, const char* what) {
    std::vector<double> ms;
    for (int r = 0; r < repeats; ++r) {
        c.clear_batch();
        for (size_t s = 0; s < prompts.size(); ++s) {
            const int32_t n_past = static_cast<int32_t>(prompts[s].size());
            for (int i = 0; i < positions; ++i) c.add(prompts[s].back(), n_past + i, static_cast<int>(s), true);
        }
        const auto start = std::chrono::steady_clock::now();
        c.decode(what);  // synchronizes
        const auto stop = std::chrono::steady_clock::now();
        ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
        for (size_t s = 0; s < prompts.size(); ++s) {
            llama_memory_seq_rm(c.memory(), static_cast<llama_seq_id>(s), static_cast<int32_t>(prompts[s].size()), -1);
        }
    }
    return median_of(ms);
}

}  // namespace

CostCurve Engine::cost_curve(const std::vector<std::vector<int32_t>>& prompts, int k_max, int repeats) {
    if (k_max < 1) throw std::invalid_argument("k_max must be at least 1");
    if (repeats < 1) throw std::invalid_argument("repeats must be at least 1");
    GenerateParams p;  // the cells a round at k_max holds, checked as generate() checks them
    p.n_predict = 1;
    p.spec = draft_ != nullptr;
    p.k = k_max;
    if (static_cast<int64_t>(prompts.size()) * (static_cast<int64_t>(k_max) + 1) > params_.n_batch) {
        throw std::invalid_argument("k_max=" + std::to_string(k_max) + " is too large: " +
                                    std::to_string(prompts.size()) + " sequences x (k_max+1) positions exceed n_batch=" +
                                    std::to_string(params_.n_batch));
    }
    const int shared = validate(prompts, p);
    last_pending_.clear();  // the KV state is the curve's from here on
    last_n_past_.clear();

    std::vector<Sequence> seqs(prompts.size());
    for (size_t s = 0; s < prompts.size(); ++s) {
        seqs[s].id = static_cast<int>(s);
        seqs[s].prompt = prompts[s];
    }
    CostCurve curve;
    curve.n_seq = static_cast<int>(prompts.size());
    curve.repeats = repeats;
    Context& t = *target_;
    prefill(t, seqs, shared, [](Sequence&, const float*) {});
    time_decode(t, prompts, 1, 1, "cost curve warm-up");  // first decode of a shape allocates
    for (int n = 1; n <= k_max + 1; ++n) curve.verify_ms.push_back(time_decode(t, prompts, n, repeats, "cost curve"));
    if (draft_ != nullptr) {
        prefill(*draft_, seqs, shared, {});
        time_decode(*draft_, prompts, 1, 1, "cost curve warm-up");
        curve.draft_ms_per_pos = time_decode(*draft_, prompts, 1, repeats, "cost curve (draft)");
    }
    return curve;
}

}  // namespace specnative
