// The verify-cost curve: what one target decode costs with 1..k_max+1 positions per sequence at a
// cell's prompts and concurrency (a verify batch with k drafts has k+1), and what one draft
// position costs (one token per sequence through the draft model). These are the ingredients of
// the predicted speedup at every k <= k_max (pick_k.py) from one measurement at k_max.
//
// Each shape is timed `repeats` times (interleaved) and the median kept; Context::decode waits for the device
// (llama_synchronize) before the clock stops, and every timed batch is rolled back
// (llama_memory_seq_rm) so that all of them see the same context: the prompts.
#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "engine.h"
#include "engine_internal.h"

namespace specnative {

namespace {

// Wall time of one decode of `positions` tokens per sequence placed after each prompt (every row
// asks for logits, as a verify batch does); the cache is rolled back to the prompts afterwards.
// The tokens are the prompt's last one repeated: the cost does not depend on the ids.
double time_decode(Engine::Context& c, const std::vector<std::vector<int32_t>>& prompts, int positions,
                   const char* what) {
    c.clear_batch();
    for (size_t s = 0; s < prompts.size(); ++s) {
        const int32_t n_past = static_cast<int32_t>(prompts[s].size());
        for (int i = 0; i < positions; ++i) c.add(prompts[s].back(), n_past + i, static_cast<int>(s), true);
    }
    const auto start = std::chrono::steady_clock::now();
    c.decode(what);  // synchronizes
    const auto stop = std::chrono::steady_clock::now();
    for (size_t s = 0; s < prompts.size(); ++s) {
        llama_memory_seq_rm(c.memory(), static_cast<llama_seq_id>(s), static_cast<int32_t>(prompts[s].size()), -1);
    }
    return std::chrono::duration<double, std::milli>(stop - start).count();
}

}  // namespace

double median_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

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
    forget_last_run();  // the KV state is the curve's from here on

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
    if (draft_ != nullptr) prefill(*draft_, seqs, shared, {});
    // Every repeat times every shape once, so that a burst of load elsewhere on the machine
    // lands on all shapes alike instead of on one; each shape keeps its median. The first pass
    // (allocations, cold caches) is not kept.
    const int n_shapes = k_max + 1;
    std::vector<std::vector<double>> verify(n_shapes);
    std::vector<double> draft;
    for (int r = 0; r <= repeats; ++r) {
        for (int n = 1; n <= n_shapes; ++n) {
            const double ms = time_decode(t, prompts, n, "cost curve");
            if (r > 0) verify[n - 1].push_back(ms);
        }
        if (draft_ != nullptr) {
            const double ms = time_decode(*draft_, prompts, 1, "cost curve (draft)");
            if (r > 0) draft.push_back(ms);
        }
    }
    for (const auto& v : verify) curve.verify_ms.push_back(median_of(v));
    if (draft_ != nullptr) curve.draft_ms_per_pos = median_of(draft);
    return curve;
}

}  // namespace specnative
