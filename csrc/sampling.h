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
};

double keyed_uniform(uint64_t seed, uint64_t sequence, uint64_t position, Stream stream);

struct ArgmaxResult {
    int32_t token;
    float margin;  // top-1 minus top-2 logit: how close a greedy decision was to a tie
};
ArgmaxResult argmax_with_margin(const float* logits, int32_t n_vocab);
int32_t argmax(const float* logits, int32_t n_vocab);  // first index of the maximum

// probs = softmax(logits / temperature); temperature > 0.
void softmax(const float* logits, int32_t n_vocab, float temperature, std::vector<float>& probs);

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

}  // namespace specnative
