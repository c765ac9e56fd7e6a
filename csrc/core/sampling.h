// Sampling primitives shared by the baseline and the speculative loop: a position-keyed RNG,
// temperature softmax, argmax with the top-2 margin, and the three acceptance rules' kernels.
#pragma once

#include <cstdint>
#include <vector>

namespace specnative {

// Independent random streams. A uniform is a pure function of (seed, sequence, position, stream),
// so the speculative engine can draw exactly the number the baseline drew for the same token.
enum class Stream : uint32_t {
    target = 0,    // sampling a token from the target distribution p (baseline, match, bonus)
    draft = 1,     // sampling a draft token from q
    accept = 2,    // the rejection rule's accept test u < p(x)/q(x)
    residual = 3,  // resampling from norm(max(0, p - q)) after a rejection
    synthetic = 4, // synthetic acceptance's keep test (synthetic.h)
};

double keyed_uniform(uint64_t seed, uint64_t sequence, uint64_t position, Stream stream);

struct ArgmaxResult {
    int32_t token;
    float margin;  // top-1 minus top-2 logit: how close a greedy decision was to a tie
};
ArgmaxResult argmax_with_margin(const float* logits, int32_t n_vocab);
int32_t argmax(const float* logits, int32_t n_vocab);  // first index of the maximum

// A temperature softmax without its table: the max logit, 1/T, the normaliser and the sums of
// exp over blocks of the vocabulary, from two read-only passes. p(i) and an inverse-CDF draw
// follow from it without writing a probability per token (a 262k-token vocabulary makes that
// table, and its passes, most of the cost of a sampled token).
struct SoftmaxNorm {
    float max_logit = 0;
    float inv_t = 1;
    float inv_sum = 1;               // float(1 / sum): p(i) = exp(...) * inv_sum
    double sum = 0;                  // sum over the vocabulary of exp((l - max) / T)
    std::vector<double> block_sums;  // the same sum by block of kSoftmaxBlock tokens
};
constexpr int32_t kSoftmaxBlock = 256;
void softmax_norm(const float* logits, int32_t n_vocab, float temperature, SoftmaxNorm& norm);
float softmax_prob(const float* logits, const SoftmaxNorm& norm, int32_t i);  // p(i)
// The inverse-CDF draw at uniform u from the softmax: the same token sample_from_weights would
// pick from exp((l - max) / T) (up to rounding at a block boundary).
int32_t sample_softmax(const float* logits, int32_t n_vocab, const SoftmaxNorm& norm, double u);

// probs = the softmax as a table, for a rejection's residual; probs[i] == softmax_prob(i) exactly.
void softmax(const float* logits, int32_t n_vocab, const SoftmaxNorm& norm, std::vector<float>& probs);

// Inverse-CDF draw from an (unnormalised, non-negative) weight vector with uniform u in [0, 1).
int32_t sample_from_weights(const float* weights, int32_t n, double u);

// Leviathan/Chen rejection step for one drafted token x ~ q: accept with probability
// min(1, p(x)/q(x)); on rejection draw from norm(max(0, p - q)). p and q have n entries.
struct RejectionOutcome {
    bool accepted;
    int32_t token;  // x if accepted, else the resampled token
};
RejectionOutcome rejection_step(const float* p, const float* q, int32_t n, int32_t x,
                                double u_accept, double u_residual, std::vector<float>& scratch);
// Its two halves, for callers that know p(x) without the whole of p: the accept test
// u < p(x)/q(x), and the draw from norm(max(0, p - q)) after a rejection.
bool draft_accepted(double u_accept, float p_x, float q_x);
int32_t residual_sample(const float* p, const float* q, int32_t n, double u_residual, std::vector<float>& scratch);

// Where an emitted token x lies in the distribution p it must have been drawn from, for the
// rejection rule's distributional test (lossless.distribution_test): p's mass ranked ahead of x
// in two orders that are fixed before the draw, so that under a correct rule the randomized PIT
// u = ahead + V * p(x) is uniform.
struct PitPoint {
    int64_t index = 0;         // x's index in its sequence's output
    double p_emitted = 0;      // p(x)
    double above_sure = 0;     // p's order (most probable first): mass strictly above x,
    double above_maybe = 0;    // and with x's exact ties counted above too
    // The draft's preference over p's (log q - log p descending, ties by id): a fault that leans
    // towards q's tokens shows at one end of it. p's order where nothing was drafted (a bonus).
    double draft_above_sure = 0, draft_above_maybe = 0;
};
// `probs`: softmax(logits / T), the table the rule drew from; `q`: the draft distribution
// proposed at this position (n_q entries), or nullptr.
PitPoint pit_point(const float* logits, const std::vector<float>& probs, int32_t n_vocab, float temperature,
                   int32_t x, const float* q, int32_t n_q);

}  // namespace specnative
