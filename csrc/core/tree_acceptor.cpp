#include "tree_acceptor.h"

#include <algorithm>
#include <cmath>

#include "engine_internal.h"

namespace specnative {

void TreeAcceptor::update_residual(std::vector<float>& r, const std::vector<float>& q, double scale,
                                   const int32_t* drawn, int n_drawn) const {
    // q_i is zero at the siblings drawn before: their residual stays as it was
    float kept[16];
    const int n_kept = std::min(n_drawn, 16);
    for (int j = 0; j < n_kept; ++j) kept[j] = r[drawn[j]];
    const float s = static_cast<float>(scale);
    const size_t n = std::min(r.size(), q.size());
    for (size_t v = 0; v < n; ++v) r[v] = std::max(0.0f, r[v] - q[v] * s);
    for (int j = 0; j < n_kept; ++j) r[drawn[j]] = kept[j];
}

NodeVerdict TreeAcceptor::judge(const NodeToJudge& node, int n_vocab, int vocab, const GenerateParams& p,
                                AcceptRule rule, uint64_t key, std::vector<float>& margins,
                                TreeScratch& scratch) const {
    const std::vector<int32_t>& ch = node.children;
    const int m = static_cast<int>(ch.size());
    NodeVerdict v;
    if (rule != AcceptRule::rejection || m == 0 || node.q == nullptr) {
        // greedy and match, and every leaf's bonus: the target's own token, kept if it is a child
        v.token = sample_target(node.logits, n_vocab, p, key, node.index, margins, scratch.norm);
        for (int j = 0; j < m; ++j) {
            if (ch[j] == v.token) {
                v.rank = j;
                break;
            }
        }
        return v;
    }
    if (p.record_margins) margins.push_back(argmax_with_margin(node.logits, n_vocab).margin);
    const std::vector<float>& q = *node.q;
    softmax_norm(node.logits, n_vocab, p.temperature, scratch.norm);
    bool table = false;  // r as a table only once a sibling was rejected
    double r_sum = 1.0;
    double before = 0.0;  // q's mass of the siblings drawn before step i (in draw order)
    for (int i = 0; i < m; ++i) {
        const int32_t x = ch[sibling_at(i)];
        bool drawn_before = false;
        for (int j = 0; j < i; ++j) drawn_before |= ch[j] == x;
        const double rest = 1.0 - before;
        const float q_x = sibling_q(q, x, rest, drawn_before);
        const float r_x = table ? static_cast<float>(scratch.r[x] / r_sum)
                                : (x < n_vocab ? softmax_prob(node.logits, scratch.norm, x) : 0.0f);
        const double u_accept =
            keyed_uniform(p.seed, key, sibling_position(node.index, uniform_step(i)), Stream::accept);
        if (draft_accepted(u_accept, r_x, q_x)) {
            v.rank = sibling_at(i);
            v.token = x;
            return v;
        }
        if (!table) {
            softmax(node.logits, n_vocab, scratch.norm, scratch.r);
            scratch.r.resize(vocab, 0.0f);
            table = true;
        }
        update_residual(scratch.r, q, rest > 0.0 ? 1.0 / rest : 0.0, ch.data(), i);
        r_sum = 0.0;
        for (float w : scratch.r) r_sum += w;
        if (r_sum > 0.0) {  // r_i = norm(max(0, r_{i-1} - q_i)): the next sibling is weighed against it
            const float inv = static_cast<float>(1.0 / r_sum);
            for (float& w : scratch.r) w *= inv;
            r_sum = 1.0;
        }
        before += q[ch[i]];
    }
    const double u = keyed_uniform(p.seed, key, static_cast<uint64_t>(node.index), Stream::residual);
    if (r_sum > 0.0) {
        v.token = sample_from_weights(scratch.r.data(), vocab, u);
    } else {  // no residual mass left (rounding): p itself
        v.token = sample_softmax(node.logits, n_vocab, scratch.norm, u);
    }
    return v;
}

}  // namespace specnative
