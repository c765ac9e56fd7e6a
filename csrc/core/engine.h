// The measurement engine: one target context (and optionally one draft context) decoding N
// sequences together, either one target token per step (baseline) or draft/verify/accept rounds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "llama.h"
#include "model_io.h"
#include "sampling.h"

namespace specnative {

struct EngineParams {
    int n_ctx = 4096;        // KV cells per context (all sequences together when kv_unified)
    int n_batch = 512;       // the most tokens one llama_decode gets; also the micro-batch size
    int n_threads = 2;
    int n_gpu_layers = 0;    // -1 = all
    int n_seq_max = 8;
    int flash_attn = 0;      // -1 auto, 0 off, 1 on (llama_flash_attn_type)
    bool kv_unified = true;  // one KV buffer: lets sequences share a prompt prefix's cells
    // Placement across devices and hosts, llama.cpp's names (model_io.h Placement): split mode
    // (-sm), tensor split (-ts) and main GPU (-mg) apply to both models; devices (-dev / -devd)
    // and GPU layers (-ngl / -ngld) per model, the draft's following the target's when unset.
    std::string split_mode = "layer";
    std::vector<float> tensor_split;
    int main_gpu = 0;
    std::vector<std::string> devices;
    std::vector<std::string> draft_devices;
    static constexpr int kFollowTarget = -1000;
    int n_gpu_layers_draft = kFollowTarget;
    std::vector<std::string> rpc_servers;  // --rpc host:port: added before devices are resolved
    int rpc_timeout_ms = 5000;             // connect timeout when a server is first added
    // Load the target's nextn (MTP) layers and make its MTP draft context (drafter "mtp").
    bool mtp = false;
};

// Thrown when the caller's should_stop() asks to stop (Ctrl-C); Python sees KeyboardInterrupt.
struct Interrupted : std::runtime_error {
    Interrupted() : std::runtime_error("interrupted") {}
};

enum class AcceptRule { greedy, match, rejection };

// Which drafter proposes the tokens of a speculative round (csrc/drafter.h): "model" (the draft
// GGUF given to the Engine), one of llama.cpp's model-free n-gram types by its --spec-type name,
// or a hidden-state drafter (dflash, dspark, eagle3: the Engine's drafter file; mtp).
struct DrafterParams {
    std::string type = "model";
    std::map<std::string, std::string> options;  // llama.cpp CLI names, e.g. spec-ngram-mod-n-min
};

// A draft tree instead of a chain (tree_round.cpp, drafters/model_tree.cpp): the draft model
// proposes a tree whose nodes are all verified in one target batch. none: a chain of k tokens.
struct TreeShape {
    enum class Kind { none, topk, split };
    Kind kind = Kind::none;
    // topk (EAGLE-2 / SGLang's dynamic tree): every expanded node gets `topk` children, the topk
    // nodes of each depth with the largest cumulative draft probability are expanded, `depth`
    // levels, and the `budget` best nodes are verified.
    int topk = 4, depth = 5, budget = 8;
    // split (llama.cpp's examples/speculative): a branch splits when a further candidate's draft
    // probability exceeds p_split, at most `branches` branches; drafting stops once the tree holds
    // `budget` nodes (its n_draft; also the depth cap).
    int branches = 4;
    float p_split = 0.1f;
    bool on() const { return kind != Kind::none; }
    int max_depth() const { return kind == Kind::topk ? depth : budget; }
    // Nodes one round may verify at most (split: the last step may pass the budget by a branch's siblings).
    int max_nodes() const { return kind == Kind::topk ? budget : budget + branches - 1; }
    // Sequence ids one sequence's tree uses (one per branch: a leaf of the verified tree, a
    // frontier node of the draft), its own id included.
    int ids_per_seq() const { return kind == Kind::topk ? std::max(topk, budget) : branches; }
    // Siblings a node can have (the per-rank counts' length).
    int max_siblings() const { return kind == Kind::topk ? topk : std::min(branches, 8); }
};

// How many tokens each sequence may draft in a round (spec_policy.h): one k for every round
// (static), a k per occupancy band (by_batch, vLLM's [[lo, hi, k], ...]), or chosen every round
// from the measured acceptance and verify cost (adaptive). A policy changes when tokens are
// drafted, never which tokens come out: the acceptance rule decides those.
struct PolicyBand {
    int lo = 1, hi = 1;  // sequences decoding in the round, inclusive
    int k = 0;           // what each of them may draft (0: one token, as a baseline step)
};
struct PolicyParams {
    enum class Kind { static_k, by_batch, adaptive };
    Kind kind = Kind::static_k;
    std::vector<PolicyBand> schedule;  // by_batch: the first band holding the occupancy; none: k
    double prior_alpha = 0.5;   // adaptive: the acceptance the run starts from, at every position
    double prior_weight = 2.0;  // adaptive: pseudo-rounds behind that prior, and behind the run's
                                // pooled estimate in each sequence's own
    int calibrate_repeats = 3;  // adaptive: timed target decodes per row count at start-up
    // adaptive: the bonus on an acceptance estimate with few rounds behind it, in standard errors
    // at the prior's weight (0: none; the probes of sequences held at k = 0 still run)
    double optimism = 0.3;
    // adaptive: start from what the engine's earlier adaptive runs under the same decoding settings
    // learned (acceptance by task label, the cost levels) and leave this run's there, as a server
    // that runs for hours keeps it; false: learn from the prior alone and leave nothing.
    bool remember = true;
};

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
    // Rejection rule: each emitted token's place in the p of its verify row (PitPoint), the
    // distributional test's evidence. One more softmax per emitted token: checks only.
    bool record_pit = false;
    // A check run whose prefill is no measurement: prefill only what the cache lacks of the
    // prompts (Engine::prefill's reuse_prompts). Never for timed runs; not with hidden drafters.
    bool reuse_prompts = false;
    // The prompts' common prefix (the sweep's shared context) is prefilled once, its cells shared by
    // every sequence and kept from one call to the next; false: every sequence prefills its whole
    // prompt on every call, as a server without prompt caching does.
    bool prefix_cache = true;
    // With prefix_cache: share (and keep between calls) at most this many leading tokens, the
    // shared context's length; a sequence's own prompt is then prefilled on every call, even where
    // it is the whole common prefix (one sequence). -1: the prompts' whole common prefix.
    int prefix_limit = -1;
    DrafterParams drafter;        // spec only; k caps every drafter's proposal per round
    // Draft model only: stop a sequence's draft for the round at the first position whose top
    // draft probability is below this (llama.cpp's --spec-draft-p-min; 0 = off, fixed k).
    float draft_p_min = 0.0f;
    // Draft model at temperature > 0: q = softmax(draft logits / this) when > 0, else at the
    // generation temperature. The rejection rule is lossless for any q, so a draft run hotter than
    // the target (more rejections) exercises every path of the rule (lossless.rejection_distribution).
    float draft_temperature = 0.0f;
    // Baseline only (spec=false) with a hidden-state drafter named in `drafter`: decode under the
    // target settings that drafter asks for (layer-input or nextn extraction), to measure what
    // they cost the target's step. The honest baseline runs without them.
    bool drafter_settings = false;
    TreeShape tree;  // spec with the draft model only; k is ignored when on
    // Synthetic acceptance (synthetic.h; benchmarking only): the probability each draft position is
    // kept with, given the earlier ones were (one per position, at least k); empty: the rule decides.
    std::vector<double> synthetic;
    PolicyParams policy;  // chains only; k is the most any round drafts
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
    // Draft trees only (empty for chains): at every node the acceptance walk reached, its children
    // by sibling rank (draw order, 0 first): offered[r] nodes had a child of rank r, accepted_rank[r]
    // walks moved on to it. (drafted counts every verified node; drafted_at and accepted_at depth.)
    std::vector<int64_t> offered_rank, accepted_rank;
    // [k+1]: rounds the spec policy let this sequence draft at most m tokens (its n_predict's end
    // can cap a round below the policy's choice; the histogram holds what the round was allowed).
    std::vector<int64_t> k_chosen_hist;
};

