// The speculative round, written once for chains, trees and serving. Every decoding loop of the
// engine runs the same phases; only how a proposal is shaped differs, and that is Proposals'
// (round.h):
//
//   prologue  the drafter exists before the target's prefill (a hidden-state drafter sets the
//             target's feature extraction and reads every prefill chunk); the target prefills,
//             each sequence samples its first token, its counts are zeroed and the shape sees its
//             prompt (a tree copies it to its branch ids); the drafter takes in the prompts.
//             generate(): all at once (run_rounds); serve(): one slot at a time, as it admits.
//   draft     per sequence, a proposal within its budget (n_predict leaves room for the
//             correction or bonus token): a chain of 0..k tokens, a tree, or nothing.
//   verify    one target batch: every decoding sequence's pending token and proposal (serving:
//             then the prompt chunks of slots still prefilling), one llama_decode.
//   read      a drafter that reads the target takes the batch's features.
//   accept    per sequence: the acceptance rule walks its proposal (a chain's rows in order, a
//             tree from its root), counts, rolls the target's KV back to the accepted tokens
//             (a tree's branch ids all to the accepted path), tells the drafter, emits the
//             accepted tokens and the correction or bonus token.
//   after     a drafter that reads the target ingests what was accepted (a tree's paths).
//
// generate() runs the rounds below until every sequence is done; serve() (serve_loop.cpp) runs
// the same phases once per iteration between its admissions and completions. A closed batch is
// not run as serving with every request arriving at once: serving spreads prompts over the
// decoding batches (prefill interference, its measurement) where generate() prefills every
// prompt first, its shared prefix once, in the batch shapes the lossless checks replay.
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "acceptor.h"
#include "drafter.h"
#include "engine.h"
#include "engine_internal.h"
#include "round.h"
#include "spec_policy.h"
#include "tree_acceptor.h"
#include "tree_drafter.h"

