// The spec policies (spec_policy.h). The adaptive one picks, every round, the draft lengths that
// maximise the batch's expected emitted tokens per millisecond:
//
//   rate(k_1..k_n) = sum_s E_s(k_s) / (other + draft_step * max_s k_s + verify(sum_s (k_s + 1))
//                                      + rebuild where the row count is not the last round's)
//
// E_s(k) = 1 + sum_{j<=k} prod_{i<=j} a_{s,i}: the expected tokens a chain of k emits, from the
// sequence's acceptance at each position given the earlier ones were kept (a_{s,i}: its own
// counts, shrunk to the run's pooled estimate for its task label, itself shrunk to a prior).
// verify(rows) is the target's decode time by rows in the batch, timed at start-up and refined
// from every round; draft_step and other are running means of the round's own timers. The
// search tries one k for the batch (0..k_max), then moves each sequence alone to its best k, so
// one verify batch may hold sequences of different k and k = 0 (that sequence decodes one token).
// A small optimism bonus on a_{s,i}, shrinking with the rounds behind it (the sequence's and its
// pool's), lets a position with few rounds behind it be tried; a sequence switched off by the cost
// stays off.
#include "spec_policy.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

namespace specnative {

namespace {

constexpr double kCostWeight = 0.3; // a round's weight in the verify curve's level
constexpr double kStepWeight = 0.2; // a new round's weight in the draft step's and the rest's means
constexpr int kFirstGap = 8;        // rounds at k = 0 before a sequence's first probe
constexpr int kMaxGap = 256;

class StaticPolicy final : public SpecPolicy {
public:
    bool is_static() const override { return true; }

protected:
    void cap(std::vector<Engine::Sequence>&, std::vector<int>&, int) override {}
};

class ByBatchPolicy final : public SpecPolicy {
public:
    explicit ByBatchPolicy(std::vector<PolicyBand> schedule) : schedule_(std::move(schedule)) {}

protected:
    void cap(std::vector<Engine::Sequence>&, std::vector<int>& budget, int decoding) override {
        for (const PolicyBand& band : schedule_) {
            if (decoding < band.lo || decoding > band.hi) continue;
            for (int& b : budget) {
                if (b >= 0) b = std::min(b, band.k);
            }
            return;
        }
    }

private:
    std::vector<PolicyBand> schedule_;
};

// The target's decode time (ms) by rows in the batch: the start-up timings' shape (linear between
// timed row counts, the nearest two points' slope beyond them) at the rounds' level. A verify inside
// the loop runs after the draft model's decodes, with colder caches than the start-up's decodes
// back to back, so every round's verify rescales the whole curve: its running mean of measured
// over timed, at whatever row count the round had; apart for rounds where no sequence drafted
// (baseline steps, with no draft decode in between).
//
// A decode whose batch has another row count than the decode before it costs more: llama.cpp
// reuses the last graph only for the shape it was built for (a GPU backend's captured graph
// likewise), so a round that changes the row count rebuilds it. The start-up times every row count
// after another one (the rebuild included) and the rebuild apart (rebuild_ms); the curve here is
// the cost with the graph reused, and the policy adds the rebuild where its choice changes the row
// count: a mix of k that changes every round pays it every round, where a fixed k does not.
class RowCost {
public:
    explicit RowCost(int max_rows) : ms_(static_cast<size_t>(max_rows) + 1, -1.0) {}