// alpha, Leviathan's per-token alpha and tau from counts: the one definition of each (the sweep
// pools the counts of its repeats and asks again). NaN where the denominator is zero.
struct AcceptRates {
    double draft_accept_rate;  // accepted / drafted (llama.cpp's and vLLM's alpha)
    double token_accept_rate;  // accepted / (accepted + rejected): chance a reached draft is kept
    double mean_accept_len;    // tau = emitted / rounds (bonus token included)
};
AcceptRates accept_rates(const SeqCounts& counts);
SeqCounts sum_counts(const std::vector<SeqCounts>& counts);  // element-wise, per-position arrays too

// Milliseconds; every interval of a run is charged to exactly one of the step buckets.
struct StepTimes {
    double prefill_target = 0, prefill_draft = 0;
    double draft = 0, verify = 0, resample = 0;  // speculative rounds
    // The drafter reading the target's verify batch (a hidden-state drafter's
    // common_speculative_process: feature copy, KV injection, EAGLE-3's encoder); 0 for the others.
    double draft_ingest = 0;
    double decode = 0;                           // baseline steps (llama_decode + sampling)
    // The spec policy's own time: its choice each round and its bookkeeping after it, and an
    // adaptive policy's start-up cost curve (policy_startup); 0 for static.
    double policy = 0;
    double total = 0;
    // Not a bucket: the part of the decoding buckets (draft + verify + resample, or decode) spent
    // inside llama.cpp calls (llama_decode of baseline, draft and verify batches with their
    // synchronize; a rollback's KV removal; an n-gram drafter's common_speculative_* calls). The
    // rest is the engine's own.
    double llama = 0;
    // Of `llama`: the rollbacks' KV removal (llama_memory_seq_rm on target and draft caches, a scan
    // over every cell of the cache), apart because it grows with n_ctx, not with the model.
    double kv_removal = 0;
    // Not a bucket: of `policy`, the adaptive policy's start-up timing of the target's verify.
    double policy_startup = 0;
    double steps_sum() const {
        return prefill_target + prefill_draft + draft + draft_ingest + verify + resample + decode + policy;
    }
};

