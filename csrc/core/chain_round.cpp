// A chain as a round's proposal (round.h): up to k drafted tokens per sequence, placed after its
// pending token as consecutive rows of the verify batch under its own sequence id; the walk goes
// down them until the first rejection, and the rollback drops the rejected tail's cells.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "acceptor.h"
#include "drafter.h"
#include "round.h"
#include "sampling.h"
#include "synthetic.h"

namespace specnative {

namespace {
// The rejection rule's evidence at draft position i (DecisionPoint), by code of its own: p in
// double precision from the position's verify row `logits`, q the distribution that proposed x.
// `correction`: the token the round emitted in x's place (-1: x was kept, or an EOG ended the
// round). `p` is scratch for the target's probabilities.
DecisionPoint decision_point(const float* logits, int32_t n_vocab, float temperature, const std::vector<float>& q,
                             int32_t x, int32_t correction, std::vector<double>& p) {
    const double inv_t = 1.0 / static_cast<double>(temperature);
    double max_logit = -INFINITY;
    for (int32_t v = 0; v < n_vocab; ++v) max_logit = std::max(max_logit, static_cast<double>(logits[v]));
    double sum = 0.0;
    p.assign(std::max<size_t>(static_cast<size_t>(n_vocab), q.size()), 0.0);  // zero beyond either vocabulary
    for (int32_t v = 0; v < n_vocab; ++v) sum += p[v] = std::exp((logits[v] - max_logit) * inv_t);
    for (int32_t v = 0; v < n_vocab; ++v) p[v] /= sum;
    const auto q_of = [&](size_t v) { return v < q.size() ? static_cast<double>(q[v]) : 0.0; };
    DecisionPoint d;
    const double p_x = p[x], q_x = q_of(x);
    // x was drawn from q, so q(x) > 0; were it 0, the rule's test u * q(x) < p(x) keeps any x with p(x) > 0
    d.accept_prob = q_x > 0.0 ? std::min(1.0, p_x / q_x) : (p_x > 0.0 ? 1.0 : 0.0);
    d.accepted = correction < 0;
    if (d.accepted) return d;
    const auto r = [&](size_t v) { return std::max(0.0, p[v] - q_of(v)); };
    double total = 0.0;
    for (size_t v = 0; v < p.size(); ++v) total += r(v);
    if (!(total > 0.0)) return d;  // no residual mass: nothing to place the correction in
    const size_t c = static_cast<size_t>(correction);
    const double r_c = c < p.size() ? r(c) : 0.0;
    double ahead = 0.0;
    for (size_t v = 0; v < p.size(); ++v) {
        const double r_v = r(v);
        if (r_v > r_c || (r_v == r_c && v < c)) ahead += r_v;
    }
    d.residual_ahead = ahead / total;
    d.residual_prob = r_c / total;
    return d;
}

class ChainProposals final : public Proposals {
public:
    ChainProposals(Engine::Context& target, const Acceptor& rule, std::unique_ptr<Drafter> drafter,
                   const GenerateParams& p, int n_seq, bool reads_target)
        : t_(target), rule_(rule), drafter_(std::move(drafter)), p_(p), reads_(reads_target), drafts_(n_seq),
          q_(n_seq, std::vector<std::vector<float>>(std::max(p.k, 1))), row_(n_seq) {}

    bool reads_target() const override { return reads_; }
    void read_prefill(const llama_batch& batch) override { drafter_->after_target_decode(batch); }
    void reset_counts(SeqCounts& counts) const override { specnative::reset_counts(counts, p_.k); }
    void begin(std::vector<Engine::Sequence>& seqs, int shared_prefix) override {
        drafter_->begin(seqs, shared_prefix);
    }
    void admit(Engine::Sequence& seq) override { drafter_->admit(seq); }
    void share_prefix(int length, int holder) override { drafter_->share_prefix(length, holder); }
    void release(const Engine::Sequence& seq) override {
        t_.remove_from(seq.id, 0);
        drafter_->release(seq);
    }

