// Serving under load (serve.cpp): requests arrive at their own times, up to max_concurrency
// slots decode together, a free slot admits the next arrived request, and its prompt is prefilled
// in chunks inside the same llama_decode batches as the other slots' decode or verify tokens
// (bounded by n_batch, as llama-server does), so that prefill interference is measured.
// Every drafter family runs under load: the draft model takes in each prompt when its request
// starts decoding; the hidden-state drafters read the features of every mixed batch (other slots'
// prompt chunks and verify tokens together) and keep per-slot draft cells, as llama-server runs
// them. Prefix caching (gen.prefix_cache): the requests' common prefix is prefilled once into a
// sequence of its own beside the slots and copied into each admitted slot's sequence.
#pragma once

#include <cstdint>
#include <vector>

#include "engine.h"

namespace specnative {

// One request: a generic (arrival time, prompt tokens, output length) triple, so that any source
// (a seeded arrival process over a prompt suite, a dataset with recorded reply lengths, a trace
// file) can feed the engine.
struct ServeRequest {
    double arrival_ms = 0;  // since the start of serve(); non-decreasing along the list
    std::vector<int32_t> prompt;
    int n_predict = 1;  // output length in tokens (the first included)
    int label = 0;      // the request's task label: an adaptive policy pools acceptance by it
};

struct ServeParams {
    // spec, k, drafter, temperature, rule, seed, stop_at_eog (not n_predict), and prefix_cache: the
    // requests' common prompt prefix (a shared context ahead of each request's own prompt) is
    // computed once into a holder sequence (id max_concurrency, so the engine needs n_seq_max >
    // max_concurrency) and copied (llama_memory_seq_cp) into every admitted slot, which prefills
    // only its own part; off: every request prefills its whole prompt, as a server without prompt
    // caching. The hidden-state drafters keep per-slot draft cells from each request's own
    // prefill: with them the prefix is not shared (ServeResult::shared_prefix says 0).
    GenerateParams gen;
    int max_concurrency = 1;   // slots (llama-server's -np)
    bool virtual_clock = false;  // idle waits are skipped: the clock jumps to the next arrival
};

// One request's life; times are ms since the start of serve() on the serving clock (real wall
// time, plus the idle time a virtual clock skipped).
struct RequestRecord {
    int slot = -1;
    double arrival_ms = 0, admitted_ms = 0, first_token_ms = 0, finish_ms = 0;
    std::vector<int32_t> tokens;
    // One entry per iteration that emitted tokens for this request: when, and how many (a
    // speculative round emits its accepted drafts and the correction together).
    std::vector<double> emit_ms;
    std::vector<int32_t> emit_tokens;
    int prefill_batches = 0;  // target batches its prompt was spread over
    // Prompt tokens the target fed for this request: its whole prompt, or with the prefix cache
    // its own part (the request whose admission started the shared prefix is charged with it too).
    int prefill_tokens = 0;
    SeqCounts counts;         // exact drafted/accepted of this request's rounds
};

struct ServeResult {
    std::vector<RequestRecord> requests;   // in the order given
    std::vector<int32_t> admission_order;  // request indices in the order slots admitted them
    // Step buckets: an iteration whose target batch carries decode or verify tokens is charged to
    // draft/verify/resample (spec) or decode (baseline), prompt chunks riding along included; an
    // iteration of prompt chunks alone to prefill_target; the draft model's prompt to
    // prefill_draft. llama and kv_removal as in generate(), over the decoding buckets.
    StepTimes times;
    double idle_ms = 0;     // waited for the next arrival with every slot free (real time)
    double skipped_ms = 0;  // virtual clock: idle time jumped over instead of waited
    double duration_ms = 0; // serving clock at the last completion
    int64_t steps = 0;         // iterations (one target llama_decode each)
    int64_t decode_steps = 0;  // of those, with decode or verify tokens
    int64_t mixed_steps = 0;   // of those, with prompt tokens in the same batch
    int64_t busy_sum = 0;      // slots holding a request (prefilling or decoding), summed over steps
    int64_t decoding_sum = 0;  // slots decoding, summed over steps
    int64_t prefill_tokens = 0;  // every prompt token the target fed (the per-request counts summed)
    int shared_prefix = 0;       // tokens of the prefix the prefix cache shared (0: none shared)
    int64_t kv_cells_left = 0;  // target and draft (model or hidden) cells held at the end (0: none leaked)
    int max_concurrency = 0;
    bool speculative = false;

    SeqCounts totals() const;
};

}  // namespace specnative
