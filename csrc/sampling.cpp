#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace specnative {

namespace {

// splitmix64 finaliser: a bijective 64-bit mixer with good avalanche.
uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Max over [begin, end), NaNs skipped. Sixteen independent running maxima: an element-wise loop
// the compiler vectorizes at any -m level without -ffast-math (one running max is a reduction it
// may not reorder), which matters at 262k-token vocabularies (Gemma).
// The value is the same as a sequential scan's (max is exact; +0 and -0 compare equal).
float max_of(const float* begin, const float* end) {
    constexpr int kLanes = 16;
    float lane[kLanes];
    for (float& m : lane) m = -std::numeric_limits<float>::infinity();
    const float* p = begin;
    for (; end - p >= kLanes; p += kLanes) {
        for (int j = 0; j < kLanes; ++j) lane[j] = p[j] > lane[j] ? p[j] : lane[j];
    }
    float m = -std::numeric_limits<float>::infinity();
    for (const float x : lane) m = x > m ? x : m;
    for (; p < end; ++p) m = *p > m ? *p : m;
    return m;
}

// First index i in [0, n) with logits[i] == value, or n - 1 where none is: blocks of 64 are
// tested branch-free (vectorized) and only the block holding it is scanned one by one.
int32_t first_index_of(const float* logits, int32_t n, float value) {
    constexpr int32_t kBlock = 64;
    int32_t i = 0;
    for (; n - i >= kBlock; i += kBlock) {
        int hit = 0;
        for (int32_t j = 0; j < kBlock; ++j) hit |= logits[i + j] == value;
        if (hit) break;
    }
    while (i < n - 1 && logits[i] != value) ++i;
    return std::min(i, n - 1);
}

}  // namespace

double keyed_uniform(uint64_t seed, uint64_t sequence, uint64_t position, Stream stream) {
    uint64_t h = mix64(seed);
    h = mix64(h ^ sequence);
    h = mix64(h ^ position);
    h = mix64(h ^ static_cast<uint64_t>(stream));
    return static_cast<double>(h >> 11) * 0x1.0p-53;  // 53 random bits -> [0, 1)
}

// One pass: the max of each block of kBlock logits, and the first block whose max exceeds every
// earlier one (it holds the first index of the overall max); then a scan of that block alone.
int32_t argmax(const float* logits, int32_t n_vocab) {
    constexpr int32_t kBlock = 256;
    float top = -std::numeric_limits<float>::infinity();
    int32_t from = 0;
    int32_t i = 0;
    for (; n_vocab - i >= kBlock; i += kBlock) {
        const float m = max_of(logits + i, logits + i + kBlock);
        if (m > top) {
            top = m;
            from = i;
        }
    }
    const float tail = max_of(logits + i, logits + n_vocab);
    if (tail > top) {
        top = tail;
        from = i;
    }
    // every logit NaN or -inf: from = 0, the first -inf (or the last index), as a plain scan finds
    return from + first_index_of(logits + from, n_vocab - from, top);
}

ArgmaxResult argmax_with_margin(const float* logits, int32_t n_vocab) {
    const int32_t best = argmax(logits, n_vocab);
    const float second = std::max(max_of(logits, logits + best), max_of(logits + best + 1, logits + n_vocab));
    return {best, logits[best] - second};
}

void softmax(const float* logits, int32_t n_vocab, float temperature, std::vector<float>& probs) {
    probs.resize(n_vocab);
    const float max_logit = max_of(logits, logits + n_vocab);
    const float inv_t = 1.0f / temperature;
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        probs[i] = std::exp((logits[i] - max_logit) * inv_t);
        sum += probs[i];
    }
    const float inv_sum = static_cast<float>(1.0 / sum);
    for (int32_t i = 0; i < n_vocab; ++i) {
        probs[i] *= inv_sum;
    }
}

int32_t sample_from_weights(const float* weights, int32_t n, double u) {
    double total = 0.0;
    for (int32_t i = 0; i < n; ++i) {
        total += weights[i];
    }
    const double target = u * total;
    double cumulative = 0.0;
    int32_t last_positive = 0;
    for (int32_t i = 0; i < n; ++i) {
        if (weights[i] <= 0.0f) {
            continue;
        }
        cumulative += weights[i];
        last_positive = i;
        if (cumulative > target) {
            return i;
        }
    }
    return last_positive;  // rounding left target just above the sum
}

RejectionOutcome rejection_step(const float* p, const float* q, int32_t n, int32_t x,
                                double u_accept, double u_residual, std::vector<float>& scratch) {
    // u < p/q, written without the division (q(x) > 0 because x was drawn from q).
    if (u_accept * q[x] < p[x]) {
        return {true, x};
    }
    scratch.resize(n);
    double residual_mass = 0.0;
    for (int32_t i = 0; i < n; ++i) {
        scratch[i] = std::max(0.0f, p[i] - q[i]);
        residual_mass += scratch[i];
    }
    // A rejection implies p(x) < q(x), hence some mass where p > q; float rounding can still
    // leave none, in which case p itself is the right fallback.
    const float* weights = residual_mass > 0.0 ? scratch.data() : p;
    return {false, sample_from_weights(weights, n, u_residual)};
}

}  // namespace specnative