// The rejection rule's own evidence at one drafted position its walk reached (record_pit), beside
// the emitted tokens' PitPoint: computed apart from the rule, from the verify row that belongs to
// the position and the q that proposed the draft (not the row or q the rule used: a rule that
// reads the wrong one shows). Under a correct rule the decision is Bernoulli(accept_prob) given
// the draft, and a rejection's correction token a draw from r = norm(max(0, p - q)).
struct DecisionPoint {
    int64_t index = 0;         // the draft's index in its sequence's output
    double accept_prob = 0;    // pi = min(1, p(x) / q(x)) for the drafted token x
    bool accepted = false;     // the walk kept x
    // A rejection's correction token c in r (NaN for an accepted draft, or where r has no mass):
    double residual_ahead = std::numeric_limits<double>::quiet_NaN();  // r's mass ahead of c (r
                                                                      // descending, ties by id)
    double residual_prob = std::numeric_limits<double>::quiet_NaN();   // r(c)
};

struct GenerateResult {
    std::vector<std::vector<int32_t>> tokens;  // generated ids per sequence (a final EOG included)
    std::vector<std::vector<float>> margins;   // target top-1 minus top-2 logit per token (if asked)
    std::vector<std::vector<PitPoint>> pit;    // per sequence: its tokens emitted by rounds (record_pit)
    std::vector<std::vector<DecisionPoint>> decisions;  // per sequence: its drafts reached (record_pit)
    std::vector<SeqCounts> counts;
    StepTimes times;
    bool speculative = false;
    int64_t steps = 0;   // baseline decode steps, or speculative rounds (engine iterations)
    int64_t decode_tokens = 0;  // tokens produced after prefill (each sequence's first excluded)
    // Prompt tokens the target's prefill fed this call (a prefix kept cached from the last call,
    // or a check run's reused prompts, are not fed again), and the KV cells the prompts occupy
    // (a shared prefix once when the prefix cache is on, else once per sequence).
    int64_t prefill_tokens = 0;
    int64_t kv_prompt_cells = 0;
    // Steady state: the iterations in which every sequence of the batch was still active (a server
    // at load N keeps N slots busy; the tail in which finished sequences leave a fixed batch is
    // an artefact of the batch, and is left out of the steady_* quantities).
    int64_t steady_steps = 0;     // iterations with all sequences active
    int64_t steady_tokens = 0;    // tokens emitted by those iterations, all sequences
    double steady_ms = 0;         // their wall time (the same step buckets, summed per iteration)
    int64_t active_sum = 0;       // sequences active, summed over all iterations (occupancy)
    int n_seq = 0;

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
    // In the steady-state window: tokens per second, T_round / T_step, and tau per sequence-round,
    // so that steady_tps(on) / steady_tps(off) = steady_tau / (1 + c) exactly.
    double steady_tps() const;
    double steady_iteration_ms() const;  // T_round (speculative) or T_step (baseline)
    double steady_tau() const;           // tokens per sequence per iteration (1 for the baseline)
    double occupancy() const;            // mean active sequences per iteration / n_seq
};

