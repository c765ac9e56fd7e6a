#include "acceptor.h"

#include "engine_internal.h"

namespace specnative {

int32_t Acceptor::target_token(const TargetDraw& d) const {
    return sample_target(d.logits, d.n_vocab, d.p, d.key, d.index, d.margins, d.norm);
}

int32_t Acceptor::judge_draft(const float* logits, int n_vocab, int vocab, const GenerateParams& p, uint64_t key,
                              int64_t index, const std::vector<float>& q_i, int32_t x, AcceptScratch& scratch) const {
    // p(x) alone decides an acceptance; the whole of p only a rejection's residual
    softmax_norm(logits, n_vocab, p.temperature, scratch.norm);
    const float p_x = x < n_vocab ? softmax_prob(logits, scratch.norm, x) : 0.0f;
    if (keep(keyed_uniform(p.seed, key, static_cast<uint64_t>(index), Stream::accept), p_x, q_i[x])) return x;
    softmax(logits, n_vocab, scratch.norm, scratch.p_probs);
    scratch.p_probs.resize(vocab, 0.0f);  // zero beyond the target's vocabulary
    return residual(scratch.p_probs.data(), q_i.data(), vocab,
                    keyed_uniform(p.seed, key, static_cast<uint64_t>(index), Stream::residual), scratch.residual);
}

}  // namespace specnative
