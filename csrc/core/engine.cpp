// The engine's facade: construction and small queries, prefill, generate() (the baseline's
// steps here; the speculative rounds in round_loop.cpp, whatever the proposals' shape), and the
// probes of the cache a run left. Validation: engine_checks.cpp; the result's derived
// quantities: results.cpp; serving: serve_loop.cpp.
#include "engine.h"
#include "engine_internal.h"

#include <algorithm>
#include <stdexcept>

#include "acceptor.h"
#include "drafter.h"
#include "phase_clock.h"
#include "round.h"
#include "sampling.h"
#include "tree_acceptor.h"
#include "vocab_check.h"

namespace specnative {

namespace {

int64_t generated(const std::vector<Engine::Sequence>& seqs) {
    int64_t n = 0;
    for (const auto& seq : seqs) n += static_cast<int64_t>(seq.out.size());
    return n;
}

int active(const std::vector<Engine::Sequence>& seqs) {
    int n = 0;
    for (const auto& seq : seqs) n += seq.done ? 0 : 1;
    return n;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction and small queries
// ---------------------------------------------------------------------------------------------
namespace {
void refuse_unsupported(const llama_model* model, const std::string& path, bool speculative) {
    const std::string why = generation_unsupported(model, speculative);
    if (!why.empty()) throw std::invalid_argument("cannot generate with " + path + ": " + why);
}

// Where each model goes (EngineParams' placement fields; the draft follows the target unless set).
Placement target_placement(const EngineParams& params) {
    Placement p;
    p.n_gpu_layers = params.n_gpu_layers;
    p.split_mode = params.split_mode;
    p.tensor_split = params.tensor_split;
    p.main_gpu = params.main_gpu;
    p.devices = params.devices;
    p.rpc_servers = params.rpc_servers;
    return p;
}

Placement draft_placement(const EngineParams& params) {
    Placement p = target_placement(params);
    if (params.n_gpu_layers_draft != EngineParams::kFollowTarget) p.n_gpu_layers = params.n_gpu_layers_draft;
    if (!params.draft_devices.empty()) p.devices = params.draft_devices;
    return p;
}
}  // namespace

Engine::Engine(const std::string& target_path, const std::string& draft_path, const EngineParams& params)
    : params_(params), target_path_(target_path), draft_path_(draft_path), acceptor_(make_acceptor(Fault::none)),
      tree_acceptor_(make_tree_acceptor(Fault::none)) {
    if (params.n_ctx < 16) throw std::invalid_argument("n_ctx must be at least 16");
    if (params.n_batch < 1) throw std::invalid_argument("n_batch must be at least 1");
    if (params.n_threads < 1) throw std::invalid_argument("n_threads must be at least 1");
    const int max_seq = static_cast<int>(llama_max_parallel_sequences());
    if (params.n_seq_max < 1 || params.n_seq_max > max_seq) {
        throw std::invalid_argument("n_seq_max must be in [1, " + std::to_string(max_seq) + "]");
    }
    if (params.flash_attn < -1 || params.flash_attn > 1) {
        throw std::invalid_argument("flash_attn must be -1 (auto), 0 (off) or 1 (on)");
    }
    // llama.cpp caps n_batch at n_ctx (causal attention) and GGML_ASSERTs when one batch cannot
    // hold a token of every sequence: use the capped value ourselves and refuse the rest here.
    params_.n_batch = std::min(params.n_batch, params.n_ctx);
    if (params_.n_batch < params.n_seq_max) {
        throw std::invalid_argument("n_batch (" + std::to_string(params.n_batch) + ", capped at n_ctx " +
                                    std::to_string(params.n_ctx) + ") must be at least n_seq_max (" +
                                    std::to_string(params.n_seq_max) + "): every step decodes one token "
                                    "of each sequence in one batch");
    }
    // A hidden-state drafter file (DFlash, DSpark, EAGLE-3) or the target's MTP head: refused from
    // the files' metadata before anything is loaded when llama.cpp could not run the pair.
    const std::string hidden_kind = params.mtp ? "mtp" : draft_path.empty() ? "" : hidden_drafter_file_kind(draft_path);
    if (params.mtp && !draft_path.empty()) {
        throw std::invalid_argument("mtp drafts with the target's own nextn head: give no draft file");
    }
    if (!hidden_kind.empty()) check_hidden_pair(target_path, params.mtp ? "" : draft_path);
    try {
        add_rpc_servers(params.rpc_servers, params.rpc_timeout_ms);
        target_model_ = load_model(target_path, target_placement(params), params.mtp);
        refuse_unsupported(target_model_, target_path, !draft_path.empty() || params.mtp);
        if (!hidden_kind.empty()) {
            load_hidden_draft(hidden_kind);
        } else if (!draft_path.empty()) {
            draft_model_ = load_model(draft_path, draft_placement(params));
            refuse_unsupported(draft_model_, draft_path, true);
            const std::string why = vocab_incompatibility(target_model_, draft_model_);
            if (!why.empty()) {
                throw std::invalid_argument("draft " + draft_path + " cannot speculate for target " +
                                            target_path + ": " + why);
            }
        }
        target_ = new Context(target_model_, params_);
        if (draft_model_ != nullptr) draft_ = new Context(draft_model_, params_);
        if (hidden_ != nullptr) open_hidden_context(*hidden_, target_->ctx, params_);  // shares the target's
        for (const Context* c : {target_, draft_}) {  // embedding models pool; they have no logits
            if (c != nullptr && llama_pooling_type(c->ctx) != LLAMA_POOLING_TYPE_NONE) {
                throw std::invalid_argument("cannot generate with " + (c == target_ ? target_path : draft_path) +
                                            ": it is an embedding model (pooled output, no logits)");
            }
        }
    } catch (...) {
        close();
        throw;
    }
}

Engine::~Engine() { close(); }

void Engine::inject_fault(Fault fault) {
    acceptor_ = make_acceptor(fault);
    tree_acceptor_ = make_tree_acceptor(fault);
}

// Loads a DFlash/DSpark/EAGLE-3 file (its context is made once the target's exists), or marks
// the target itself as the MTP drafter's model.
void Engine::load_hidden_draft(const std::string& kind) {
    hidden_ = new HiddenDraft();
    hidden_->kind = kind;
    if (kind == "mtp") {
        hidden_->model = target_model_;
        return;
    }
    hidden_->model = load_model(draft_path_, draft_placement(params_));
    hidden_->owns_model = true;
    const std::string why = vocab_incompatibility(target_model_, hidden_->model);
    if (!why.empty()) {
        throw std::invalid_argument("drafter " + draft_path_ + " cannot speculate for target " + target_path_ + ": " + why);
    }
}

std::string Engine::hidden_drafter() const { return hidden_ != nullptr ? hidden_->kind : ""; }

void Engine::close() {
    delete hidden_;  // its context shares the target's: freed first
    hidden_ = nullptr;
    delete draft_;
    draft_ = nullptr;
    delete target_;
    target_ = nullptr;
    if (draft_model_ != nullptr) llama_model_free(draft_model_);
    draft_model_ = nullptr;
    if (target_model_ != nullptr) llama_model_free(target_model_);
    target_model_ = nullptr;
}

void Engine::require_open() const {
    if (target_ == nullptr) throw std::invalid_argument("the engine is closed");
}

int Engine::n_ctx() const {
    require_open();
    return static_cast<int>(llama_n_ctx(target_->ctx));
}
int Engine::n_ctx_seq() const {
    require_open();
    return static_cast<int>(llama_n_ctx_seq(target_->ctx));
}
ModelInfo Engine::target_info() const {
    require_open();
    return describe_model(target_model_, target_path_);
}
ContextInfo Engine::context_info(bool draft) const {
    require_open();
    const Context* c = draft ? draft_ : target_;
    if (c == nullptr) throw std::invalid_argument("no draft model loaded");
    ContextInfo i;
    i.n_ctx = static_cast<int>(llama_n_ctx(c->ctx));
    i.n_batch = static_cast<int>(llama_n_batch(c->ctx));
    i.n_ubatch = static_cast<int>(llama_n_ubatch(c->ctx));
    i.n_seq_max = static_cast<int>(llama_n_seq_max(c->ctx));
    i.n_threads = static_cast<int>(llama_n_threads(c->ctx));
    i.n_threads_batch = static_cast<int>(llama_n_threads_batch(c->ctx));
    i.kv_unified = params_.kv_unified;
    i.swa_full = true;  // Context's constructor
    i.flash_attn = params_.flash_attn;
    const llama_perf_context_data perf = llama_perf_context(c->ctx);
    i.n_eval = perf.n_eval;
    i.n_p_eval = perf.n_p_eval;
    i.n_reused = perf.n_reused;
    return i;
}

ModelInfo Engine::draft_info() const {
    require_open();
    if (draft_model_ != nullptr) return describe_model(draft_model_, draft_path_);
    if (hidden_ != nullptr && hidden_->owns_model) return describe_model(hidden_->model, draft_path_);  // its file
    throw std::invalid_argument("no draft model loaded");
}

std::vector<int32_t> Engine::tokenize(const std::string& text, bool add_special) const {
    require_open();
    const int n_max = static_cast<int>(text.size()) + 8;
    std::vector<int32_t> tokens(n_max);
    const int n = llama_tokenize(target_->vocab, text.data(), static_cast<int32_t>(text.size()),
                                 tokens.data(), n_max, add_special, /*parse_special=*/false);
    if (n < 0) throw std::runtime_error("tokenization failed");
    tokens.resize(n);
    return tokens;
}

std::string Engine::detokenize(const std::vector<int32_t>& tokens) const {
    require_open();
    std::string text(tokens.size() * 16 + 16, '\0');
    int n = llama_detokenize(target_->vocab, tokens.data(), static_cast<int32_t>(tokens.size()),
                             text.data(), static_cast<int32_t>(text.size()), true, false);
    if (n < 0) {
        text.resize(-n);
        n = llama_detokenize(target_->vocab, tokens.data(), static_cast<int32_t>(tokens.size()),
                             text.data(), static_cast<int32_t>(text.size()), true, false);
    }
    text.resize(std::max(n, 0));
    return text;
}


void Engine::reset_memory() {
    for (Context* c : {target_, draft_}) {
        if (c == nullptr) continue;
        llama_memory_clear(c->memory(), true);
        c->cached_prefix.clear();
        c->forget_prompts();
    }
}

// ---------------------------------------------------------------------------------------------
// Prefill: the shared prefix once on sequence 0 (its cells are then shared with the others),
// then every sequence's own remainder, packed into batches of at most n_batch tokens. With
// `on_last` (the target), it gets the logits of each sequence's last prompt token (from which the
// first token is sampled, or checked by a replay).
// ---------------------------------------------------------------------------------------------
// With `reuse_prompts` (runs whose prefill is no measurement: the distributional test's runs and
// the teacher-forced passes, never timed runs) and every prompt's cells still in the cache from
// the last prefill, nothing is fed: each sequence drops what followed its prompt and its first
// token comes from the kept logits of its last prompt token. The cells and logits are those a
// fresh prefill computes (same prompts, same batches), so a check on them sees what it would
// otherwise; a 32k-token context's openings cost seconds per run.
void Engine::prefill(Context& c, std::vector<Sequence>& seqs, int shared, const LastLogits& on_last,
                     const AfterDecode& after_decode, bool reuse_prompts) {
    std::vector<int> logits_row(seqs.size(), -1);
    const char* what = on_last ? "target prefill" : "draft prefill";
    c.clear_batch();

    auto flush = [&]() {
        if (c.batch.n_tokens == 0) return;
        c.decode(what);
        if (after_decode) after_decode(c.batch);
        for (size_t s = 0; s < seqs.size(); ++s) {
            if (logits_row[s] < 0) continue;
            const float* logits = c.logits(logits_row[s]);
            c.cached_last_logits[s].assign(logits, logits + c.n_vocab);
            on_last(seqs[s], logits);
            logits_row[s] = -1;
        }
        c.clear_batch();
    };
    auto feed = [&](size_t s, int from, int to) {
        const Sequence& seq = seqs[s];
        for (int i = from; i < to; ++i) {
            const bool last = on_last && i + 1 == static_cast<int>(seq.prompt.size());
            const int row = c.add(seq.prompt[i], i, seq.id, last);
            if (on_last) ++target_prompt_tokens_fed_;
            if (last) logits_row[s] = row;
            if (c.batch_full()) flush();
        }
    };

    if (reuse_prompts && holds_prompts(c, seqs, shared, static_cast<bool>(on_last))) {
        for (size_t s = 0; s < seqs.size(); ++s) {
            llama_memory_seq_rm(c.memory(), seqs[s].id, static_cast<llama_pos>(seqs[s].prompt.size()), -1);
            if (on_last) on_last(seqs[s], c.cached_last_logits[s].data());
        }
        return;
    }
    c.forget_prompts();
    if (on_last) c.cached_last_logits.assign(seqs.size(), {});
    // Keep what sequence 0 still holds of the shared prefix, drop everything else.
    const std::vector<int32_t>& prompt0 = seqs[0].prompt;
    int reuse = 0;
    while (reuse < shared && reuse < static_cast<int>(c.cached_prefix.size()) &&
           c.cached_prefix[reuse] == prompt0[reuse]) {
        ++reuse;
    }
    if (reuse == 0) {
        llama_memory_clear(c.memory(), true);
    } else {
        llama_memory_seq_rm(c.memory(), seqs[0].id, reuse, -1);
        for (llama_seq_id s = 1; s < static_cast<llama_seq_id>(llama_n_seq_max(c.ctx)); ++s) {
            llama_memory_seq_rm(c.memory(), s, -1, -1);
        }
    }
    c.cached_prefix.clear();
    feed(0, reuse, shared);
    flush();
    // (-1, -1): whole sequence, which is also what a non-unified cache needs to copy buffers
    for (size_t s = 1; s < seqs.size(); ++s) llama_memory_seq_cp(c.memory(), seqs[0].id, seqs[s].id, -1, -1);
    c.cached_prefix.assign(prompt0.begin(), prompt0.begin() + shared);
    for (size_t s = 0; s < seqs.size(); ++s) feed(s, shared, static_cast<int>(seqs[s].prompt.size()));
    flush();
    for (const Sequence& seq : seqs) c.cached_prompts.push_back(seq.prompt);
    c.cached_shared = shared;
}

// Whether the cache still holds exactly these prompts, laid out as `shared` says (sequence ids
// 0..n-1, as generate() and forced_pass() number them).
bool Engine::holds_prompts(const Context& c, const std::vector<Sequence>& seqs, int shared, bool with_logits) const {
    if (c.cached_shared != shared || c.cached_prompts.size() != seqs.size()) return false;
    if (with_logits && c.cached_last_logits.size() != seqs.size()) return false;
    for (size_t s = 0; s < seqs.size(); ++s) {
        if (seqs[s].id != static_cast<int>(s) || c.cached_prompts[s] != seqs[s].prompt) return false;
        if (with_logits && c.cached_last_logits[s].size() != static_cast<size_t>(c.n_vocab)) return false;
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// generate
// ---------------------------------------------------------------------------------------------
GenerateResult Engine::generate(const std::vector<std::vector<int32_t>>& prompts, const GenerateParams& p,
                                const std::function<bool()>& should_stop) {
    const int shared = validate(prompts, p);
    forget_last_run();  // a run that throws (Ctrl-C, close) leaves nothing for pending_logits
    std::vector<Sequence> seqs(prompts.size());
    for (size_t s = 0; s < prompts.size(); ++s) {
        seqs[s].id = static_cast<int>(s);
        seqs[s].key = s;
        seqs[s].n_predict = p.n_predict;
        seqs[s].prompt = prompts[s];
        seqs[s].n_past_target = static_cast<int32_t>(prompts[s].size());
        seqs[s].n_past_draft = static_cast<int32_t>(prompts[s].size());
    }
    const int64_t fed_before = target_prompt_tokens_fed_;
    GenerateResult result =
        p.spec ? run_rounds(seqs, shared, p, should_stop) : run_baseline(seqs, shared, p, should_stop);
    result.prefill_tokens = target_prompt_tokens_fed_ - fed_before;
    result.kv_prompt_cells = shared;
    for (const Sequence& seq : seqs) result.kv_prompt_cells += static_cast<int64_t>(seq.prompt.size()) - shared;

    forget_last_run();
    for (Sequence& seq : seqs) {
        last_pending_.push_back(seq.pending());
        last_n_past_.push_back(seq.n_past_target);
        last_pending_pos_.push_back(static_cast<int32_t>(seq.prompt.size() + seq.out.size()) - 1);
        result.decode_tokens += static_cast<int64_t>(seq.out.size()) - 1;
        result.tokens.push_back(std::move(seq.out));
        result.margins.push_back(std::move(seq.margins));
        result.pit.push_back(std::move(seq.pit));
        result.decisions.push_back(std::move(seq.decisions));
        result.counts.push_back(std::move(seq.counts));
    }
    return result;
}

GenerateResult Engine::run_baseline(std::vector<Sequence>& seqs, int shared_prefix, const GenerateParams& p,
                                    const std::function<bool()>& should_stop) {
    GenerateResult r;
    PhaseClock clock;
    Context& t = *target_;
    // drafter_settings: the drafter is made (its target settings on) but never asked for drafts
    std::unique_ptr<Drafter> settings_only =
        p.drafter_settings ? make_hidden_drafter(*hidden_, t, p, static_cast<int>(seqs.size()), true) : nullptr;
    prefill(t, seqs, shared_prefix, sample_first_token(p, t.n_vocab));
    if (settings_only) t.forget_prompts();  // cells made under a hidden drafter's settings
    for (Sequence& seq : seqs) seq.done = finished(seq, p, t.vocab);
    clock.charge(r.times.prefill_target);
    const double llama_before = t.llama_ms;  // decoding only: prefill's decodes left out

    SoftmaxNorm norm;
    std::vector<int> row(seqs.size());
    r.n_seq = static_cast<int>(seqs.size());
    while (true) {
        if (should_stop && should_stop()) throw Interrupted();
        const int active_now = active(seqs);
        const int64_t tokens_before = generated(seqs);
        const double ms_before = r.times.decode;
        t.clear_batch();
        for (size_t s = 0; s < seqs.size(); ++s) {
            if (!seqs[s].done) row[s] = t.add(seqs[s].pending(), seqs[s].n_past_target, seqs[s].id, true);
        }
        if (t.batch.n_tokens == 0) break;
        t.decode("baseline decode");
        for (size_t s = 0; s < seqs.size(); ++s) {
            if (!seqs[s].done) step_baseline(seqs[s], t.logits(row[s]), t, p, norm, *acceptor_);
        }
        clock.charge(r.times.decode);
        count_iteration(r, active_now, generated(seqs) - tokens_before, r.times.decode - ms_before);
    }
    r.times.llama = t.llama_ms - llama_before;
    r.times.total = clock.elapsed_ms();
    return r;
}


// ---------------------------------------------------------------------------------------------
// Logit probes for tests (rollback consistency)
// ---------------------------------------------------------------------------------------------
std::vector<float> Engine::prompt_logits(const std::vector<int32_t>& tokens) {
    GenerateParams p;
    p.n_predict = 1;
    validate({tokens}, p);
    reset_memory();
    forget_last_run();  // the cache no longer holds the last generate()'s sequences
    Context& t = *target_;
    int row = -1;
    t.clear_batch();
    for (size_t i = 0; i < tokens.size(); ++i) {
        row = t.add(tokens[i], static_cast<int32_t>(i), 0, i + 1 == tokens.size());
        if (t.batch_full() && i + 1 < tokens.size()) {
            t.decode("prompt_logits");
            t.clear_batch();
        }
    }
    t.decode("prompt_logits");
    const float* logits = t.logits(row);
    return std::vector<float>(logits, logits + t.n_vocab);
}

std::pair<std::vector<int32_t>, std::vector<uint8_t>> Engine::draft_prefix_state() {
    require_open();
    if (draft_ == nullptr || draft_->cached_prefix.empty()) return {};
    Context& d = *draft_;
    // sequence 0 down to the prefix (its cells are the prefix's; the others' suffixes stay)
    llama_memory_seq_rm(d.memory(), 0, static_cast<llama_pos>(d.cached_prefix.size()), -1);
    d.forget_prompts();
    std::vector<uint8_t> state(llama_state_seq_get_size(d.ctx, 0));
    state.resize(llama_state_seq_get_data(d.ctx, state.data(), state.size(), 0));
    return {d.cached_prefix, std::move(state)};
}

bool Engine::load_draft_prefix(const std::vector<int32_t>& tokens, const std::vector<uint8_t>& state) {
    require_open();
    if (draft_ == nullptr || tokens.empty() || state.empty()) return false;
    Context& d = *draft_;
    llama_memory_clear(d.memory(), true);
    d.cached_prefix.clear();
    d.forget_prompts();
    if (llama_state_seq_set_data(d.ctx, state.data(), state.size(), 0) == 0) {
        llama_memory_clear(d.memory(), true);  // refused (another model or layout): prefill as usual
        return false;
    }
    if (llama_memory_seq_pos_max(d.memory(), 0) + 1 != static_cast<llama_pos>(tokens.size())) {
        llama_memory_clear(d.memory(), true);
        return false;
    }
    d.cached_prefix = tokens;
    return true;
}

int32_t Engine::cache_extent(int seq) const {
    require_open();
    if (seq < 0 || seq >= static_cast<int>(last_pending_.size())) {
        throw std::invalid_argument("no sequence " + std::to_string(seq) + " in the last generate()");
    }
    return llama_memory_seq_pos_max(target_->memory(), seq) + 1;
}

bool Engine::is_eog(int32_t token) const {
    require_open();
    return token >= 0 && token < target_->n_vocab && llama_vocab_is_eog(target_->vocab, token);
}

std::vector<float> Engine::pending_logits(int seq) {
    require_open();
    if (seq < 0 || seq >= static_cast<int>(last_pending_.size())) {
        throw std::invalid_argument("no sequence " + std::to_string(seq) + " in the last generate()");
    }
    Context& t = *target_;
    int32_t pos = last_n_past_[seq];
    // A sequence ended by an accepted end-of-generation draft holds that token in the cache (it
    // was verified there). Its cell is dropped and the token fed as every other pending token is,
    // one 1-token step on top of the rest: what a clean replay's final step computes. Fed a second
    // time after itself, it gave logits of another context (MT-Bench, Qwen pair: a false `fail`).
    // The cache's extent is checked before this (lossless.cache_extents), so nothing is hidden.
    if (pos == last_pending_pos_[seq] + 1 && is_eog(last_pending_[seq]) &&
        llama_memory_seq_pos_max(t.memory(), seq) == pos - 1) {
        pos = last_pending_pos_[seq];
        llama_memory_seq_rm(t.memory(), seq, pos, -1);
    }
    if (llama_memory_seq_pos_max(t.memory(), seq) != pos - 1) {
        throw std::runtime_error("target KV cache of sequence " + std::to_string(seq) + " ends at position " +
                                 std::to_string(llama_memory_seq_pos_max(t.memory(), seq)) + ", expected " +
                                 std::to_string(pos - 1));
    }
    t.clear_batch();
    const int row = t.add(last_pending_[seq], pos, seq, true);
    t.decode("pending_logits");
    const float* logits = t.logits(row);
    std::vector<float> out(logits, logits + t.n_vocab);
    llama_memory_seq_rm(t.memory(), seq, pos, -1);
    return out;
}

}  // namespace specnative