// Teacher-forced target logits for the same tokens along two batch shapes (chunk_a and chunk_b
// positions per sequence per llama_decode, all sequences together): the target's own numeric
// noise, the control the lossless verdict is judged against. One entry per position.
// Candidates of a logit comparison (NoiseProbe::candidate_spread, lossless.candidate_spread): the
// tokens within this many times the measured spread of the maximum.
constexpr float kCandidateWindow = 2.0f;

struct NoiseProbe {
    std::vector<int32_t> seq, index;   // sequence, generated index
    std::vector<float> max_abs_delta;  // max over the vocabulary of |l_a - l_b|
    std::vector<float> spread;         // max(l_a - l_b) - min(l_a - l_b): the most any pairwise
                                       // logit gap moved between the two shapes
    // The same restricted to the candidates: tokens whose pass-A logit lies within
    // kCandidateWindow x that position's spread of pass A's maximum. Only they can take the top
    // under noise of that size, and a greedy choice depends on their gaps alone; the full spread
    // is set by tokens far down the vocabulary (large |logit|, larger rounding), often 10x wider.
    std::vector<float> candidate_spread;
    std::vector<int32_t> argmax_a, argmax_b;
    // At T > 0: the inverse-CDF draw at the baseline's keyed uniform on either pass's logits (a
    // flip of a sampling decision, as argmax_a/b are of a greedy one). Empty at T = 0.
    std::vector<int32_t> draw_a, draw_b;
    // Per sequence: the spread between the logits of one more 1-token step (the last token) on top
    // of the cache each pass built: how far a cache built in verify batches moves later logits
    // (the KV-state check's control).
    std::vector<float> state_spread;
    // Per sequence: that last step's logits on the 1-token pass's cache: a clean replay's final
    // logits when the forced tokens are the run's own output (lossless.verdict_after_run).
    std::vector<std::vector<float>> final_logits_a;
};

// The spec output fed back through the target along the baseline's path (one token per sequence
// per step): at each generated index, what the baseline's rule picks there and how far the
// emitted token is from that pick. One entry per position.
struct ReplayCheck {
    std::vector<int32_t> seq, index, emitted, pick;
    std::vector<float> gap;           // logit[pick] - logit[emitted] (0 where they agree)
    std::vector<double> u;            // sampling: the keyed uniform the baseline drew there
    std::vector<double> cdf_lo, cdf_hi;  // sampling: [F(emitted - 1), F(emitted)) at the temperature
    // Per sequence: the logits after its last emitted token, on a clean cache along the baseline's
    // path: what pending_logits() must show on the cache a speculative run left (a state check).
    std::vector<std::vector<float>> final_logits;
};

// One llama_context as llama.cpp set it up (its own values, after its caps and padding) and its
// perf counters, to put our setup beside llama.cpp's programs' (bench/peerkit: llama-bench).
struct ContextInfo {
    int n_ctx = 0, n_batch = 0, n_ubatch = 0, n_seq_max = 0, n_threads = 0, n_threads_batch = 0;
    bool kv_unified = false, swa_full = false;  // as we asked (llama.cpp does not report them)
    int flash_attn = 0;                         // as we asked: -1 auto, 0 off, 1 on
    // llama_perf_context, cumulative since the context was made: single-token decodes, tokens
    // of larger batches, and graphs reused instead of rebuilt (llama.cpp's graph reuse)
    int64_t n_eval = 0, n_p_eval = 0, n_reused = 0;
};

// The verify-cost curve (cost_curve.cpp): median ms of one target decode with n = 1..k_max+1
// positions per sequence (verify_ms[n-1]) at given prompts, and of one draft position (one
// token per sequence; NaN without a draft model).
struct CostCurve {
    std::vector<double> verify_ms;
    double draft_ms_per_pos = std::numeric_limits<double>::quiet_NaN();
    int n_seq = 0;
    int repeats = 0;
};


