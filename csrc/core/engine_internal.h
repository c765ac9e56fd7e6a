// Engine internals shared by the engine's source files (engine.cpp: the facade, prefill and the
// baseline; round_loop.cpp with round.h: the speculative round; serve_loop.cpp: serving;
// replay.cpp: teacher-forced passes for the lossless verdict). Not part of the public API.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine.h"
#include "phase_clock.h"
#include "sampling.h"

namespace specnative {

// Throws std::invalid_argument for a temperature sampling cannot use (generate and replay).
void check_temperature(float temperature);

// ---------------------------------------------------------------------------------------------
// One llama_context with its reusable batch.
// ---------------------------------------------------------------------------------------------
struct Engine::Context {
    llama_context* ctx = nullptr;
    llama_batch batch{};
    int n_batch = 0;
    int n_vocab = 0;
    const llama_vocab* vocab = nullptr;
    // Prompt prefix whose KV cells sequence 0 still holds from the previous generate(): a repeat
    // of the same long prompt (the sweep's ctx_len filler) is then not prefilled again.
    std::vector<int32_t> cached_prefix;
    // Every sequence's whole prompt (by sequence id) as the last prefill fed them, sharing
    // `cached_shared` cells, and (target) the logits of each one's last token: decoding and
    // rollbacks only touch positions after the prompts, so their cells stay valid until the next
    // prefill or reset, or a removal that reaches into a prompt (prefill's reuse_prompts).
    std::vector<std::vector<int32_t>> cached_prompts;
    std::vector<std::vector<float>> cached_last_logits;
    int cached_shared = -1;

    void forget_prompts() {
        cached_prompts.clear();
        cached_last_logits.clear();
    }

    Context(llama_model* model, const EngineParams& p) {
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = p.n_ctx;
        cp.n_batch = p.n_batch;
        cp.n_ubatch = p.n_batch;
        cp.n_seq_max = p.n_seq_max;
        cp.n_threads = p.n_threads;
        cp.n_threads_batch = p.n_threads;
        cp.flash_attn_type = static_cast<llama_flash_attn_type>(p.flash_attn);
        cp.kv_unified = p.kv_unified;
        cp.swa_full = true;  // sliding-window caches must keep rolled-back positions recoverable
        cp.no_perf = true;
        last_llama_errors();
        ctx = llama_init_from_model(model, cp);
        if (ctx == nullptr) {
            throw std::runtime_error("llama.cpp could not create a context (n_ctx=" +
                                     std::to_string(p.n_ctx) + "): " + last_llama_errors());
        }
        n_batch = p.n_batch;
        batch = llama_batch_init(n_batch, 0, p.n_seq_max);  // a draft tree's tokens carry several ids
        vocab = llama_model_get_vocab(model);
        n_vocab = llama_vocab_n_tokens(vocab);
    }
    ~Context() {
        llama_batch_free(batch);
        llama_free(ctx);
    }

    void clear_batch() { batch.n_tokens = 0; }
    bool batch_full() const { return batch.n_tokens >= n_batch; }

    // Appends a token; returns its index in the batch (the logits row when `logits`).
    int add(int32_t token, int32_t pos, int seq, bool logits) {
        const int i = batch.n_tokens++;
        batch.token[i] = token;
        batch.pos[i] = pos;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = seq;
        batch.logits[i] = logits;
        return i;
    }

    // Appends a token shared by the sequences ids[0..n) (a draft tree's node: one id per branch
    // through it; the first decides what it attends to, so every id must hold its path).
    int add_shared(int32_t token, int32_t pos, const int* ids, int n, bool logits) {
        const int i = batch.n_tokens++;
        batch.token[i] = token;
        batch.pos[i] = pos;
        batch.n_seq_id[i] = n;
        for (int j = 0; j < n; ++j) batch.seq_id[i][j] = ids[j];
        batch.logits[i] = logits;
        return i;
    }

    // Milliseconds spent inside llama_decode + llama_synchronize by this context since it was
    // made (every decode goes through decode() below): the loops take deltas of it to split a
    // round into llama.cpp's time and the engine's own (StepTimes::llama).
    double llama_ms = 0;

    // Decodes the batch and waits for the device, so that the caller's timer stops after the work.
    void decode(const char* what) {
        int rc;
        {
            const ScopedMs timer(llama_ms);
            rc = llama_decode(ctx, batch);
            if (rc == 0) llama_synchronize(ctx);
        }
        if (rc != 0) {
            throw std::runtime_error(std::string("llama_decode failed during ") + what +
                                     " (code " + std::to_string(rc) +
                                     (rc == 1 ? ": no KV slot, the context is too small" : "") +
                                     "): " + last_llama_errors());
        }
    }