    void timed(int rows, double ms) {
        if (rows >= 1 && rows < static_cast<int>(ms_.size()) && ms >= 0) ms_[rows] = ms;
    }
    void set_rebuild(double ms) { rebuild_ms_ = std::max(0.0, ms); }
    double rebuild_ms() const { return rebuild_ms_; }
    // `drafted`: the round drafted (a verify after draft decodes), or every sequence decoded one
    // token (a baseline step: no draft decode in between, as warm as the start-up's). `rebuilt`:
    // its row count was not the round's before.
    void observe(int rows, double ms, double weight, bool drafted, bool rebuilt) {
        const double shape = reused(rows);
        const double seen = ms - (rebuilt ? rebuild_ms_ : 0.0);
        if (!(shape > 0) || !(seen > 0)) return;
        double& scale = drafted ? scale_ : step_scale_;
        scale = (1 - weight) * scale + weight * seen / shape;
    }
    // With the graph reused; a changed row count adds rebuild_ms().
    double at(int rows, bool drafted) const { return (drafted ? scale_ : step_scale_) * reused(rows); }
    void load(double scale, double step_scale) { scale_ = scale, step_scale_ = step_scale; }
    double scale() const { return scale_; }
    double step_scale() const { return step_scale_; }

private:
    // The timed cost less the rebuild every start-up timing carried (at least a tenth of it).
    double reused(int rows) const {
        const double timed = curve(rows);
        return std::max(timed - rebuild_ms_, 0.1 * timed);
    }
    double curve(int rows) const {
        const int n = static_cast<int>(ms_.size());
        int lo = std::min(rows, n - 1), hi = std::max(rows, 1);
        while (lo >= 1 && ms_[lo] < 0) --lo;
        while (hi < n && ms_[hi] < 0) ++hi;
        if (lo >= 1 && lo == rows) return ms_[lo];
        if (lo >= 1 && hi < n) return ms_[lo] + (ms_[hi] - ms_[lo]) * (rows - lo) / double(hi - lo);
        if (lo < 1 && hi >= n) return std::numeric_limits<double>::quiet_NaN();  // nothing timed
        const int a = lo >= 1 ? lo : hi;  // the timed point nearest `rows`, then the next one away
        int b = lo >= 1 ? a - 1 : a + 1;
        while (b >= 1 && b < n && ms_[b] < 0) b += lo >= 1 ? -1 : 1;
        const double slope = b >= 1 && b < n ? std::max(0.0, (ms_[a] - ms_[b]) / double(a - b)) : 0.0;
        return std::max(0.0, ms_[a] + slope * (rows - a));
    }

    std::vector<double> ms_;  // start-up timings by rows, each after another row count; -1: not timed
    double rebuild_ms_ = 0.0; // what a changed row count adds (start-up: after another count less again)
    double scale_ = 1.0;      // the drafting rounds' verify over the timings
    double step_scale_ = 1.0; // the rounds without a draft: over the timings
};

class AdaptivePolicy final : public SpecPolicy {
public:
    // `learned`: an earlier run's under the same settings, where this run starts and what it leaves.
    AdaptivePolicy(const PolicyParams& p, int k_max, int n_slots, PolicyLearned* learned)
        : p_(p), k_(k_max), idle_(n_slots, 0), gap_(n_slots, kFirstGap), own_(n_slots),
          key_(n_slots, std::numeric_limits<uint64_t>::max()), snap_drafted_(n_slots, 0), snap_accepted_(n_slots, 0),
          cost_(n_slots * (k_max + 1)), expect_(n_slots), learned_(learned) {
        if (learned_ == nullptr) return;
        for (const auto& [label, tally] : learned_->pooled) {
            Tally& t = pooled(label);
            for (int i = 0; i < std::min<int>(k_, static_cast<int>(tally.reached.size())); ++i) {
                t.reached[i] = tally.reached[i];
                t.kept[i] = tally.kept[i];
            }
        }
        cost_.load(learned_->verify_scale, learned_->step_scale);
        draft_step_ms_ = learned_->draft_step_ms;
        other_ms_ = learned_->other_ms;
    }
    ~AdaptivePolicy() override {
        if (learned_ == nullptr) return;
        for (const auto& [label, tally] : pooled_) {
            Tally& t = learned_->pooled[label];
            if (t.reached.size() < tally.reached.size()) {  // a longer k than before: its further positions
                t.reached.resize(tally.reached.size(), 0.0);
                t.kept.resize(tally.kept.size(), 0.0);
            }
            for (size_t i = 0; i < tally.reached.size(); ++i) {
                t.reached[i] = tally.reached[i];
                t.kept[i] = tally.kept[i];
            }
        }
        learned_->verify_scale = cost_.scale();
        learned_->step_scale = cost_.step_scale();
        learned_->draft_step_ms = draft_step_ms_;
        learned_->other_ms = other_ms_;
    }