namespace specnative {

namespace {

int active(const std::vector<Engine::Sequence>& seqs) {
    int n = 0;
    for (const auto& seq : seqs) n += seq.done ? 0 : 1;
    return n;
}

// A round's time in the decoding buckets (the policy's own included).
double round_ms(const StepTimes& t) { return t.draft + t.draft_ingest + t.verify + t.resample + t.policy; }

int64_t generated(const std::vector<Engine::Sequence>& seqs) {
    int64_t n = 0;
    for (const auto& seq : seqs) n += static_cast<int64_t>(seq.out.size());
    return n;
}

// No proposal (serving's baseline): the pending token alone, the next token sampled from its logits.
class StepProposals final : public Proposals {
public:
    StepProposals(Engine::Context& target, const Acceptor& rule, const GenerateParams& p, int n_seq)
        : t_(target), rule_(rule), p_(p), row_(n_seq) {}
    void reset_counts(SeqCounts& counts) const override { specnative::reset_counts(counts, 0); }
    void release(const Engine::Sequence& seq) override { t_.remove_from(seq.id, 0); }
    int budget(const Engine::Sequence& /*seq*/) const override { return 0; }
    void place(const Engine::Sequence& seq, int s) override {
        row_[s] = t_.add(seq.pending(), seq.n_past_target, seq.id, true);
    }
    void accept(Engine::Sequence& seq, int s) override { step_baseline(seq, t_.logits(row_[s]), t_, p_, norm_, rule_); }

private:
    Engine::Context& t_;
    const Acceptor& rule_;
    const GenerateParams& p_;
    std::vector<int> row_;
    SoftmaxNorm norm_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// The loops' shared pieces (engine_internal.h)
// ---------------------------------------------------------------------------------------------
// Accounts one engine iteration for the steady-state window: `active` sequences took part,
// `emitted` tokens came out, `ms` it took (the sum of the step buckets it was charged to).
void count_iteration(GenerateResult& r, int active, int64_t emitted, double ms) {
    r.steps += 1;
    r.active_sum += active;
    if (active == r.n_seq) {
        r.steady_steps += 1;
        r.steady_tokens += emitted;
        r.steady_ms += ms;
    }
}

// Prefill callback that samples each sequence's first token (index 0) from its last prompt logits.
std::function<void(Engine::Sequence&, const float*)> sample_first_token(const GenerateParams& p, int n_vocab) {
    return [&p, n_vocab, norm = SoftmaxNorm()](Engine::Sequence& seq, const float* logits) mutable {
        seq.out.push_back(sample_target(logits, n_vocab, p, seq.key, 0, seq.margins, norm));
    };
}

int32_t sample_target(const float* logits, int n_vocab, const GenerateParams& p, uint64_t key, int64_t index,
                      std::vector<float>& margins, SoftmaxNorm& norm) {
    if (p.record_margins) margins.push_back(argmax_with_margin(logits, n_vocab).margin);
    if (p.temperature <= 0.0f) return argmax(logits, n_vocab);
    softmax_norm(logits, n_vocab, p.temperature, norm);
    return sample_softmax(logits, n_vocab, norm, keyed_uniform(p.seed, key, index, Stream::target));
}

bool finished(const Engine::Sequence& seq, const GenerateParams& p, const llama_vocab* vocab) {
    return static_cast<int>(seq.out.size()) >= seq.n_predict ||
           (p.stop_at_eog && llama_vocab_is_eog(vocab, seq.out.back()));
}

void reset_counts(SeqCounts& counts, int k) {
    counts = SeqCounts{};
    counts.drafted_at.assign(k, 0);
    counts.accepted_at.assign(k, 0);
    counts.accept_len_hist.assign(k + 1, 0);
    counts.k_chosen_hist.assign(k + 1, 0);
}

// Spins (no sleep: the thread stays busy, as real engine work would) so that tests can check the
// engine's own time grows by what was added while llama.cpp's does not.
void spin_for_ms(double ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(ms);
    while (std::chrono::steady_clock::now() < until) {
    }
}

void step_baseline(Engine::Sequence& seq, const float* logits, const Engine::Context& target,
                   const GenerateParams& p, SoftmaxNorm& norm, const Acceptor& rule) {
    const int32_t token = sample_target(logits, target.n_vocab, p, seq.key, seq.next_index(), seq.margins, norm);
    seq.n_past_target += 1;
    seq.out.push_back(token);
    seq.done = finished(seq, p, target.vocab);
    rule.after_accept_phase(1);
}

std::unique_ptr<Proposals> make_step_proposals(Engine::Context& target, const Acceptor& rule,
                                               const GenerateParams& p, int n_seq) {
    return std::make_unique<StepProposals>(target, rule, p, n_seq);
}

// The run's proposals and their drafter: a tree (the draft model or the EAGLE-3 head), a chain
// (the draft model, an n-gram lookup, a hidden-state drafter), or none (spec off).
std::unique_ptr<Proposals> Engine::make_proposals(const GenerateParams& p, int n_seq) {
    Context& t = *target_;
    if (!p.spec) return make_step_proposals(t, *acceptor_, p, n_seq);
    auto prefill_draft = [this, reuse = p.reuse_prompts](std::vector<Sequence>& ss, int shared) {
        prefill(*draft_, ss, shared, {}, {}, reuse);
    };
    if (p.tree.on()) {
        std::unique_ptr<TreeDrafter> drafter =
            p.drafter.type == "eagle3" ? make_eagle3_tree_drafter(*hidden_, t, p, n_seq)
                                       : make_model_tree_drafter(*draft_, prefill_draft, p, t.n_vocab, n_seq);
        return make_tree_proposals(t, *tree_acceptor_, std::move(drafter), p, n_seq);
    }
    const bool hidden = is_hidden_drafter(p.drafter.type);
    std::unique_ptr<Drafter> drafter =
        hidden ? make_hidden_drafter(*hidden_, t, p, n_seq, acceptor_->trims_draft_cache())
        : p.drafter.type != "model" ? make_ngram_drafter(p.drafter, p, n_seq, t.n_vocab)
                                    : make_model_drafter(*draft_, prefill_draft, p, t.n_vocab, n_seq);
    return make_chain_proposals(t, *acceptor_, std::move(drafter), p, n_seq, hidden);
}

// generate()'s speculative run: the prologue, then one round per iteration until every sequence
// is done (the phases above), each phase charged to its step bucket.
GenerateResult Engine::run_rounds(std::vector<Sequence>& seqs, int shared_prefix, const GenerateParams& p,
                                  const std::function<bool()>& should_stop) {
    GenerateResult r;
    r.speculative = true;
    PhaseClock clock;
    Context& t = *target_;
    const int n_seq = static_cast<int>(seqs.size());

    // ---- prologue --------------------------------------------------------------------------------
    std::unique_ptr<Proposals> shape = make_proposals(p, n_seq);
    clock.charge(r.times.prefill_draft);
    double ingest_in_prefill = 0;  // a reading drafter's ingest of the prefill is the draft's prefill
    const bool reads = shape->reads_target();
    AfterDecode ingest;
    if (reads) {
        ingest = [&](const llama_batch& batch) {
            const ScopedMs timer(ingest_in_prefill);
            shape->read_prefill(batch);
        };
    }
    prefill(t, seqs, shared_prefix, sample_first_token(p, t.n_vocab), ingest, p.reuse_prompts && !reads);
    if (reads) t.forget_prompts();  // cells made under the drafter's settings
    for (Sequence& seq : seqs) {
        shape->prompt_ready(seq);
        seq.done = finished(seq, p, t.vocab);
        shape->reset_counts(seq.counts);
    }
    clock.charge(r.times.prefill_target);
    r.times.prefill_target -= ingest_in_prefill;
    r.times.prefill_draft += ingest_in_prefill;
    shape->begin(seqs, shared_prefix);
    clock.charge(r.times.prefill_draft);
    const std::unique_ptr<SpecPolicy> policy = make_policy(p, n_seq, policy_memory());
    const bool steered = !policy->is_static();  // static: the policy only records k
    if (policy->measures_at_start()) {
        policy->start(t, p.drafter.type == "model" ? draft_ : nullptr, seqs);
        clock.charge(r.times.policy);
        r.times.policy_startup = r.times.policy;
    }
    // Time inside llama.cpp from here on: target and draft decodes, and the drafter's own library calls.
    const auto llama_now = [&] { return t.llama_ms + (draft_ ? draft_->llama_ms : 0.0) + shape->library_ms(); };
    const double llama_before = llama_now();
    const auto removal_now = [&] { return t.kv_removal_ms + (draft_ ? draft_->kv_removal_ms : 0.0) + shape->kv_ms(); };
    const double removal_before = removal_now();

    // ---- rounds ----------------------------------------------------------------------------------
    std::vector<int> budget(n_seq);
    r.n_seq = n_seq;
    while (true) {
        if (should_stop && should_stop()) throw Interrupted();
        const int active_now = active(seqs);
        const int64_t tokens_before = generated(seqs);
        const StepTimes before = r.times;
        const double catch_up_before = shape->catch_up_ms();
        if (active_now == 0) break;
        for (int s = 0; s < n_seq; ++s) budget[s] = seqs[s].done ? -1 : shape->budget(seqs[s]);
        policy->decide(seqs, budget, active_now);
        if (steered) clock.charge(r.times.policy);

        shape->draft(seqs, budget);
        clock.charge(r.times.draft);

        t.clear_batch();
        for (int s = 0; s < n_seq; ++s) {
            if (!seqs[s].done) shape->place(seqs[s], s);
        }
        t.decode("verify");
        clock.charge(r.times.verify);
        const int verify_rows = t.batch.n_tokens;
        shape->read_verify(t.batch, t.batch.n_tokens);
        clock.charge(r.times.draft_ingest);

        for (int s = 0; s < n_seq; ++s) {
            if (!seqs[s].done) shape->accept(seqs[s], s);
        }
        acceptor_->after_accept_phase(active_now);
        clock.charge(r.times.resample);
        shape->after_accept();
        clock.charge(r.times.draft_ingest);
        if (steered) {
            policy->observe(seqs, budget, round_cost(before, r.times, verify_rows, shape->catch_up_ms() - catch_up_before));
            clock.charge(r.times.policy);
        }
        count_iteration(r, active_now, generated(seqs) - tokens_before, round_ms(r.times) - round_ms(before));
    }
    r.times.llama = llama_now() - llama_before;
    r.times.kv_removal = removal_now() - removal_before;
    r.times.total = clock.elapsed_ms();
    return r;
}

}  // namespace specnative
