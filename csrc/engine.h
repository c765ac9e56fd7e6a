// The measurement engine: one target context (and optionally one draft context) decoding N
// sequences together, either one target token per step (baseline) or draft/verify/accept rounds.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "llama.h"
#include "model_io.h"

namespace specnative {

struct EngineParams {
    int n_ctx = 4096;        // KV cells per context (all sequences together when kv_unified)
    int n_batch = 512;       // the most tokens one llama_decode gets; also the micro-batch size
    int n_threads = 2;
    int n_gpu_layers = 0;    // -1 = all
    int n_seq_max = 8;
    int flash_attn = 0;      // -1 auto, 0 off, 1 on (llama_flash_attn_type)
    bool kv_unified = true;  // one KV buffer: lets sequences share a prompt prefix's cells
};

// Thrown when the caller's should_stop() asks to stop (Ctrl-C); Python sees KeyboardInterrupt.
struct Interrupted : std::runtime_error {
    Interrupted() : std::runtime_error("interrupted") {}
};

enum class AcceptRule { greedy, match, rejection };

struct GenerateParams {
    int n_predict = 32;
    float temperature = 0.0f;
    uint64_t seed = 0;
    bool spec = false;
    int k = 4;
    AcceptRule rule = AcceptRule::greedy;
    bool stop_at_eog = true;
    bool record_margins = false;  // top-1 minus top-2 target logit per token: one more pass
                                  // over the vocabulary, so only when asked (lossless checks)
};

// Exact per-sequence counts of the speculative loop (all zero for the baseline).
struct SeqCounts {
    int64_t drafted = 0;
    int64_t accepted = 0;
    int64_t rounds = 0;    // rounds this sequence took part in
    int64_t rejected = 0;  // rounds that ended on a rejected draft (the others accepted all)
    int64_t emitted = 0;   // tokens emitted by rounds (accepted + one corrected/bonus each)
    std::vector<int64_t> drafted_at;   // [k]: rounds that drafted position j+1
    std::vector<int64_t> accepted_at;  // [k]: rounds that accepted position j+1
    std::vector<int64_t> accept_len_hist;  // [k+1]: rounds that accepted exactly m drafts
};

// alpha, Leviathan's per-token alpha and tau from counts: the one definition of each (the sweep
// pools the counts of its repeats and asks again). NaN where the denominator is zero.
struct AcceptRates {
    double draft_accept_rate;  // accepted / drafted (llama.cpp's and vLLM's alpha)
    double token_accept_rate;  // accepted / (accepted + rejected): chance a reached draft is kept
    double mean_accept_len;    // tau = emitted / rounds (bonus token included)
};
AcceptRates accept_rates(const SeqCounts& counts);

// Milliseconds; every interval of a run is charged to exactly one of the step buckets.
struct StepTimes {
    double prefill_target = 0, prefill_draft = 0;
    double draft = 0, verify = 0, resample = 0;  // speculative rounds
    double decode = 0;                           // baseline steps (llama_decode + sampling)
    double total = 0;
    double steps_sum() const {
        return prefill_target + prefill_draft + draft + verify + resample + decode;
    }
};

struct GenerateResult {
    std::vector<std::vector<int32_t>> tokens;  // generated ids per sequence (a final EOG included)
    std::vector<std::vector<float>> margins;   // target top-1 minus top-2 logit per token (if asked)
    std::vector<SeqCounts> counts;
    StepTimes times;
    bool speculative = false;
    int64_t steps = 0;   // baseline decode steps, or speculative rounds (engine iterations)
    int64_t decode_tokens = 0;  // tokens produced after prefill (each sequence's first excluded)

    // Derived quantities, defined here and nowhere else.
    SeqCounts totals() const;         // counts summed over sequences
    double draft_accept_rate() const; // alpha = accepted / drafted (NaN without drafts)
    // Leviathan's per-token alpha: accepted / (accepted + rejected), i.e. the chance that a draft
    // the acceptance walk reached was accepted (drafts behind a rejection are never tried).
    double token_accept_rate() const;
    double mean_accept_len() const;   // tau = emitted / rounds, rounds summed over sequences
    double round_ms() const;          // T_round: mean wall time of one speculative round
    double step_ms() const;           // T_step: mean wall time of one baseline decode step
    double tps() const;               // decode_tokens per second of decoding (prefill excluded)
};

class Engine {
public:
    Engine(const std::string& target_path, const std::string& draft_path, const EngineParams& params);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Raises std::invalid_argument for bad input before touching llama.cpp.
    // `should_stop` is polled between steps (Ctrl-C); returning true aborts with an exception.
    GenerateResult generate(const std::vector<std::vector<int32_t>>& prompts,
                            const GenerateParams& params,
                            const std::function<bool()>& should_stop);

    // Target logits after feeding `tokens` from scratch in sequence 0 (clears the KV cache).
    std::vector<float> prompt_logits(const std::vector<int32_t>& tokens);
    // Target logits for each sequence's pending (last generated) token on top of the KV state the
    // last generate() left, without changing that state: checks that rollback left it consistent.
    std::vector<float> pending_logits(int seq);

    std::vector<int32_t> tokenize(const std::string& text, bool add_special) const;
    std::string detokenize(const std::vector<int32_t>& tokens) const;

    bool has_draft() const { return draft_model_ != nullptr; }
    int n_ctx() const;
    int n_ctx_seq() const;
    ModelInfo target_info() const;
    ModelInfo draft_info() const;
    void close();

private:
    struct Sequence;
    struct Context;

    void require_open() const;  // throws once close() ran
    // Returns the prompts' shared prefix length (its KV cells are computed once).
    int validate(const std::vector<std::vector<int32_t>>& prompts, const GenerateParams& p) const;
    void reset_memory();
    void prefill(Context& ctx, std::vector<Sequence>& seqs, int shared_prefix, const GenerateParams* sample_first);
    GenerateResult run_baseline(std::vector<Sequence>& seqs, int shared_prefix, const GenerateParams& p,
                                const std::function<bool()>& should_stop);
    GenerateResult run_speculative(std::vector<Sequence>& seqs, int shared_prefix, const GenerateParams& p,
                                   const std::function<bool()>& should_stop);

    EngineParams params_;
    std::string target_path_, draft_path_;
    llama_model* target_model_ = nullptr;
    llama_model* draft_model_ = nullptr;
    Context* target_ = nullptr;
    Context* draft_ = nullptr;
    std::vector<int32_t> last_pending_;  // per sequence: last generated token, not yet in target KV
    std::vector<int32_t> last_n_past_;
};

}  // namespace specnative