    void start(Engine::Context& t, Engine::Context* draft, const std::vector<Engine::Sequence>& seqs) override;
    bool measures_at_start() const override { return true; }
    void observe(const std::vector<Engine::Sequence>& seqs, const std::vector<int>& budget,
                 const RoundCost& cost) override;

protected:
    void cap(std::vector<Engine::Sequence>& seqs, std::vector<int>& budget, int decoding) override;

private:
    Tally& pooled(int label) {
        Tally& t = pooled_[label];
        if (t.reached.empty()) t.reset(k_);
        return t;
    }
    // The sequence's acceptance by position into `rates`. The pool's prior at a position is its
    // estimate at the position before (the first one's: prior_alpha), the sequence's the mean of
    // the pool's there and its own before, so that what the first positions measured carries to
    // positions a cautious choice has not drafted yet.
    void acceptance(const Tally& own, const Tally& pool, std::vector<double>& rates) const {
        const double w = p_.prior_weight;
        double pool_prior = p_.prior_alpha, own_before = -1;
        for (int i = 0; i < k_; ++i) {
            const double a_pool = (pool.kept[i] + w * pool_prior) / (pool.reached[i] + w);
            const double own_prior = own_before < 0 ? a_pool : 0.5 * (a_pool + own_before);
            const double a = (own.kept[i] + w * own_prior) / (own.reached[i] + w);
            pool_prior = a_pool;
            own_before = a;
            // the bonus shrinks with every round behind the estimate, the pool's too: a new request
            // of a label the run knows well starts from the pool's estimate, not from a doubt
            const double behind = own.reached[i] + pool.reached[i];
            rates[i] = std::min(1.0, a + p_.optimism * std::sqrt(w / (behind + w)) * std::sqrt(a * (1 - a)));
        }
    }
    void explore(int s, int& k, int budget);
    // The search's draft lengths into budget (cap, once the draft's cost is known).
    void choose(std::vector<Engine::Sequence>& seqs, std::vector<int>& budget, int decoding);
    // The round's draft step and the rest (ms) with n sequences decoding: the running mean at n, else
    // at the nearest n measured; NaN before any round.
    static double by_size(const std::map<int, double>& means, int n) {
        if (means.empty()) return std::numeric_limits<double>::quiet_NaN();
        auto hi = means.lower_bound(n);
        if (hi == means.end()) return std::prev(hi)->second;
        if (hi->first == n || hi == means.begin()) return hi->second;
        auto lo = std::prev(hi);
        return n - lo->first <= hi->first - n ? lo->second : hi->second;
    }
    static void update(std::map<int, double>& means, int n, double value) {
        auto it = means.find(n);
        if (it == means.end()) means[n] = value;  // the first round at this size: its own value
        else it->second = (1 - kStepWeight) * it->second + kStepWeight * value;
    }

