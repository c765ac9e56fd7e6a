// Serving under load (serve.cpp): requests arrive at their own times, up to max_concurrency
// slots decode together, a free slot admits the next arrived request, and its prompt is prefilled
// in chunks inside the same llama_decode batches as the other slots' decode or verify tokens
// (bounded by n_batch, as llama-server does), so that prefill interference is measured.
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
};

struct ServeParams {
    GenerateParams gen;        // spec, k, drafter, temperature, rule, seed, stop_at_eog (not n_predict)
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
    int64_t prefill_tokens = 0;
    int64_t kv_cells_left = 0;  // target and draft cells still held at the end (0: nothing leaked)
    int max_concurrency = 0;
    bool speculative = false;

    SeqCounts totals() const;
};

}  // namespace specnative