    const float* logits(int i) { return llama_get_logits_ith(ctx, i); }
    llama_memory_t memory() { return llama_get_memory(ctx); }

    // Milliseconds of llama_ms spent removing cells (remove_from).
    double kv_removal_ms = 0;

    // Drops sequence `seq`'s cells at positions >= pos. llama.cpp's removal scans every cell of
    // the cache (O(n_ctx)); the sequence's last position is O(1), so a removal with nothing to
    // remove costs nothing. Timed as llama.cpp time, and apart as KV removal.
    void remove_from(int seq, int32_t pos) {
        if (llama_memory_seq_pos_max(memory(), seq) < pos) return;
        if (seq >= 0 && seq < static_cast<int>(cached_prompts.size()) &&
            pos < static_cast<int32_t>(cached_prompts[seq].size())) {
            forget_prompts();  // a prompt's own cells go: never reuse them
        }
        bool removed;
        {
            const ScopedMs inside_llama(llama_ms);
            const ScopedMs removal(kv_removal_ms);
            removed = llama_memory_seq_rm(memory(), seq, pos, -1);
        }
        if (!removed) {  // a recurrent or hybrid memory cannot drop a suffix: never go on inconsistent
            throw std::runtime_error("llama.cpp refused to drop sequence " + std::to_string(seq) +
                                     "'s cells from position " + std::to_string(pos) + " (its memory cannot roll back)");
        }
    }
};

// ---------------------------------------------------------------------------------------------
// Per-sequence decoding state.
// ---------------------------------------------------------------------------------------------
struct Engine::Sequence {
    int id = 0;                        // llama seq id (a serving slot)
    uint64_t key = 0;                  // the RNG's sequence key (generate: id; serving: the request)
    int label = 0;                     // task label (serving: the request's; generate: 0)
    int n_predict = 0;                 // tokens this sequence generates at most
    std::vector<int32_t> prompt;
    int32_t n_past_target = 0;         // tokens in the target KV cache
    int32_t n_past_draft = 0;          // tokens in the draft KV cache
    std::vector<int32_t> draft_todo;   // emitted tokens the draft has not consumed (ends in pending)
    std::vector<int32_t> out;          // generated tokens; out.back() is pending (not in target KV)
    std::vector<float> margins;
    std::vector<PitPoint> pit;
    std::vector<DecisionPoint> decisions;  // record_pit: the rejection rule's drafts reached
    bool done = false;
    SeqCounts counts;

    int32_t pending() const { return out.back(); }
    int64_t next_index() const { return static_cast<int64_t>(out.size()); }
};

// ---------------------------------------------------------------------------------------------
// Pieces of the decoding loops shared by the closed batch and serving (round_loop.cpp).
// ---------------------------------------------------------------------------------------------
// Samples token number `index` of the sequence keyed `key` from target logits: greedy at
// temperature 0, else inverse CDF with the position-keyed uniform (the same draw in baseline and
// `match`). Appends the top-2 logit margin to `margins` when the caller records them.
int32_t sample_target(const float* logits, int n_vocab, const GenerateParams& p, uint64_t key, int64_t index,
                      std::vector<float>& margins, SoftmaxNorm& norm);
// The sequence reached its n_predict, or emitted an end-of-generation token (when stopping at one).
bool finished(const Engine::Sequence& seq, const GenerateParams& p, const llama_vocab* vocab);
// Zeroed per-position counts for draft length k (a sequence's SeqCounts before its first round).
void reset_counts(SeqCounts& counts, int k);
// Busy-waits `ms` (engine work that llama.cpp never sees; a planted slowdown, acceptor.h).
void spin_for_ms(double ms);
// The median of timings (cost_curve.cpp): the cost curve's and the spec policy's start-up.
double median_of(std::vector<double> v);
// Accounts one engine iteration for the steady-state window: `active` sequences took part,
// `emitted` tokens came out, `ms` it took (the sum of the step buckets it was charged to).
void count_iteration(GenerateResult& r, int active, int64_t emitted, double ms);
// Prefill callback that samples each sequence's first token (index 0) from its last prompt logits.
std::function<void(Engine::Sequence&, const float*)> sample_first_token(const GenerateParams& p, int n_vocab);

// Scratch of the acceptance walk, reused across rounds and sequences.
struct AcceptScratch {
    SoftmaxNorm norm;  // the target's softmax at the position being judged
    std::vector<float> p_probs, residual, pit_probs;
    std::vector<double> decision_probs;  // record_pit's own p (decision_point)
};

}  // namespace specnative
