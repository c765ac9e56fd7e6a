#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

// The kernels below run over the whole vocabulary per sampled position, so on x86-64 Linux they
// are compiled twice, for AVX2 (x86-64-v3) and for the baseline, and the loader picks one for the
// CPU (GCC/Clang target_clones, an ifunc): the package stays portable and uses 8-wide vectors
// where it can. Both clones give the same bits: no fast-math, no FMA contraction (CMakeLists.txt),
// and every sum has the same association (16 lanes) at any vector width.
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define SPECNATIVE_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SPECNATIVE_VECTOR_CLONES
#endif
// The loops live in small helpers, which must be compiled inside each clone: left out of line
// they would be built once, for the baseline (and GCC then left the max loop scalar).
#if defined(__GNUC__) || defined(__clang__)
#define SPECNATIVE_IN_CLONE inline __attribute__((always_inline))
#else
#define SPECNATIVE_IN_CLONE inline
#endif

namespace specnative {

namespace {

// splitmix64 finaliser: a bijective 64-bit mixer with good avalanche.
uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Max over [begin, end), NaNs skipped. GCC does not vectorize a float max written as a loop
// without -ffast-math (it may not assume away NaNs), so the running maxima are explicit vectors
// (GCC/Clang vector extensions: the clone's ISA picks the registers), four of them so that
// compare-and-select latency overlaps. The value is a sequential scan's (max is exact; +0 and -0
// compare equal).
#if defined(__GNUC__) || defined(__clang__)
typedef float Floats8 __attribute__((vector_size(32)));
// Its helpers are always inlined, so no 32-byte vector ever crosses a call: GCC's note that
// such a call's ABI depends on AVX does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

SPECNATIVE_IN_CLONE Floats8 load8(const float* p) {
    Floats8 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

SPECNATIVE_IN_CLONE Floats8 max8(Floats8 a, Floats8 b) { return b > a ? b : a; }  // NaN in b: a

SPECNATIVE_IN_CLONE float max_of(const float* begin, const float* end) {
    constexpr float kLowest = -std::numeric_limits<float>::infinity();
    float m = kLowest;
    const float* p = begin;
    if (end - p >= 32) {
        Floats8 a = {kLowest, kLowest, kLowest, kLowest, kLowest, kLowest, kLowest, kLowest};
        Floats8 b = a, c = a, d = a;
        for (; end - p >= 32; p += 32) {
            a = max8(a, load8(p));
            b = max8(b, load8(p + 8));
            c = max8(c, load8(p + 16));
            d = max8(d, load8(p + 24));
        }
        a = max8(max8(a, b), max8(c, d));
        for (int j = 0; j < 8; ++j) m = a[j] > m ? a[j] : m;
    }
    for (; p < end; ++p) m = *p > m ? *p : m;
    return m;
}
#else
SPECNATIVE_IN_CLONE float max_of(const float* begin, const float* end) {
    float m = -std::numeric_limits<float>::infinity();
    for (const float* p = begin; p < end; ++p) m = *p > m ? *p : m;
    return m;
}
#endif

// First index i in [0, n) with logits[i] == value, or n - 1 where none is: blocks of 64 are
// tested branch-free (vectorized) and only the block holding it is scanned one by one.
SPECNATIVE_IN_CLONE int32_t first_index_of(const float* logits, int32_t n, float value) {
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

// Sum over [begin, end) in sixteen float lanes (per-lane adds: the compiler vectorizes them), as double.
// Callers keep ranges short (a block of a few hundred) so that float lanes lose nothing that
// matters; long sums add block results in double.
SPECNATIVE_IN_CLONE double block_sum(const float* begin, const float* end) {
    constexpr int kLanes = 16;
    float lane[kLanes] = {};
    const float* p = begin;
    for (; end - p >= kLanes; p += kLanes) {
        for (int j = 0; j < kLanes; ++j) lane[j] += p[j];
    }
    double s = 0.0;
    for (const float x : lane) s += x;
    for (; p < end; ++p) s += *p;
    return s;
}

// exp(x) for x <= 0, within about 1 ulp of std::exp, as straight-line code that the compiler
// vectorizes (std::exp is a library call per element: most of a softmax over 262k logits).
// x = n ln2 + r with |r| <= ln2/2; exp(r) by its Taylor series to r^7 (truncation < 6e-9, below
// half an ulp); 2^n by writing the exponent bits. Below -87.3 (exp < 1.2e-38, float's smallest
// normal) and for NaN it returns 0, so a masked (-inf) logit gets probability 0 exactly.
SPECNATIVE_IN_CLONE float exp_nonpositive(float x) {
    constexpr float kMin = -87.3f;
    constexpr float kLog2e = 1.44269504088896341f;
    constexpr float kLn2Hi = 0.693359375f;    // ln 2 in 9 bits: n * kLn2Hi is exact
    constexpr float kLn2Lo = -2.12194440e-4f;  // ln 2 - kLn2Hi
    constexpr float kRound = 12582912.0f;     // 1.5 * 2^23: adding and subtracting it rounds
    const bool in_range = x >= kMin;
    const float xc = in_range ? x : kMin;
    const float n = (xc * kLog2e + kRound) - kRound;
    const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
    float poly = 1.0f / 5040;
    poly = poly * r + 1.0f / 720;
    poly = poly * r + 1.0f / 120;
    poly = poly * r + 1.0f / 24;
    poly = poly * r + 1.0f / 6;
    poly = poly * r + 0.5f;
    poly = poly * r + 1.0f;
    poly = poly * r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // n in [-126, 0]: a normal 2^n
    float two_to_n;
    std::memcpy(&two_to_n, &bits, sizeof two_to_n);
    return in_range ? poly * two_to_n : 0.0f;
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
SPECNATIVE_VECTOR_CLONES
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

SPECNATIVE_VECTOR_CLONES
ArgmaxResult argmax_with_margin(const float* logits, int32_t n_vocab) {
    const int32_t best = argmax(logits, n_vocab);
    const float second = std::max(max_of(logits, logits + best), max_of(logits + best + 1, logits + n_vocab));
    return {best, logits[best] - second};
}

namespace {

// exp((l - max) / T) for logits [begin, end) into out (at most kSoftmaxBlock).
SPECNATIVE_IN_CLONE void softmax_terms(const float* logits, int32_t begin, int32_t end, const SoftmaxNorm& norm, float* out) {
    for (int32_t i = begin; i < end; ++i) out[i - begin] = exp_nonpositive((logits[i] - norm.max_logit) * norm.inv_t);
}

}  // namespace

SPECNATIVE_VECTOR_CLONES
void softmax_norm(const float* logits, int32_t n_vocab, float temperature, SoftmaxNorm& norm) {
    norm.max_logit = max_of(logits, logits + n_vocab);
    norm.inv_t = 1.0f / temperature;
    norm.block_sums.resize((n_vocab + kSoftmaxBlock - 1) / kSoftmaxBlock);
    float terms[kSoftmaxBlock];
    double sum = 0.0;
    for (size_t b = 0; b < norm.block_sums.size(); ++b) {
        const int32_t begin = static_cast<int32_t>(b) * kSoftmaxBlock;
        const int32_t end = std::min(n_vocab, begin + kSoftmaxBlock);
        softmax_terms(logits, begin, end, norm, terms);
        norm.block_sums[b] = block_sum(terms, terms + (end - begin));
        sum += norm.block_sums[b];
    }
    norm.sum = sum;
    norm.inv_sum = static_cast<float>(1.0 / sum);
}

float softmax_prob(const float* logits, const SoftmaxNorm& norm, int32_t i) {
    return exp_nonpositive((logits[i] - norm.max_logit) * norm.inv_t) * norm.inv_sum;
}

SPECNATIVE_VECTOR_CLONES
int32_t sample_softmax(const float* logits, int32_t n_vocab, const SoftmaxNorm& norm, double u) {
    const double target = u * norm.sum;
    double cumulative = 0.0;
    size_t b = 0;
    while (b + 1 < norm.block_sums.size() && cumulative + norm.block_sums[b] <= target) {
        cumulative += norm.block_sums[b++];
    }
    float terms[kSoftmaxBlock];
    int32_t last_drawable = -1;
    for (; b < norm.block_sums.size(); ++b) {  // normally the first block; later ones on rounding
        const int32_t begin = static_cast<int32_t>(b) * kSoftmaxBlock;
        const int32_t end = std::min(n_vocab, begin + kSoftmaxBlock);
        softmax_terms(logits, begin, end, norm, terms);
        for (int32_t i = begin; i < end; ++i) {
            if (!(terms[i - begin] > 0.0f)) continue;
            cumulative += terms[i - begin];
            last_drawable = i;
            if (cumulative > target) return i;
        }
    }
    if (last_drawable >= 0) return last_drawable;  // rounding left the target just above the sum
    for (int32_t i = n_vocab - 1; i > 0; --i) {      // ... and the blocks scanned held no weight
        if (softmax_prob(logits, norm, i) > 0.0f) return i;
    }
    return 0;
}

SPECNATIVE_VECTOR_CLONES
void softmax(const float* logits, int32_t n_vocab, const SoftmaxNorm& norm, std::vector<float>& probs) {
    probs.resize(n_vocab);
    float* out = probs.data();
    for (int32_t begin = 0; begin < n_vocab; begin += kSoftmaxBlock) {
        const int32_t end = std::min(n_vocab, begin + kSoftmaxBlock);
        softmax_terms(logits, begin, end, norm, out + begin);
        for (int32_t i = begin; i < end; ++i) out[i] *= norm.inv_sum;
    }
}

namespace {

// The last index with a positive weight, 0 if there is none.
SPECNATIVE_IN_CLONE int32_t last_positive(const float* weights, int32_t n) {
    int32_t last = n - 1;
    while (last > 0 && !(weights[last] > 0.0f)) --last;
    return last;
}

// Inverse CDF of non-negative weights in two steps, without a table: the total from block sums
// (one vectorized pass), then a walk that sums block by block (the same sums, recomputed) to the
// block where u * total falls, and a scan from there. -1 when no weight is positive.
// Weights <= 0 (and NaN) are never drawn; the block sums assume none is negative.
SPECNATIVE_IN_CLONE int32_t inverse_cdf(const float* weights, int32_t n, double u) {
    const auto sum_of_block = [&](int32_t begin) {
        return block_sum(weights + begin, weights + std::min(n, begin + kSoftmaxBlock));
    };
    double total = 0.0;
    for (int32_t begin = 0; begin < n; begin += kSoftmaxBlock) total += sum_of_block(begin);
    if (!(total > 0.0)) return -1;
    const double target = u * total;
    double cumulative = 0.0;
    int32_t begin = 0;
    for (; begin + kSoftmaxBlock < n; begin += kSoftmaxBlock) {
        const double s = sum_of_block(begin);
        if (cumulative + s > target) break;
        cumulative += s;
    }
    // The block's own running sum may round differently from its block sum: the scan goes on
    // past the block's end if it must.
    for (int32_t i = begin; i < n; ++i) {
        if (!(weights[i] > 0.0f)) continue;
        cumulative += weights[i];
        if (cumulative > target) return i;
    }
    return last_positive(weights, n);  // rounding left the target just above the sum
}

}  // namespace

SPECNATIVE_VECTOR_CLONES
int32_t sample_from_weights(const float* weights, int32_t n, double u) {
    const int32_t i = inverse_cdf(weights, n, u);
    return i >= 0 ? i : last_positive(weights, n);  // no positive total (all zero, or NaN)
}

bool draft_accepted(double u_accept, float p_x, float q_x) {
    return u_accept * q_x < p_x;  // u < p/q without the division (q(x) > 0: x was drawn from q)
}

SPECNATIVE_VECTOR_CLONES
int32_t residual_sample(const float* p, const float* q, int32_t n, double u_residual, std::vector<float>& scratch) {
    scratch.resize(n);
    for (int32_t i = 0; i < n; ++i) scratch[i] = std::max(0.0f, p[i] - q[i]);
    // A rejection implies p(x) < q(x), hence some mass where p > q; float rounding can still
    // leave none, in which case p itself is the right fallback.
    const int32_t i = inverse_cdf(scratch.data(), n, u_residual);
    return i >= 0 ? i : sample_from_weights(p, n, u_residual);
}

RejectionOutcome rejection_step(const float* p, const float* q, int32_t n, int32_t x,
                                double u_accept, double u_residual, std::vector<float>& scratch) {
    if (draft_accepted(u_accept, p[x], q[x])) return {true, x};
    return {false, residual_sample(p, q, n, u_residual, scratch)};
}

PitPoint pit_point(const float* logits, const std::vector<float>& probs, int32_t n_vocab, float temperature,
                   int32_t x, const float* q, int32_t n_q) {
    // log q - log p up to a constant; -inf where q is 0 (those come last, by id)
    const auto draft_key = [&](int32_t v) {
        return v < n_q && q[v] > 0.0f ? std::log(static_cast<double>(q[v])) - logits[v] / static_cast<double>(temperature)
                                      : -INFINITY;
    };
    const double key_x = q != nullptr ? draft_key(x) : 0.0;
    double total = 0.0, sure = 0.0, maybe = 0.0, draft_ahead = 0.0;
    for (int32_t v = 0; v < n_vocab; ++v) {
        const double p_v = probs[v];
        total += p_v;
        if (logits[v] > logits[x]) sure += p_v;
        if (logits[v] >= logits[x] && v != x) maybe += p_v;
        if (q != nullptr) {
            const double key = draft_key(v);
            if (key > key_x || (key == key_x && v < x)) draft_ahead += p_v;
        }
    }
    PitPoint pit;
    pit.p_emitted = probs[x] / total;
    pit.above_sure = sure / total;
    pit.above_maybe = maybe / total;
    pit.draft_above_sure = q != nullptr ? draft_ahead / total : pit.above_sure;
    pit.draft_above_maybe = q != nullptr ? draft_ahead / total : pit.above_maybe;
    return pit;
}

}  // namespace specnative