    // k, less near the sequence's n_predict.
    int budget(const Engine::Sequence& seq) const override {
        return std::min<int>(p_.k, seq.n_predict - static_cast<int>(seq.out.size()) - 1);
    }
    // Up to budget[s] tokens each; what came back (0..budget[s]) is verified.
    void draft(std::vector<Engine::Sequence>& seqs, const std::vector<int>& budget) override {
        for (auto& d : drafts_) d.clear();
        drafter_->draft(seqs, budget, drafts_, q_);
    }
    void place(const Engine::Sequence& seq, int s) override {
        row_[s] = t_.add(seq.pending(), seq.n_past_target, seq.id, true);
        const std::vector<int32_t>& d = drafts_[s];
        for (size_t j = 0; j < d.size(); ++j) {
            t_.add(d[j], seq.n_past_target + 1 + static_cast<int32_t>(j), seq.id, true);
        }
    }
    void read_verify(const llama_batch& batch, int /*first_prompt_row*/) override {
        drafter_->after_target_decode(batch);  // a hidden-state drafter reads the verify's features
    }
    void accept(Engine::Sequence& seq, int s) override { judge(seq, drafts_[s], q_[s], row_[s]); }
    double library_ms() const override { return drafter_->library_ms(); }
    double catch_up_ms() const override { return drafter_->catch_up_ms(); }

private:
    void judge(Engine::Sequence& seq, const std::vector<int32_t>& drafts, const std::vector<std::vector<float>>& q,
               int row);
    void record_pit(Engine::Sequence& seq, const std::vector<int32_t>& drafts,
                    const std::vector<std::vector<float>>& q, int row, int64_t base_index, int accepted, int32_t last);

