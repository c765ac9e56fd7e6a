// Continuous batching: the engine as a server under load (serve.h). One iteration:
//   1. admit: every free slot takes the next request that has arrived (first come, first served);
//      with the prefix cache the shared prefix's cells are copied into its sequence (or, before
//      the prefix is in the cache, it waits for the holder sequence that prefills it);
//   2. draft (spec): the drafter proposes up to k tokens for every decoding slot (or a draft tree:
//      each slot's branches are sequence ids of its own, tree_drafter.h);
//      steps 2 to 5 are the round every loop shares (round_loop.cpp), its proposals' shape
//      behind Proposals (round.h: a chain, a tree, or the baseline's pending token alone);
//   3. one target llama_decode: decoding slots' pending (+ drafts) first, then prompt chunks of
//      prefilling slots (the shared prefix's holder first) in admission order while the batch has
//      room (at most n_batch tokens); each sequence's tokens are contiguous in the batch;
//   4. a hidden-state drafter reads the batch's features (common_speculative_process over the
//      whole mixed batch, as llama-server after each decode: prompt chunks and verify tokens);
//   5. accept or sample per decoding slot (then a tree drafter that reads the target ingests the
//      accepted paths), first token for a slot whose prompt ended in the batch; finished requests
//      free their KV cells (target and draft);
//   6. the drafter takes in the prompts of slots that just got their first token (the draft
//      model prefills them; a hidden-state drafter begins the slot's history).
// With no slot busy it waits (real time) for the next arrival, or jumps there (virtual clock).
#include "acceptor.h"
#include "serve.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

#include "drafter.h"
#include "engine_internal.h"
#include "round.h"
#include "spec_policy.h"

namespace specnative {

namespace {

constexpr double kWaitPollMs = 5.0;  // an idle wait checks should_stop at least this often

// KV cells the context's sequences still hold (each sequence's cells are contiguous positions).
int64_t cells_held(llama_memory_t memory, int n_seq) {
    int64_t cells = 0;
    if (memory == nullptr) return 0;
    for (llama_seq_id s = 0; s < n_seq; ++s) {
        const llama_pos hi = llama_memory_seq_pos_max(memory, s);
        if (hi >= 0) cells += hi - llama_memory_seq_pos_min(memory, s) + 1;
    }
    return cells;
}

// The serving clock: real time since the start, plus what a virtual clock skipped.
class ServeClock {
public:
    explicit ServeClock(bool virtual_clock) : virtual_(virtual_clock), start_(std::chrono::steady_clock::now()) {}
    double now_ms() const {
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count() +
               skipped_ms_;
    }
    // Until `when_ms`: sleeps in short pieces (polling `should_stop`), or jumps when virtual.
    void wait_until(double when_ms, const std::function<bool()>& should_stop) {
        if (virtual_) {
            skipped_ms_ += std::max(0.0, when_ms - now_ms());
            return;
        }
        for (double left = when_ms - now_ms(); left > 0; left = when_ms - now_ms()) {
            if (should_stop && should_stop()) throw Interrupted();
            std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(std::min(left, kWaitPollMs)));
        }
    }
    double skipped_ms() const { return skipped_ms_; }

private:
    bool virtual_;
    std::chrono::steady_clock::time_point start_;
    double skipped_ms_ = 0;
};

// The requests' common prompt prefix, short of each one's last token (every request feeds that
// itself for its first logits): what the prefix cache computes once. Prompts are checked non-empty.
int common_prefix(const std::vector<ServeRequest>& requests) {
    const std::vector<int32_t>& first = requests[0].prompt;
    size_t n = first.size() - 1;
    for (const ServeRequest& r : requests) {
        n = std::min(n, r.prompt.size() - 1);
        size_t i = 0;
        while (i < n && r.prompt[i] == first[i]) ++i;
        n = i;
    }
    return static_cast<int>(n);
}

}  // namespace

SeqCounts ServeResult::totals() const {
    std::vector<SeqCounts> all;
    all.reserve(requests.size());
    for (const RequestRecord& r : requests) all.push_back(r.counts);
    return sum_counts(all);
}