    PolicyParams p_;
    int k_;
    std::vector<int> idle_, gap_;  // by slot: rounds at k = 0 in a row, and the rounds before a probe
    std::vector<Tally> own_;       // by slot: the sequence it holds now
    std::vector<uint64_t> key_;    // by slot: that sequence's key (a new key: a new request)
    std::map<int, Tally> pooled_;  // by task label: every sequence of the run so far
    std::vector<int64_t> snap_drafted_, snap_accepted_;  // by slot: counts before the round
    RowCost cost_;
    int last_rows_ = 0;  // the rows the last round verified (0: unknown, prompt chunks rode along)
    std::map<int, double> draft_step_ms_, other_ms_;  // by sequences decoding; none: no round seen yet
    std::vector<std::vector<double>> expect_;  // scratch: E_s(0..k)
    PolicyLearned* learned_;  // the engine's memory for these settings; null: none
};

// Times one target decode of m rows on each of the first n anchors (sequence id, position, token)
// and rolls every anchor's cache back; the caches are as before.
double time_rows(Engine::Context& t, const std::vector<std::tuple<int, int32_t, int32_t>>& anchors, int n, int m) {
    t.clear_batch();
    for (int a = 0; a < n; ++a) {
        const auto& [id, pos, token] = anchors[a];
        for (int i = 0; i < m; ++i) t.add(token, pos + i, id, true);
    }
    const auto begin = std::chrono::steady_clock::now();
    t.decode("spec policy's cost curve");  // synchronizes
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
    for (int a = 0; a < n; ++a) t.remove_from(std::get<0>(anchors[a]), std::get<1>(anchors[a]));
    return ms;
}

// The row counts a round can verify, timed: one sequence with 1..k+1 rows, every sequence with
// m = 1..k+1 rows each, each after a draft decode of one row per sequence (a verify in a round runs
// after the draft's decodes, its caches colder than back to back: on a CPU that changes the curve's
// shape, not only its level). generate(): at the prompts' ends; serve(): on the empty slots from
// position 0 (a prior only: every round refines it at the context it has).
void AdaptivePolicy::start(Engine::Context& t, Engine::Context* draft, const std::vector<Engine::Sequence>& seqs) {
    std::vector<std::tuple<int, int32_t, int32_t>> anchors, draft_anchors;
    for (const auto& seq : seqs) {
        if (seq.done || seq.out.empty()) continue;
        anchors.emplace_back(seq.id, seq.n_past_target, seq.pending());
        draft_anchors.emplace_back(seq.id, seq.n_past_draft, seq.pending());
    }
    if (anchors.empty()) {
        for (int s = 0; s < static_cast<int>(own_.size()); ++s) anchors.emplace_back(s, 0, 0);
        draft_anchors = anchors;
    }
    const int n = static_cast<int>(anchors.size());
    std::vector<std::pair<int, int>> shapes;  // (sequences, rows each)
    for (int m = 1; m <= k_ + 1; ++m) shapes.emplace_back(1, m);
    for (int m = 1; n > 1 && m <= k_ + 1; ++m) shapes.emplace_back(n, m);
    std::vector<std::vector<double>> times(shapes.size());
    for (int r = 0; r <= p_.calibrate_repeats; ++r) {  // the first pass (allocations) is not kept
        for (size_t i = 0; i < shapes.size(); ++i) {
            const auto [seqs_n, m] = shapes[i];
            if (seqs_n * m > t.n_batch) continue;
            if (draft != nullptr) time_rows(*draft, draft_anchors, seqs_n, 1);
            const double ms = time_rows(t, anchors, seqs_n, m);
            if (r > 0) times[i].push_back(ms);
        }
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
        if (!times[i].empty()) cost_.timed(shapes[i].first * shapes[i].second, median_of(times[i]));
    }
    // The rebuild: one sequence step per sequence after two rows each (another graph), then the same
    // step again (its graph reused).
    if (2 * n <= t.n_batch) {
        std::vector<double> extra;
        for (int r = 0; r <= p_.calibrate_repeats; ++r) {
            time_rows(t, anchors, n, 2);
            const double after_other = time_rows(t, anchors, n, 1);
            const double reused = time_rows(t, anchors, n, 1);
            if (r > 0) extra.push_back(after_other - reused);
        }
        cost_.set_rebuild(median_of(extra));
    }
}

void AdaptivePolicy::cap(std::vector<Engine::Sequence>& seqs, std::vector<int>& budget, int decoding) {
    const int n = static_cast<int>(seqs.size());
    int k_top = 0;
    for (int s = 0; s < n; ++s) {
        if (budget[s] < 0) continue;
        if (key_[s] != seqs[s].key) {  // a new sequence in the slot: its own counts start at 0
            key_[s] = seqs[s].key;
            own_[s].reset(k_);
            idle_[s] = 0;
            gap_[s] = kFirstGap;
        }
        snap_drafted_[s] = seqs[s].counts.drafted;
        snap_accepted_[s] = seqs[s].counts.accepted;
        k_top = std::max(k_top, budget[s]);
    }
    if (k_top == 0) return;
    if (draft_step_ms_.empty()) {  // the first round ever drafts one token each: the draft's cost seen before any choice
        for (int& b : budget) b = std::min(b, 1);
    } else {
        choose(seqs, budget, decoding);
    }
}

void AdaptivePolicy::choose(std::vector<Engine::Sequence>& seqs, std::vector<int>& budget, int decoding) {
    const int n = static_cast<int>(seqs.size());
    std::vector<double> rates(k_);  // the sequence's acceptance by position
    for (int s = 0; s < n; ++s) {
        if (budget[s] < 0) continue;
        const Tally& pool = pooled(seqs[s].label);
        acceptance(own_[s], pool, rates);
        expect_[s] = expected_tokens(rates);
    }
    const double draft_step = by_size(draft_step_ms_, decoding), other = by_size(other_ms_, decoding);
    const double rebuild = cost_.rebuild_ms();
    const auto cost_ms = [&](int rows, int depth) {
        return other + draft_step * depth + cost_.at(rows, depth > 0) + (rows != last_rows_ ? rebuild : 0.0);
    };
    std::vector<int> ks = best_lengths(expect_, budget, cost_ms);
    for (int s = 0; s < n; ++s) {
        if (budget[s] < 0) continue;
        if (ks[s] == 0 && budget[s] > 0 && !pays_if_always_kept(expect_, ks, budget, s, cost_ms)) {
            idle_[s] = 0;  // off by the cost alone: no acceptance it could measure would switch it on
            budget[s] = 0;
            continue;
        }
        explore(s, ks[s], budget[s]);
        budget[s] = ks[s];
    }
}

// A sequence the search keeps at k = 0 learns nothing more of its acceptance: after gap_[s] such
// rounds in a row it drafts one token, and the gap doubles (up to kMaxGap) until the search itself
// drafts for it again. A probe costs a draft step and a row; where the draft is as dear as the
// target and always right, it emits two tokens for about two steps' cost, so it costs nothing.
void AdaptivePolicy::explore(int s, int& k, int budget) {
    if (k > 0 || budget == 0) {
        idle_[s] = 0;
        if (k > 0) gap_[s] = kFirstGap;
        return;
    }
    if (++idle_[s] < gap_[s]) return;
    k = 1;
    idle_[s] = 0;
    gap_[s] = std::min(2 * gap_[s], kMaxGap);
}

void AdaptivePolicy::observe(const std::vector<Engine::Sequence>& seqs, const std::vector<int>& budget,
                             const RoundCost& cost) {
    int depth = 0, decoding = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
        if (budget[s] < 0) continue;
        ++decoding;
        const int drafted = static_cast<int>(seqs[s].counts.drafted - snap_drafted_[s]);
        const int accepted = static_cast<int>(seqs[s].counts.accepted - snap_accepted_[s]);
        depth = std::max(depth, drafted);
        Tally& own = own_[s];
        Tally& pool = pooled(seqs[s].label);
        const int reached = std::min(std::min(accepted + 1, drafted), k_);
        for (int i = 0; i < reached; ++i) {
            own.reached[i] += 1;
            pool.reached[i] += 1;
            if (i < accepted) {
                own.kept[i] += 1;
                pool.kept[i] += 1;
            }
        }
    }
    if (cost.rows > 0) cost_.observe(cost.rows, cost.verify_ms, kCostWeight, depth > 0, cost.rows != last_rows_);
    last_rows_ = cost.rows;
    // A draft model's catch-up on tokens it has not seen (rounds at k = 0, a deferred prompt) is
    // timed apart and is not a draft step: a prompt's catch-up priced as one would keep a paying
    // pair off at the batch size where it happened.
    if (depth > 0) update(draft_step_ms_, decoding, std::max(cost.draft_ms - cost.catch_up_ms, 0.0) / depth);
    update(other_ms_, decoding, cost.other_ms);
}

}  // namespace