    Engine::Context& t_;
    const Acceptor& rule_;
    std::unique_ptr<Drafter> drafter_;
    const GenerateParams& p_;
    const bool reads_;
    std::vector<std::vector<int32_t>> drafts_;
    DraftDists q_;  // q_[s][j]: the draft distribution that proposed draft j+1 of sequence s
    std::vector<int> row_;
    AcceptScratch scratch_;
};

// Judges one sequence's drafts against the target's verify logits (batch rows row..row+drafted):
// walks them under the acceptance rule, counts, rolls the rejected tail out of the target's
// cache, tells the drafter, and emits the accepted drafts plus the correction or bonus token.
void ChainProposals::judge(Engine::Sequence& seq, const std::vector<int32_t>& drafts,
                           const std::vector<std::vector<float>>& q, int row) {
    Engine::Context& t = t_;
    const GenerateParams& p = p_;
    Drafter& drafter = *drafter_;
    AcceptScratch& scratch = scratch_;
    const AcceptRule rule = p.temperature > 0.0f ? p.rule : AcceptRule::greedy;  // all rules agree at T = 0
    const int vocab = drafter.n_vocab();  // p and q are zero-padded to a common size
    const int drafted = static_cast<int>(drafts.size());
    SoftmaxNorm& norm = scratch.norm;
    const int64_t base_index = seq.next_index();  // index of the token after pending
    const int32_t pos0 = seq.n_past_target;       // position of pending in both caches
    int accepted = 0;
    bool stopped_on_eog = false;
    int32_t correction = -1;
    const Acceptor& rule_of = rule_;
    for (int i = 0; i <= drafted; ++i) {
        const float* logits = t.logits(rule_of.verify_row(row, i, drafted));
        const int64_t index = base_index + i;
        const TargetDraw draw{logits, t.n_vocab, p, seq.key, index, seq.margins, norm};
        if (i == drafted) {  // every draft accepted: bonus token from p
            correction = rule_of.bonus(draw, i > 0 ? &q[i - 1] : nullptr, i > 0 ? drafts[i - 1] : -1);
            break;
        }
        const int32_t x = drafts[i];
        int32_t target_token;
        bool synthetic_reject = false;
        if (!p.synthetic.empty()) {  // synthetic acceptance: a keyed draw keeps x, else the target's own token
            synthetic_reject = !synthetic_keep(p, t.vocab, seq.key, index, i, x);
            target_token = synthetic_reject ? rule_of.target_token(draw) : x;
        } else if (rule == AcceptRule::rejection) {
            if (p.record_margins) seq.margins.push_back(argmax_with_margin(logits, t.n_vocab).margin);
            target_token = rule_of.judge_draft(logits, t.n_vocab, vocab, p, seq.key, index, rule_of.q_of(q, i), x,
                                               scratch);
        } else {  // greedy and match: the target's own (argmax or keyed) sample
            target_token = rule_of.target_token(draw);
        }
        if (synthetic_reject || target_token != x) {
            correction = target_token;
            seq.counts.rejected += 1;
            break;
        }
        seq.counts.accepted_at[i] += 1;
        accepted += 1;
        seq.out.push_back(x);
        if (finished(seq, p, t.vocab)) {  // an accepted EOG ends the sequence
            stopped_on_eog = true;
            break;
        }
    }
    if (p.record_pit && rule == AcceptRule::rejection) {
        record_pit(seq, drafts, q, row, base_index, accepted, stopped_on_eog ? -1 : correction);
    }
    for (int j = 0; j < drafted; ++j) seq.counts.drafted_at[j] += 1;
    seq.counts.drafted += drafted;
    seq.counts.accepted += accepted;
    seq.counts.rounds += 1;
    seq.counts.accept_len_hist[accepted] += 1;
    seq.counts.emitted += accepted + (stopped_on_eog ? 0 : 1);

    // the target cache keeps pending + the accepted drafts (stale: 0 but for a planted fault)
    const int stale = rule_of.stale_cells(accepted, drafted);
    seq.n_past_target = pos0 + 1 + accepted + stale;
    t.remove_from(seq.id, seq.n_past_target);  // the rejected tail, if any
    drafter.accept(seq, RoundOutcome{pos0, drafted, accepted, stale, stopped_on_eog,
                                     stopped_on_eog ? -1 : correction, drafted > 0 ? drafts.back() : -1});
    if (stopped_on_eog) {
        seq.done = true;
        return;
    }
    seq.out.push_back(correction);
    seq.done = finished(seq, p, t.vocab);
}

// The round's emitted tokens placed in the p of their own verify rows (independently of how the
// rule used those rows: a fault that reads the wrong row or q shows as a non-uniform PIT): the
// accepted drafts, each under the q it was proposed from, then the correction or bonus token
// (`last`, -1 if an accepted EOG ended the round) under the next draft's q, or none for a bonus.
// And every draft the walk reached, judged apart from the rule (decision_point): the accepted
// ones, then the rejected one (the round's correction `last` in its place) unless all were kept.
void ChainProposals::record_pit(Engine::Sequence& seq, const std::vector<int32_t>& drafts,
                                const std::vector<std::vector<float>>& q, int row, int64_t base_index, int accepted,
                                int32_t last) {
    Engine::Context& t = t_;
    const GenerateParams& p = p_;
    AcceptScratch& scratch = scratch_;
    const int drafted = static_cast<int>(drafts.size());
    for (int i = 0; i <= accepted; ++i) {
        const int32_t x = i < accepted ? drafts[i] : last;
        if (x < 0) break;
        const float* logits = t.logits(row + i);
        softmax_norm(logits, t.n_vocab, p.temperature, scratch.norm);
        softmax(logits, t.n_vocab, scratch.norm, scratch.pit_probs);
        const bool proposed = i < drafted;
        PitPoint pit = pit_point(logits, scratch.pit_probs, t.n_vocab, p.temperature, x,
                                 proposed ? q[i].data() : nullptr, proposed ? static_cast<int32_t>(q[i].size()) : 0);
        pit.index = base_index + i;
        seq.pit.push_back(pit);
    }
    const int reached = std::min(drafted, accepted + (last >= 0 ? 1 : 0));
    std::vector<double>& probs = scratch.decision_probs;
    for (int i = 0; i < reached; ++i) {
        DecisionPoint d = decision_point(t.logits(row + i), t.n_vocab, p.temperature, q[i], drafts[i],
                                         i < accepted ? -1 : last, probs);
        d.index = base_index + i;
        seq.decisions.push_back(d);
    }
}

}  // namespace

std::unique_ptr<Proposals> make_chain_proposals(Engine::Context& target, const Acceptor& rule,
                                                std::unique_ptr<Drafter> drafter, const GenerateParams& p, int n_seq,
                                                bool reads_target) {
    return std::make_unique<ChainProposals>(target, rule, std::move(drafter), p, n_seq, reads_target);
}

}  // namespace specnative
