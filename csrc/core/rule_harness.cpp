#include "rule_harness.h"

#include <stdexcept>
#include <string>

#include "engine_internal.h"
#include "sampling.h"
#include "tree_acceptor.h"

namespace specnative {
namespace {

constexpr int kMaxSiblings = 16;  // TreeAcceptor::update_residual keeps at most 16 drawn siblings

// The rows' shape: depth + 1 target rows and depth q rows of one length, q non-negative with mass.
int checked_vocab(const RuleInputs& in) {
    const size_t depth = in.q.size();
    if (depth == 0 || in.logits.size() != depth + 1) {
        throw std::invalid_argument("logits must have one row more than q (the bonus row), and q at least one row");
    }
    const size_t vocab = in.logits[0].size();
    if (vocab == 0) throw std::invalid_argument("rows must not be empty");
    for (const auto& row : in.logits) {
        if (row.size() != vocab) throw std::invalid_argument("every logits and q row must have the same length");
    }
    for (const auto& row : in.q) {
        if (row.size() != vocab) throw std::invalid_argument("every logits and q row must have the same length");
        double mass = 0.0;
        for (float w : row) {
            if (!(w >= 0.0f)) throw std::invalid_argument("q must be non-negative");
            mass += w;
        }
        if (!(mass > 0.0)) throw std::invalid_argument("every q row must have mass");
    }
    check_temperature(in.temperature);
    if (in.temperature == 0.0f) throw std::invalid_argument("the rule's draws need a temperature > 0");
    if (in.n_draws < 0) throw std::invalid_argument("n_draws must be >= 0");
    return static_cast<int>(vocab);
}

GenerateParams params_of(const RuleInputs& in) {
    GenerateParams p;
    p.temperature = in.temperature;
    p.seed = in.seed;
    p.rule = AcceptRule::rejection;
    return p;
}

}  // namespace

std::vector<int64_t> chain_rule_draws(Fault fault, const RuleInputs& in) {
    const int vocab = checked_vocab(in);
    const int k = static_cast<int>(in.q.size());
    const std::unique_ptr<Acceptor> rule = make_acceptor(fault);
    const GenerateParams p = params_of(in);
    std::vector<int64_t> hist(static_cast<size_t>(k + 1) * vocab, 0);
    std::vector<int32_t> drafts(k);
    std::vector<float> margins;
    AcceptScratch scratch;
    for (int64_t n = 0; n < in.n_draws; ++n) {
        const uint64_t key = static_cast<uint64_t>(n);
        for (int i = 0; i < k; ++i) {
            drafts[i] = sample_from_weights(in.q[i].data(), vocab, keyed_uniform(p.seed, key, i, Stream::draft));
        }
        for (int i = 0; i <= k; ++i) {
            const float* logits = in.logits[rule->verify_row(0, i, k)].data();
            int32_t token;
            if (i == k) {  // every draft kept: the bonus
                token = rule->bonus(TargetDraw{logits, vocab, p, key, i, margins, scratch.norm}, &in.q[k - 1],
                                    drafts[k - 1]);
            } else {
                token = rule->judge_draft(logits, vocab, vocab, p, key, i, rule->q_of(in.q, i), drafts[i], scratch);
            }
            hist[static_cast<size_t>(i) * vocab + token] += 1;
            if (i == k || token != drafts[i]) break;
        }
    }
    return hist;
}

std::vector<int64_t> tree_rule_draws(Fault fault, const RuleInputs& in, int siblings) {
    const int vocab = checked_vocab(in);
    if (siblings < 1 || siblings > kMaxSiblings) {
        throw std::invalid_argument("siblings must be in [1, " + std::to_string(kMaxSiblings) + "]");
    }
    const int depth = static_cast<int>(in.q.size());
    const std::unique_ptr<TreeAcceptor> rule = make_tree_acceptor(fault);
    const GenerateParams p = params_of(in);
    std::vector<int64_t> hist(static_cast<size_t>(depth + 1) * vocab, 0);
    std::vector<int32_t> children;
    std::vector<float> weights, margins;
    TreeScratch scratch;
    for (int64_t n = 0; n < in.n_draws; ++n) {
        const uint64_t key = static_cast<uint64_t>(n);
        for (int d = 0; d <= depth; ++d) {  // the node the walk is at, at depth d (its id: d)
            const bool leaf = d == depth;
            children.clear();
            if (!leaf) {
                weights = in.q[d];
                for (int j = 0; j < siblings; ++j) {
                    const uint64_t pos = static_cast<uint64_t>(d) + (static_cast<uint64_t>(j) << 32);
                    const double u = keyed_uniform(p.seed, key, pos, Stream::draft);
                    const int32_t t = sample_from_weights(weights.data(), vocab, u);
                    if (!(weights[t] > 0.0f)) break;  // q has no mass left
                    children.push_back(t);
                    weights[t] = 0.0f;
                }
            }
            const int row = leaf ? rule->bonus_node(d, d - 1) : d;
            const NodeToJudge node{in.logits[row].data(), children, leaf ? nullptr : &in.q[d], d};
            const NodeVerdict v = rule->judge(node, vocab, vocab, p, AcceptRule::rejection, key, margins, scratch);
            hist[static_cast<size_t>(d) * vocab + v.token] += 1;
            if (v.rank < 0) break;
        }
    }
    return hist;
}

int64_t kernel_draws(const float* p, const float* q, int32_t n, int64_t n_draws, uint64_t seed,
                     std::vector<int64_t>& hist) {
    hist.assign(n, 0);
    int64_t accepted = 0;
    std::vector<float> scratch;
    for (int64_t i = 0; i < n_draws; ++i) {
        const int32_t x = sample_from_weights(q, n, keyed_uniform(seed, i, 0, Stream::draft));
        const RejectionOutcome o = rejection_step(p, q, n, x, keyed_uniform(seed, i, 0, Stream::accept),
                                                  keyed_uniform(seed, i, 0, Stream::residual), scratch);
        hist[o.token] += 1;
        accepted += o.accepted;
    }
    return accepted;
}

}  // namespace specnative