std::vector<double> expected_tokens(const std::vector<double>& acceptance) {
    std::vector<double> e(acceptance.size() + 1, 1.0);
    double reach = 1.0;
    for (size_t i = 0; i < acceptance.size(); ++i) {
        reach *= acceptance[i];
        e[i + 1] = e[i] + reach;
    }
    return e;
}

// The batch's expected tokens per ms with draft lengths ks (sequences with budget < 0 sit out).
double batch_rate(const std::vector<std::vector<double>>& expect, const std::vector<int>& budget,
                  const std::vector<int>& ks, const std::function<double(int rows, int depth)>& cost_ms) {
    double tokens = 0;
    int rows = 0, depth = 0;
    for (size_t s = 0; s < budget.size(); ++s) {
        if (budget[s] < 0) continue;
        tokens += expect[s][ks[s]];
        rows += ks[s] + 1;
        depth = std::max(depth, ks[s]);
    }
    return tokens / cost_ms(rows, depth);
}

bool pays_if_always_kept(std::vector<std::vector<double>> expect, std::vector<int> ks, const std::vector<int>& budget,
                         int s, const std::function<double(int rows, int depth)>& cost_ms) {
    for (int k = 0; k <= budget[s]; ++k) expect[s][k] = 1.0 + k;
    ks[s] = 0;
    const double off = batch_rate(expect, budget, ks, cost_ms);
    for (int k = 1; k <= budget[s]; ++k) {
        ks[s] = k;
        if (batch_rate(expect, budget, ks, cost_ms) > off) return true;
    }
    return false;
}