// Everything llama.cpp would abort on, refused before any state changes. Returns the prefix the
// prefix cache shares (0: none).
int Engine::validate_serve(const std::vector<ServeRequest>& requests, const ServeParams& sp) const {
    require_open();
    const int n_seq_max = params_.n_seq_max;
    if (requests.empty()) throw std::invalid_argument("no requests given");
    if (sp.max_concurrency < 1 || sp.max_concurrency > n_seq_max) {
        throw std::invalid_argument("max_concurrency must be in [1, n_seq_max=" + std::to_string(n_seq_max) +
                                    "], got " + std::to_string(sp.max_concurrency));
    }
    GenerateParams p = sp.gen;
    p.n_predict = 1;
    for (const ServeRequest& r : requests) p.n_predict = std::max(p.n_predict, r.n_predict);
    const int lookahead = validate_params(p, sp.max_concurrency);
    std::vector<int64_t> need(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
        const ServeRequest& r = requests[i];
        const std::string which = "request " + std::to_string(i);
        if (!std::isfinite(r.arrival_ms) || r.arrival_ms < 0) {
            throw std::invalid_argument(which + ": arrival time must be finite and >= 0");
        }
        if (i > 0 && r.arrival_ms < requests[i - 1].arrival_ms) {
            throw std::invalid_argument(which + " arrives before request " + std::to_string(i - 1) +
                                        ": requests must be in arrival order");
        }
        if (r.n_predict < 1) throw std::invalid_argument(which + ": output length must be >= 1");
        validate_prompt(static_cast<int>(i), r.prompt, r.n_predict, lookahead);
        need[i] = static_cast<int64_t>(r.prompt.size()) + r.n_predict + lookahead;
    }
    // A hidden-state drafter's draft cells come from each slot's own prefill (process() of its
    // chunks): the prefix is not shared with one, as generate() does not share it either.
    // Nor with draft trees: a slot's branches take sequence ids beside the slots, where the prefix's
    // holder would be.
    const bool hidden = p.spec && is_hidden_drafter(p.drafter.type);
    const int shared = p.prefix_cache && !hidden && !(p.spec && p.tree.on()) ? common_prefix(requests) : 0;
    if (shared > 0 && sp.max_concurrency >= n_seq_max) {
        throw std::invalid_argument("prefix_cache keeps the requests' common prefix (" + std::to_string(shared) +
                                    " tokens) in a sequence of its own beside the " +
                                    std::to_string(sp.max_concurrency) + " slots: the engine needs n_seq_max >= " +
                                    std::to_string(sp.max_concurrency + 1) + " (it has " + std::to_string(n_seq_max) +
                                    "), or pass prefix_cache=False");
    }
    // Worst case: the max_concurrency largest requests in the cache together; the target (and a
    // draft model's cache, share_prefix) holds the shared prefix once.
    std::sort(need.begin(), need.end(), std::greater<int64_t>());
    int64_t whole = 0;
    for (size_t i = 0; i < need.size() && i < static_cast<size_t>(sp.max_concurrency); ++i) whole += need[i];
    const int64_t slots = std::min<int64_t>(need.size(), sp.max_concurrency);
    const int64_t cells = shared > 0 ? whole - slots * shared + shared : whole;
    if (params_.kv_unified && cells > n_ctx()) {
        throw std::invalid_argument("the " + std::to_string(sp.max_concurrency) +
                                    " largest requests need " + std::to_string(cells) +
                                    " KV cells together but n_ctx is " + std::to_string(n_ctx()));
    }
    return shared;
}