class Acceptor;        // acceptor.h
class TreeAcceptor;    // tree_acceptor.h
enum class Fault;      // acceptor.h
class Proposals;       // round.h
struct AcceptScratch;  // engine_internal.h
struct ServeRequest;   // serve.h
struct ServeParams;
struct ServeResult;
struct HiddenDraft;    // drafter.h

struct PolicyMemory;  // spec_policy.h

class Engine {
public:
    struct Sequence;  // engine_internal.h
    struct Context;   // engine_internal.h

    Engine(const std::string& target_path, const std::string& draft_path, const EngineParams& params);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Raises std::invalid_argument for bad input before touching llama.cpp.
    // `should_stop` is polled between steps (Ctrl-C); returning true aborts with an exception.
    GenerateResult generate(const std::vector<std::vector<int32_t>>& prompts,
                            const GenerateParams& params,
                            const std::function<bool()>& should_stop);

    // Continuous batching (serve.cpp): requests arrive at their times, up to max_concurrency
    // slots decode together, prompts are prefilled in chunks inside the same batches; any drafter
    // (draft model, n-gram, hidden-state); params.gen.prefix_cache shares the requests' common
    // prompt prefix (serve.h). Clears the KV caches first and leaves them empty.
    ServeResult serve(const std::vector<ServeRequest>& requests, const ServeParams& params,
                      const std::function<bool()>& should_stop);

    // Target logits after feeding `tokens` from scratch in sequence 0 (clears the KV cache).
    std::vector<float> prompt_logits(const std::vector<int32_t>& tokens);
    // Target logits for each sequence's pending (last generated) token on top of the KV state the
    // last generate() left, without changing that state: checks that rollback left it consistent.
    std::vector<float> pending_logits(int seq);
    // Positions the target's KV cache holds for sequence `seq` of the last generate() (its
    // largest position + 1): after a correct run, its prompt and every emitted token but the
    // pending last one. Read from llama.cpp's cache, not from the engine's own bookkeeping.
    int32_t cache_extent(int seq) const;
    // Prompt tokens the target's prefills have fed since the engine was made (tests: a reused
    // prompt feeds none).
    int64_t target_prompt_tokens_fed() const { return target_prompt_tokens_fed_; }
    bool is_eog(int32_t token) const;  // an end-of-generation token of the target's vocabulary

    // The draft model's cached shared prefix (Context::cached_prefix) as llama.cpp's sequence
    // state, and its tokens; empty without one. Another engine with the same draft file takes it
    // (load_draft_prefix) instead of prefilling the same context again: the sweep's next target
    // quantization at 32k context saves the draft's whole prefill (bit-identical cells).
    std::pair<std::vector<int32_t>, std::vector<uint8_t>> draft_prefix_state();
    bool load_draft_prefix(const std::vector<int32_t>& tokens, const std::vector<uint8_t>& state);

    std::vector<int32_t> tokenize(const std::string& text, bool add_special) const;
    std::string detokenize(const std::vector<int32_t>& tokens) const;

    bool has_draft() const { return draft_model_ != nullptr; }
    // The hidden-state drafter this engine holds: dflash, dflash2, dspark, eagle3, mtp, or "".
    std::string hidden_drafter() const;
    int n_ctx() const;
    int n_ctx_seq() const;
    ModelInfo target_info() const;
    ModelInfo draft_info() const;
    void close();

    // Teacher-forced passes (replay.cpp). `forced[s]` are the tokens generated for prompt s
    // (index 0 comes from the prompt's last logits). Both leave the KV cache to be rebuilt.
    // settings_of: a hidden-state drafter whose target settings (feature extraction) pass B runs
    // under, so that the control covers the graph a speculative run with it verifies on.
    NoiseProbe numeric_noise(const std::vector<std::vector<int32_t>>& prompts,
                             const std::vector<std::vector<int32_t>>& forced, int chunk_a, int chunk_b,
                             const std::string& settings_of = "", float temperature = 0.0f, uint64_t seed = 0);
    // keys: each continuation's sequence key for the keyed draws (empty: its place in the call,
    // as generate() keys its sequences; serving keys a request by its place in the trace).
    ReplayCheck replay(const std::vector<std::vector<int32_t>>& prompts,
                       const std::vector<std::vector<int32_t>>& forced, float temperature, uint64_t seed,
                       const std::vector<uint64_t>& keys = {});