// One k for the batch first (0..the largest budget), then each sequence alone to its best k with
// the others held. Returns 0 for a sequence that does not decode; the budgets where no cost is
// known (NaN).
std::vector<int> best_lengths(const std::vector<std::vector<double>>& expect, const std::vector<int>& budget,
                              const std::function<double(int rows, int depth)>& cost_ms) {
    const size_t n = budget.size();
    std::vector<int> ks(n, 0);
    const auto rate = [&] { return batch_rate(expect, budget, ks, cost_ms); };
    const int k_top = *std::max_element(budget.begin(), budget.end());
    double best = -1;
    int best_k = 0;
    for (int k = 0; k <= k_top; ++k) {
        for (size_t s = 0; s < n; ++s) ks[s] = budget[s] < 0 ? 0 : std::min(k, budget[s]);
        const double r = rate();
        if (r > best) best = r, best_k = k;
    }
    if (!(best > 0)) {  // no cost known
        for (size_t s = 0; s < n; ++s) ks[s] = std::max(budget[s], 0);
        return ks;
    }
    for (size_t s = 0; s < n; ++s) ks[s] = budget[s] < 0 ? 0 : std::min(best_k, budget[s]);
    for (size_t s = 0; s < n; ++s) {
        if (budget[s] < 0) continue;
        int keep = ks[s];
        for (int k = 0; k <= budget[s]; ++k) {
            ks[s] = k;
            const double r = rate();
            if (r > best) best = r, keep = k;
        }
        ks[s] = keep;
    }
    return ks;
}

void SpecPolicy::decide(std::vector<Engine::Sequence>& seqs, std::vector<int>& budget, int decoding) {
    cap(seqs, budget, decoding);
    for (size_t s = 0; s < seqs.size(); ++s) {
        std::vector<int64_t>& hist = seqs[s].counts.k_chosen_hist;
        if (budget[s] >= 0 && !hist.empty()) hist[std::min<size_t>(budget[s], hist.size() - 1)] += 1;
    }
}

PolicyMemory* Engine::policy_memory() {
    if (!policy_memory_) policy_memory_ = std::make_shared<PolicyMemory>();
    return policy_memory_.get();
}

// The decoding settings acceptance depends on, as the key of what an adaptive run leaves behind.
std::string memory_key(const GenerateParams& p) {
    std::string key = p.drafter.type;
    for (const auto& [name, value] : p.drafter.options) key += " " + name + "=" + value;
    key += " T=" + std::to_string(p.temperature) + " draft_T=" + std::to_string(p.draft_temperature) +
           " rule=" + std::to_string(static_cast<int>(p.rule)) + " p_min=" + std::to_string(p.draft_p_min);
    for (double a : p.synthetic) key += " " + std::to_string(a);
    return key;
}

std::unique_ptr<SpecPolicy> make_policy(const GenerateParams& p, int n_slots, PolicyMemory* memory) {
    switch (p.policy.kind) {
        case PolicyParams::Kind::by_batch: return std::make_unique<ByBatchPolicy>(p.policy.schedule);
        case PolicyParams::Kind::adaptive: {
            PolicyLearned* learned = memory != nullptr && p.policy.remember ? &memory->by_setting[memory_key(p)] : nullptr;
            return std::make_unique<AdaptivePolicy>(p.policy, p.k, n_slots, learned);
        }
        default: return std::make_unique<StaticPolicy>();
    }
}

void check_policy(const PolicyParams& p, int k_max, bool tree) {
    if (p.kind == PolicyParams::Kind::static_k) return;
    if (tree) {
        throw std::invalid_argument("a spec policy other than static applies to chains: a draft tree drafts its "
                                    "whole shape every round");
    }
    if (p.kind == PolicyParams::Kind::by_batch) {
        if (p.schedule.empty()) throw std::invalid_argument("the by-batch policy needs at least one [lo, hi, k] band");
        for (const PolicyBand& b : p.schedule) {
            const std::string band = "[" + std::to_string(b.lo) + ", " + std::to_string(b.hi) + ", " +
                                     std::to_string(b.k) + "]";
            if (b.lo < 1 || b.hi < b.lo) throw std::invalid_argument("by-batch band " + band + ": need 1 <= lo <= hi");
            if (b.k < 0 || b.k > k_max) {
                throw std::invalid_argument("by-batch band " + band + ": k must be in 0.." + std::to_string(k_max) +
                                            " (the run's k is the most a round drafts)");
            }
        }
        return;
    }
    if (!(p.prior_alpha >= 0.0 && p.prior_alpha <= 1.0)) {
        throw std::invalid_argument("the adaptive policy's prior acceptance must be in [0, 1]");
    }
    if (!(p.prior_weight > 0.0) || !std::isfinite(p.prior_weight)) {
        throw std::invalid_argument("the adaptive policy's prior weight must be a finite number > 0");
    }
    if (p.calibrate_repeats < 1) throw std::invalid_argument("the adaptive policy needs calibrate_repeats >= 1");
    if (!(p.optimism >= 0.0) || !std::isfinite(p.optimism)) {
        throw std::invalid_argument("the adaptive policy's optimism must be a finite number >= 0");
    }
}

}  // namespace specnative