ServeResult Engine::serve(const std::vector<ServeRequest>& requests, const ServeParams& sp,
                          const std::function<bool()>& should_stop) {
    const int shared = validate_serve(requests, sp);
    const GenerateParams& p = sp.gen;
    const int n_slots = sp.max_concurrency;
    reset_memory();
    forget_last_run();  // pending_logits() refers to generate()'s sequences, gone now
    if (hidden_ != nullptr) llama_memory_clear(llama_get_memory(hidden_->ctx), true);  // a generate()'s draft cells

    Context& t = *target_;
    ServeResult r;
    r.requests.resize(requests.size());
    r.max_concurrency = n_slots;
    r.speculative = p.spec;
    r.shared_prefix = shared;
    std::vector<Sequence> slots(n_slots);
    std::vector<int> request_of(n_slots, -1);  // -1: the slot is free
    for (int s = 0; s < n_slots; ++s) {
        slots[s].id = s;
        slots[s].done = true;
    }
    // made before any prefill: a hidden-state drafter switches the target's feature extraction on
    std::unique_ptr<Proposals> shape = make_proposals(p, n_slots);
    const bool ingests = shape->reads_target();  // the drafter reads every target batch

    // The prefix cache's holder: sequence n_slots prefills the shared prefix once (no logits), its
    // cells are then copied into each admitted slot. The request whose admission started it is
    // charged with its tokens; slots admitted before it is in the cache wait for it.
    const int holder_id = n_slots;
    Sequence holder;
    holder.id = holder_id;
    if (shared > 0) holder.prompt.assign(requests[0].prompt.begin(), requests[0].prompt.begin() + shared);
    shape->share_prefix(shared, holder_id);  // a draft model's cache shares it likewise
    bool holder_started = false, holder_ready = false;
    int holder_request = -1;
    std::vector<char> waits_prefix(n_slots, 0);
    const auto seq_at = [&](int s) -> Sequence& { return s == holder_id ? holder : slots[s]; };

    PhaseClock clock;
    const std::unique_ptr<SpecPolicy> policy = make_policy(p, n_slots, policy_memory());
    const bool steered = p.spec && !policy->is_static();  // static: the policy only records k
    if (p.spec && policy->measures_at_start()) {  // before the serving clock starts: no request waits for it
        policy->start(t, p.drafter.type == "model" ? draft_ : nullptr, slots);
        clock.charge(r.times.policy);
        r.times.policy_startup = r.times.policy;
    }
    ServeClock serve_clock(sp.virtual_clock);
    // llama.cpp time is added to times.llama only for the phases charged to decoding buckets.
    const auto llama_now = [&] { return t.llama_ms + (draft_ ? draft_->llama_ms : 0.0) + shape->library_ms(); };
    const auto removal_now = [&] { return t.kv_removal_ms + (draft_ ? draft_->kv_removal_ms : 0.0) + shape->kv_ms(); };
    double llama_mark = llama_now(), removal_mark = removal_now();
    const auto charge = [&](double& bucket, bool decoding) {
        clock.charge(bucket);
        const double llama = llama_now(), removal = removal_now();
        if (decoding) {
            r.times.llama += llama - llama_mark;
            r.times.kv_removal += removal - removal_mark;
        }
        llama_mark = llama;
        removal_mark = removal;
    };

    size_t next = 0;                // the next request to admit
    std::deque<int> prefilling;     // slots whose prompt is not all in the target cache, by admission
    std::vector<int> last_row(n_slots), emitted_before(n_slots);
    std::vector<int> budget(n_slots);
    SoftmaxNorm norm;  // first tokens' sampling
    std::vector<int> first_token_now;  // slots that got their first token this iteration
    size_t completed = 0;

    while (completed < requests.size()) {
        if (should_stop && should_stop()) throw Interrupted();
        // ---- admit ---------------------------------------------------------------------------
        for (int s = 0; s < n_slots && next < requests.size(); ++s) {
            if (request_of[s] >= 0 || requests[next].arrival_ms > serve_clock.now_ms()) continue;
            const int i = static_cast<int>(next++);
            Sequence& seq = slots[s];
            seq = Sequence{};
            seq.id = s;
            seq.key = static_cast<uint64_t>(i);
            seq.n_predict = requests[i].n_predict;
            seq.label = requests[i].label;
            seq.prompt = requests[i].prompt;
            shape->reset_counts(seq.counts);
            request_of[s] = i;
            if (shared > 0 && holder_ready) {  // the prefix's cells are in the cache: shared, not fed
                llama_memory_seq_cp(t.memory(), holder_id, s, -1, -1);
                seq.n_past_target = shared;
            } else if (shared > 0) {
                waits_prefix[s] = 1;
                if (!holder_started) {
                    holder_started = true;
                    holder_request = i;
                    prefilling.push_back(holder_id);
                }
            }
            prefilling.push_back(s);
            RequestRecord& rec = r.requests[i];
            rec.slot = s;
            rec.arrival_ms = requests[i].arrival_ms;
            rec.admitted_ms = serve_clock.now_ms();
            r.admission_order.push_back(i);
        }
        int busy = 0, decoding = 0;
        for (int s = 0; s < n_slots; ++s) {
            busy += request_of[s] >= 0 ? 1 : 0;
            decoding += request_of[s] >= 0 && !slots[s].out.empty() ? 1 : 0;
        }
        if (busy == 0) {  // every slot free, the next request not there yet
            serve_clock.wait_until(requests[next].arrival_ms, should_stop);
            charge(r.idle_ms, false);
            continue;
        }

        // ---- draft ---------------------------------------------------------------------------
        const StepTimes before = r.times;
        const double catch_up_before = shape->catch_up_ms();
        if (p.spec && decoding > 0) {
            for (int s = 0; s < n_slots; ++s) {
                const bool decodes = request_of[s] >= 0 && !slots[s].out.empty();
                budget[s] = decodes ? shape->budget(slots[s]) : -1;
            }
            policy->decide(slots, budget, decoding);
            if (steered) charge(r.times.policy, true);
            shape->draft(slots, budget);
            charge(r.times.draft, true);
        }

        // ---- one target batch: decode/verify tokens, then prompt chunks ----------------------
        t.clear_batch();
        for (int s = 0; s < n_slots; ++s) {
            Sequence& seq = slots[s];
            last_row[s] = -1;
            emitted_before[s] = static_cast<int>(seq.out.size());
            if (request_of[s] >= 0 && !seq.out.empty()) shape->place(seq, s);
        }
        const int decode_tokens = t.batch.n_tokens;
        for (int s : prefilling) {
            if (t.batch_full()) break;
            if (s != holder_id && waits_prefix[s]) continue;  // its prefix comes from the holder, once decoded
            Sequence& seq = seq_at(s);
            const bool is_holder = s == holder_id;
            const int32_t n_prompt = static_cast<int32_t>(seq.prompt.size());
            RequestRecord& rec = r.requests[is_holder ? holder_request : request_of[s]];
            rec.prefill_batches += 1;
            const int32_t fed_from = seq.n_past_target;
            while (seq.n_past_target < n_prompt && !t.batch_full()) {
                const bool last = !is_holder && seq.n_past_target + 1 == n_prompt;
                const int at = t.add(seq.prompt[seq.n_past_target], seq.n_past_target, seq.id, last);
                if (last) last_row[s] = at;
                seq.n_past_target += 1;
            }
            rec.prefill_tokens += seq.n_past_target - fed_from;
        }
        const int prompt_tokens = t.batch.n_tokens - decode_tokens;
        t.decode(decode_tokens > 0 ? (p.spec ? "serve verify" : "serve decode") : "serve prefill");
        double& step_bucket = decode_tokens == 0 ? r.times.prefill_target : p.spec ? r.times.verify : r.times.decode;
        charge(step_bucket, decode_tokens > 0);
        if (ingests) {  // before the accept: the verify rows' features are the ones accept keeps
            shape->read_verify(t.batch, decode_tokens);
            charge(decode_tokens > 0 ? r.times.draft_ingest : r.times.prefill_draft, decode_tokens > 0);
        }
        if (holder_started && !holder_ready && holder.n_past_target == shared) {  // the prefix is cached now
            holder_ready = true;
            prefilling.erase(std::find(prefilling.begin(), prefilling.end(), holder_id));
            for (int s = 0; s < n_slots; ++s) {
                if (!waits_prefix[s]) continue;
                llama_memory_seq_cp(t.memory(), holder_id, s, -1, -1);
                slots[s].n_past_target = shared;
                waits_prefix[s] = 0;
            }
        }

        // ---- accept or sample; first tokens; completions --------------------------------------
        for (int s = 0; s < n_slots; ++s) {
            if (request_of[s] >= 0 && emitted_before[s] > 0) shape->accept(slots[s], s);
        }
        if (p.spec && decode_tokens > 0) {  // a tree drafter that reads the target: the accepted paths
            charge(r.times.resample, true);
            shape->after_accept();
            charge(r.times.draft_ingest, true);
        }
        if (steered && decode_tokens > 0) {  // before the completions take the finished slots' counts
            policy->observe(slots, budget, round_cost(before, r.times, prompt_tokens == 0 ? decode_tokens : 0,
                                                         shape->catch_up_ms() - catch_up_before));
            charge(r.times.policy, true);
        }
        first_token_now.clear();
        for (int s = 0; s < n_slots; ++s) {
            if (last_row[s] < 0) continue;
            Sequence& seq = slots[s];
            shape->prompt_ready(seq);  // a tree: every branch id holds the prompt
            seq.out.push_back(sample_target(t.logits(last_row[s]), t.n_vocab, p, seq.key, 0, seq.margins, norm));
            seq.done = finished(seq, p, t.vocab);
            prefilling.erase(std::find(prefilling.begin(), prefilling.end(), s));
            first_token_now.push_back(s);
        }
        const double stamp = serve_clock.now_ms();  // what this iteration emitted is out now
        for (int s = 0; s < n_slots; ++s) {
            if (request_of[s] < 0) continue;
            Sequence& seq = slots[s];
            RequestRecord& rec = r.requests[request_of[s]];
            const int n_new = static_cast<int>(seq.out.size()) - emitted_before[s];
            if (n_new > 0) {
                if (emitted_before[s] == 0) rec.first_token_ms = stamp;
                rec.emit_ms.push_back(stamp);
                rec.emit_tokens.push_back(n_new);
            }
            if (!seq.done) continue;
            rec.finish_ms = stamp;
            rec.tokens = std::move(seq.out);
            rec.counts = std::move(seq.counts);
            shape->release(seq);  // the slot's cells (every id it used, target and draft) are free
            seq.out.clear();
            request_of[s] = -1;
            completed += 1;
            r.duration_ms = stamp;
        }
        r.steps += 1;
        r.decode_steps += decode_tokens > 0 ? 1 : 0;
        r.mixed_steps += decode_tokens > 0 && prompt_tokens > 0 ? 1 : 0;
        r.busy_sum += busy;
        r.decoding_sum += decoding;
        r.prefill_tokens += prompt_tokens;
        acceptor_->after_accept_phase(decoding);
        charge(decode_tokens == 0 ? r.times.prefill_target : p.spec ? r.times.resample : r.times.decode,
               decode_tokens > 0);

        // ---- the drafter takes in the new prompts ---------------------------------------------
        if (p.spec) {
            bool admitted = false;
            for (int s : first_token_now) {
                if (request_of[s] < 0) continue;  // finished on its first token
                shape->admit(slots[s]);
                admitted = true;
            }
            if (admitted) charge(r.times.prefill_draft, false);
        }
    }
    if (holder_started) t.remove_from(holder_id, 0);  // the prefix's cells go with the last request
    shape->share_prefix(0, holder_id);
    r.times.total = clock.elapsed_ms();
    r.skipped_ms = serve_clock.skipped_ms();
    const int n_seq_max = static_cast<int>(llama_n_seq_max(t.ctx));
    r.kv_cells_left = cells_held(t.memory(), n_seq_max) + (draft_ ? cells_held(draft_->memory(), n_seq_max) : 0) +
                      (hidden_ ? cells_held(llama_get_memory(hidden_->ctx), n_seq_max) : 0);
    return r;
}

}  // namespace specnative