    // Times target decodes of 1..k_max+1 positions per sequence after the prompts, and one
    // draft position (cost_curve.cpp). Leaves the KV cache holding the prompts.
    CostCurve cost_curve(const std::vector<std::vector<int32_t>>& prompts, int k_max, int repeats);

    // The target's (or with `draft` the draft model's) context: parameters and perf counters.
    ContextInfo context_info(bool draft) const;

    // Tests only: the acceptance rule's decisions come from a planted fault (acceptor.h).
    void inject_fault(Fault fault);
    // What the adaptive spec policy's runs learned, by decoding settings (spec_policy.h); made on first use.
    PolicyMemory* policy_memory();

private:
    using ForcedVisit = std::function<void(int seq, int64_t index, const float* logits)>;
    // share_prefix=false prefills every sequence whole, as a hidden-state drafter's run does.
    void forced_pass(const std::vector<std::vector<int32_t>>& prompts,
                     const std::vector<std::vector<int32_t>>& forced, int chunk, const ForcedVisit& visit,
                     bool share_prefix = true);

    void require_open() const;  // throws once close() ran
    // Returns the prompts' shared prefix length (its KV cells are computed once).
    int validate(const std::vector<std::vector<int32_t>>& prompts, const GenerateParams& p) const;
    void reset_memory();
    // Throws unless this engine holds a hidden-state drafter that `drafter` can run.
    void check_hidden_drafter(const std::string& drafter) const;
    // Called with the logits of each sequence's last prompt token (target prefill only).
    using LastLogits = std::function<void(Sequence&, const float*)>;
    using AfterDecode = std::function<void(const llama_batch&)>;
    void prefill(Context& ctx, std::vector<Sequence>& seqs, int shared_prefix, const LastLogits& on_last,
                 const AfterDecode& after_decode = {}, bool reuse_prompts = false);
    bool holds_prompts(const Context& c, const std::vector<Sequence>& seqs, int shared, bool with_logits) const;
    void load_hidden_draft(const std::string& kind);
    GenerateResult run_baseline(std::vector<Sequence>& seqs, int shared_prefix, const GenerateParams& p,
                                const std::function<bool()>& should_stop);
    // Checks of generate() that serve() shares: the decoding parameters for n_seq sequences
    // (returns the look-ahead cells a round holds), and one prompt with its n_predict.
    int validate_params(const GenerateParams& p, int n_seq) const;
    void validate_prompt(int index, const std::vector<int32_t>& prompt, int n_predict, int lookahead) const;
    // serve()'s refusals; returns the prefix the prefix cache shares (0: none).
    int validate_serve(const std::vector<ServeRequest>& requests, const ServeParams& params) const;
    void validate_tree(const GenerateParams& p, int n_seq) const;  // draft trees (tree_round.cpp)
    // The run's proposals (round.h): a chain or a tree with its drafter, or none (spec off).
    std::unique_ptr<Proposals> make_proposals(const GenerateParams& p, int n_seq);
    // generate()'s speculative rounds (round_loop.cpp), whatever the proposals' shape.
    GenerateResult run_rounds(std::vector<Sequence>& seqs, int shared_prefix, const GenerateParams& p,
                              const std::function<bool()>& should_stop);

    EngineParams params_;
    std::string target_path_, draft_path_;
    llama_model* target_model_ = nullptr;
    llama_model* draft_model_ = nullptr;
    Context* target_ = nullptr;
    Context* draft_ = nullptr;
    HiddenDraft* hidden_ = nullptr;       // a hidden-state drafter's model and context
    void forget_last_run() {  // pending_logits and cache_extent refer to the last generate() only
        last_pending_.clear();
        last_n_past_.clear();
        last_pending_pos_.clear();
    }
    int64_t target_prompt_tokens_fed_ = 0;
    std::vector<int32_t> last_pending_;  // per sequence: last generated token, not yet in target KV
    std::vector<int32_t> last_n_past_;   // per sequence: tokens in the target KV after the run
    std::vector<int32_t> last_pending_pos_;  // where the pending token goes (prompt + emitted - 1)
    std::unique_ptr<Acceptor> acceptor_;  // the correct rule; a planted fault in tests
    std::unique_ptr<TreeAcceptor> tree_acceptor_;  // the same for draft trees
    // What the adaptive spec policy learned in this engine's earlier runs (spec_policy.h).
    std::shared_ptr<PolicyMemory> policy_memory_;
};

}  // namespace specnative
