#include "engine.h"
#include "engine_internal.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "acceptor.h"
#include "tree_acceptor.h"
#include "drafter.h"
#include "phase_clock.h"
#include "sampling.h"
#include "synthetic.h"
#include "vocab_check.h"

namespace specnative {


namespace {

// Leading tokens common to all prompts, short of each prompt's last token (which every sequence
// feeds itself to get its first logits). These cells are computed once and shared.
int shared_prefix_length(const std::vector<std::vector<int32_t>>& prompts) {
    size_t n = prompts[0].size() - 1;
    for (const auto& p : prompts) {
        n = std::min(n, p.size() - 1);
        size_t i = 0;
        while (i < n && p[i] == prompts[0][i]) ++i;
        n = i;
    }
    return static_cast<int>(n);
}


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
// Pieces shared with serving (engine_internal.h)
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
}

// Spins (no sleep: the thread stays busy, as real engine work would) so that tests can check the
// engine's own time grows by what was added while llama.cpp's does not.
void spin_for_ms(double ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(ms);
    while (std::chrono::steady_clock::now() < until) {
    }
}

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

void check_temperature(float temperature) {
    if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
        throw std::invalid_argument("temperature must be a finite number >= 0");
    }
    if (temperature > 0.0f && !std::isfinite(1.0f / temperature)) {  // softmax would make NaNs
        throw std::invalid_argument("temperature " + std::to_string(temperature) +
                                    " is too small to sample with; use 0 for greedy decoding");
    }
}

// ---------------------------------------------------------------------------------------------
// Validation: everything llama.cpp would abort on is refused here with a clear message.
// ---------------------------------------------------------------------------------------------
int Engine::validate_params(const GenerateParams& p, int n_seq) const {
    if (p.n_predict <= 0) throw std::invalid_argument("n_predict must be positive");
    check_temperature(p.temperature);
    check_synthetic(p.synthetic, p.k, p.spec);
    if (!p.spec) {
        if (p.drafter_settings) check_hidden_drafter(p.drafter.type);
        return 0;
    }
    validate_drafter(p.drafter);
    if (p.drafter.type == "model" && draft_ == nullptr) {
        throw std::invalid_argument(
            hidden_ != nullptr ? "this engine's drafter is a " + hidden_->kind + " file: use drafter='" +
                                     (hidden_->kind == "dflash2" ? std::string("dflash") : hidden_->kind) + "'"
                               : "spec=True with drafter 'model' needs a draft model (Engine(target, draft)); "
                                 "the n-gram drafters (e.g. drafter='ngram-simple') need none");
    }
    if (is_hidden_drafter(p.drafter.type)) check_hidden_drafter(p.drafter.type);
    const std::string why = generation_unsupported(target_model_, true);  // no draft loaded: not refused at load
    if (!why.empty()) throw std::invalid_argument("cannot speculate with " + target_path_ + ": " + why);
    if (p.tree.on()) {
        validate_tree(p, n_seq);
        // the tree's cells before the rollback (a topk draft feeds up to topk nodes per level)
        return std::max(p.tree.max_nodes(), p.tree.kind == TreeShape::Kind::topk ? p.tree.topk * p.tree.depth : 0) + 1;
    }
    if (p.k < 1) throw std::invalid_argument("k must be at least 1");
    if (!(p.draft_p_min >= 0.0f && p.draft_p_min < 1.0f)) {  // NaN fails too
        throw std::invalid_argument("draft_p_min must be in [0, 1) (0 = off), got " + std::to_string(p.draft_p_min));
    }
    if (p.draft_p_min > 0.0f && p.drafter.type != "model") {
        throw std::invalid_argument("draft_p_min applies to the draft model only (drafter '" + p.drafter.type +
                                    "' has no draft probabilities)");
    }
    if (static_cast<int64_t>(n_seq) * (static_cast<int64_t>(p.k) + 1) > params_.n_batch) {  // no int overflow
        throw std::invalid_argument("k=" + std::to_string(p.k) + " is too large: " + std::to_string(n_seq) +
                                    " sequences x (k+1) verify tokens exceed n_batch=" +
                                    std::to_string(params_.n_batch));
    }
    if (p.rule == AcceptRule::greedy && p.temperature > 0.0f) {
        throw std::invalid_argument("accept_rule 'greedy' needs temperature 0; use 'match' or 'rejection'");
    }
    return p.k + 1;  // extra KV cells a speculative round holds before rollback
}

void Engine::validate_prompt(int index, const std::vector<int32_t>& prompt, int n_predict, int lookahead) const {
    if (prompt.empty()) throw std::invalid_argument("prompt " + std::to_string(index) + " is empty");
    for (int32_t t : prompt) {
        if (t < 0 || t >= target_->n_vocab) {
            throw std::invalid_argument("prompt " + std::to_string(index) + " has token id " + std::to_string(t) +
                                        " outside the vocabulary [0, " + std::to_string(target_->n_vocab) + ")");
        }
    }
    const int64_t need = static_cast<int64_t>(prompt.size()) + n_predict + lookahead;
    if (need > n_ctx_seq()) {
        throw std::invalid_argument("prompt " + std::to_string(index) + " (" + std::to_string(prompt.size()) +
                                    " tokens) + n_predict " + std::to_string(n_predict) +
                                    (lookahead ? " + k+1" : "") + " = " + std::to_string(need) +
                                    " tokens exceeds the per-sequence context of " + std::to_string(n_ctx_seq()));
    }
}

int Engine::validate(const std::vector<std::vector<int32_t>>& prompts, const GenerateParams& p) const {
    require_open();
    const int n_seq = static_cast<int>(prompts.size());
    if (n_seq == 0) throw std::invalid_argument("no prompts given");
    if (n_seq > params_.n_seq_max) {
        throw std::invalid_argument(std::to_string(n_seq) + " prompts but the engine was created with n_seq_max=" +
                                    std::to_string(params_.n_seq_max));
    }
    for (int s = 0; s < n_seq; ++s) {  // before anything indexes a prompt (shared prefix below)
        if (prompts[s].empty()) throw std::invalid_argument("prompt " + std::to_string(s) + " is empty");
    }
    const int lookahead = validate_params(p, n_seq);
    // A hidden-state drafter keeps per-sequence state from each sequence's own prefill: no shared
    // prefix (its cells would reach the draft cache of sequence 0 only).
    int shared = !p.prefix_cache || (p.spec && is_hidden_drafter(p.drafter.type)) ? 0 : shared_prefix_length(prompts);
    if (p.prefix_limit >= 0) shared = std::min(shared, p.prefix_limit);
    int64_t cells = shared;
    for (int s = 0; s < n_seq; ++s) {
        validate_prompt(s, prompts[s], p.n_predict, lookahead);
        cells += static_cast<int64_t>(prompts[s].size()) + p.n_predict + lookahead - shared;
    }
    if (params_.kv_unified && cells > n_ctx()) {
        throw std::invalid_argument("the sequences need " + std::to_string(cells) +
                                    " KV cells together but n_ctx is " + std::to_string(n_ctx()));
    }
    return shared;
}

void Engine::check_hidden_drafter(const std::string& drafter) const {
    if (!is_hidden_drafter(drafter)) {
        throw std::invalid_argument("drafter_settings applies to the hidden-state drafters (dflash, dspark, eagle3, "
                                    "mtp), not '" + drafter + "'");
    }
    if (hidden_ == nullptr) {
        throw std::invalid_argument(
            drafter == "mtp" ? "drafter 'mtp' needs an engine made with mtp=True (the target's nextn layers loaded)"
                             : "drafter '" + drafter + "' needs its draft file as the engine's draft (-md)");
    }
    if (!hidden_kind_serves(drafter, hidden_->kind)) {
        throw std::invalid_argument("drafter '" + drafter + "' cannot run this engine's " + hidden_->kind +
                                    " drafter; use drafter='" +
                                    (hidden_->kind == "dflash2" ? std::string("dflash") : hidden_->kind) + "'");
    }
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
    GenerateResult result = !p.spec        ? run_baseline(seqs, shared, p, should_stop)
                            : p.tree.on() ? run_tree(seqs, shared, p, should_stop)
                                          : run_speculative(seqs, shared, p, should_stop);
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
            if (!seqs[s].done) step_baseline(seqs[s], t.logits(row[s]), p, norm);
        }
        clock.charge(r.times.decode);
        count_iteration(r, active_now, generated(seqs) - tokens_before, r.times.decode - ms_before);
    }
    r.times.llama = t.llama_ms - llama_before;
    r.times.total = clock.elapsed_ms();
    return r;
}

// One baseline step of one sequence: sample its next token from the logits of its pending one.
void Engine::step_baseline(Sequence& seq, const float* logits, const GenerateParams& p, SoftmaxNorm& norm) {
    Context& t = *target_;
    const int32_t token = sample_target(logits, t.n_vocab, p, seq.key, seq.next_index(), seq.margins, norm);
    seq.n_past_target += 1;
    seq.out.push_back(token);
    seq.done = finished(seq, p, t.vocab);
    acceptor_->after_accept_phase(1);
}

// The drafter of a speculative run (csrc/drafter.h): the draft model, or an n-gram lookup.
std::unique_ptr<Drafter> Engine::make_drafter(const GenerateParams& p, int n_seq) {
    if (is_hidden_drafter(p.drafter.type)) {
        return make_hidden_drafter(*hidden_, *target_, p, n_seq, acceptor_->trims_draft_cache());
    }
    if (p.drafter.type != "model") return make_ngram_drafter(p.drafter, p, n_seq, target_->n_vocab);
    auto prefill_draft = [this, reuse = p.reuse_prompts](std::vector<Sequence>& seqs, int shared) {
        prefill(*draft_, seqs, shared, {}, {}, reuse);
    };
    return make_model_drafter(*draft_, prefill_draft, p, target_->n_vocab, n_seq);
}

// One speculative round per iteration: the drafter proposes up to k tokens for every active
// sequence (a draft model: one batched draft decode per position; an n-gram type: a lookup,
// 0..k tokens), verify all sequences' pending + drafts in one target decode, accept per
// sequence, roll back the rejected tail of the target's KV cache (the drafter its own state).
GenerateResult Engine::run_speculative(std::vector<Sequence>& seqs, int shared_prefix, const GenerateParams& p,
                                       const std::function<bool()>& should_stop) {
    GenerateResult r;
    r.speculative = true;
    PhaseClock clock;
    Context& t = *target_;
    const int n_seq = static_cast<int>(seqs.size());

    // The drafter exists before the target's prefill: a hidden-state drafter sets the target's
    // extraction and reads every prefill chunk (its ingest there is the draft's prefill).
    std::unique_ptr<Drafter> drafter = make_drafter(p, n_seq);
    clock.charge(r.times.prefill_draft);
    double ingest_in_prefill = 0;
    const bool reuse_prompts = p.reuse_prompts && !is_hidden_drafter(p.drafter.type);  // those ingest the prompt
    prefill(t, seqs, shared_prefix, sample_first_token(p, t.n_vocab), [&](const llama_batch& batch) {
        const ScopedMs timer(ingest_in_prefill);
        drafter->after_target_decode(batch);
    }, reuse_prompts);
    if (is_hidden_drafter(p.drafter.type)) t.forget_prompts();  // cells made under the drafter's settings
    for (Sequence& seq : seqs) {
        seq.done = finished(seq, p, t.vocab);
        reset_counts(seq.counts, p.k);
    }
    clock.charge(r.times.prefill_target);
    r.times.prefill_target -= ingest_in_prefill;
    r.times.prefill_draft += ingest_in_prefill;
    drafter->begin(seqs, shared_prefix);
    clock.charge(r.times.prefill_draft);
    // Time inside llama.cpp so far: target and draft decodes, and the drafter's own library calls.
    const auto llama_now = [&] { return t.llama_ms + (draft_ ? draft_->llama_ms : 0.0) + drafter->library_ms(); };
    const double llama_before = llama_now();  // decoding only: both prefills left out
    const auto removal_now = [&] { return t.kv_removal_ms + (draft_ ? draft_->kv_removal_ms : 0.0); };
    const double removal_before = removal_now();

    std::vector<int> k_eff(n_seq), row(n_seq);
    std::vector<std::vector<int32_t>> drafts(n_seq);
    // q[s][j]: draft distribution that proposed draft j+1 of sequence s (the rejection rule needs it)
    std::vector<std::vector<std::vector<float>>> q(n_seq, std::vector<std::vector<float>>(p.k));
    AcceptScratch scratch;

    r.n_seq = n_seq;
    while (true) {
        if (should_stop && should_stop()) throw Interrupted();
        const int active_now = active(seqs);
        const int64_t tokens_before = generated(seqs);
        const double ms_before = r.times.draft + r.times.draft_ingest + r.times.verify + r.times.resample;
        bool any_active = false;
        for (int s = 0; s < n_seq; ++s) {
            const Sequence& seq = seqs[s];
            k_eff[s] = seq.done ? -1 : draft_budget(seq, p);
            any_active |= !seq.done;
            drafts[s].clear();
        }
        if (!any_active) break;

        // ---- draft: up to k_eff[s] tokens each; what came back (0..k_eff[s]) is verified ----------
        drafter->draft(seqs, k_eff, drafts, q);
        for (int s = 0; s < n_seq; ++s) {
            if (!seqs[s].done) k_eff[s] = static_cast<int>(drafts[s].size());
        }
        clock.charge(r.times.draft);

        // ---- verify: one target decode over every sequence's pending token + drafts -----------
        t.clear_batch();
        for (int s = 0; s < n_seq; ++s) {
            if (seqs[s].done) continue;
            row[s] = t.add(seqs[s].pending(), seqs[s].n_past_target, seqs[s].id, true);
            for (int j = 0; j < k_eff[s]; ++j) t.add(drafts[s][j], seqs[s].n_past_target + 1 + j, seqs[s].id, true);
        }
        t.decode("verify");
        clock.charge(r.times.verify);
        drafter->after_target_decode(t.batch);  // a hidden-state drafter reads the verify's features
        clock.charge(r.times.draft_ingest);

        // ---- accept, emit, roll back --------------------------------------------------------
        for (int s = 0; s < n_seq; ++s) {
            if (!seqs[s].done) judge_round(seqs[s], drafts[s], q[s], row[s], p, *drafter, scratch);
        }
        acceptor_->after_accept_phase(active_now);
        clock.charge(r.times.resample);
        count_iteration(r, active_now, generated(seqs) - tokens_before,
                        r.times.draft + r.times.draft_ingest + r.times.verify + r.times.resample - ms_before);
    }
    r.times.llama = llama_now() - llama_before;
    r.times.kv_removal = removal_now() - removal_before;
    r.times.total = clock.elapsed_ms();
    return r;
}

// Tokens sequence `seq` may draft this round: k, less near its n_predict (the round's correction
// or bonus token must still fit).
int Engine::draft_budget(const Sequence& seq, const GenerateParams& p) {
    return std::min<int>(p.k, seq.n_predict - static_cast<int>(seq.out.size()) - 1);
}

// Judges one sequence's drafts against the target's verify logits (batch rows row..row+drafted):
// walks them under the acceptance rule, counts, rolls the rejected tail out of the target's
// cache, tells the drafter, and emits the accepted drafts plus the correction or bonus token.
void Engine::judge_round(Sequence& seq, const std::vector<int32_t>& drafts, const std::vector<std::vector<float>>& q,
                         int row, const GenerateParams& p, Drafter& drafter, AcceptScratch& scratch) {
    Context& t = *target_;
    const AcceptRule rule = p.temperature > 0.0f ? p.rule : AcceptRule::greedy;  // all rules agree at T = 0
    const int vocab = drafter.n_vocab();  // p and q are zero-padded to a common size
    const int drafted = static_cast<int>(drafts.size());
    SoftmaxNorm& norm = scratch.norm;
    const int64_t base_index = seq.next_index();  // index of the token after pending
    const int32_t pos0 = seq.n_past_target;       // position of pending in both caches
    int accepted = 0;
    bool stopped_on_eog = false;
    int32_t correction = -1;
    const Acceptor& rule_of = *acceptor_;
    for (int i = 0; i <= drafted; ++i) {
        const float* logits = t.logits(rule_of.verify_row(row, i, drafted));
        const int64_t index = base_index + i;
        const TargetDraw draw{logits, t.n_vocab, p, seq.key, index, seq.margins, norm};
        if (i == drafted) {  // every draft accepted: bonus token from p
            correction = rule_of.bonus(draw, i > 0 ? &q[i - 1] : nullptr, i > 0 ? drafts[i - 1] : -1);
            break;
        }
        const int32_t x = drafts[i];
        int32_t target_token;
        bool synthetic_reject = false;
        if (!p.synthetic.empty()) {  // synthetic acceptance: a keyed draw keeps x, else the target's own token
            synthetic_reject = !synthetic_keep(p, t.vocab, seq.key, index, i, x);
            target_token = synthetic_reject ? rule_of.target_token(draw) : x;
        } else if (rule == AcceptRule::rejection) {
            if (p.record_margins) seq.margins.push_back(argmax_with_margin(logits, t.n_vocab).margin);
            target_token = rule_of.judge_draft(logits, t.n_vocab, vocab, p, seq.key, index, rule_of.q_of(q, i), x,
                                               scratch);
        } else {  // greedy and match: the target's own (argmax or keyed) sample
            target_token = rule_of.target_token(draw);
        }
        if (synthetic_reject || target_token != x) {
            correction = target_token;
            seq.counts.rejected += 1;
            break;
        }
        seq.counts.accepted_at[i] += 1;
        accepted += 1;
        seq.out.push_back(x);
        if (finished(seq, p, t.vocab)) {  // an accepted EOG ends the sequence
            stopped_on_eog = true;
            break;
        }
    }
    if (p.record_pit && rule == AcceptRule::rejection) {
        record_pit(seq, drafts, q, row, base_index, accepted, stopped_on_eog ? -1 : correction, p, scratch);
    }
    for (int j = 0; j < drafted; ++j) seq.counts.drafted_at[j] += 1;
    seq.counts.drafted += drafted;
    seq.counts.accepted += accepted;
    seq.counts.rounds += 1;
    seq.counts.accept_len_hist[accepted] += 1;
    seq.counts.emitted += accepted + (stopped_on_eog ? 0 : 1);

    // the target cache keeps pending + the accepted drafts (stale: 0 but for a planted fault)
    const int stale = rule_of.stale_cells(accepted, drafted);
    seq.n_past_target = pos0 + 1 + accepted + stale;
    t.remove_from(seq.id, seq.n_past_target);  // the rejected tail, if any
    drafter.accept(seq, RoundOutcome{pos0, drafted, accepted, stale, stopped_on_eog,
                                     stopped_on_eog ? -1 : correction, drafted > 0 ? drafts.back() : -1});
    if (stopped_on_eog) {
        seq.done = true;
        return;
    }
    seq.out.push_back(correction);
    seq.done = finished(seq, p, t.vocab);
}

namespace {

// The rejection rule's evidence at draft position i (DecisionPoint), by code of its own: p in
// double precision from the position's verify row `logits`, q the distribution that proposed x.
// `correction`: the token the round emitted in x's place (-1: x was kept, or an EOG ended the
// round). `p` is scratch for the target's probabilities.
DecisionPoint decision_point(const float* logits, int32_t n_vocab, float temperature, const std::vector<float>& q,
                             int32_t x, int32_t correction, std::vector<double>& p) {
    const double inv_t = 1.0 / static_cast<double>(temperature);
    double max_logit = -INFINITY;
    for (int32_t v = 0; v < n_vocab; ++v) max_logit = std::max(max_logit, static_cast<double>(logits[v]));
    double sum = 0.0;
    p.assign(std::max<size_t>(static_cast<size_t>(n_vocab), q.size()), 0.0);  // zero beyond either vocabulary
    for (int32_t v = 0; v < n_vocab; ++v) sum += p[v] = std::exp((logits[v] - max_logit) * inv_t);
    for (int32_t v = 0; v < n_vocab; ++v) p[v] /= sum;
    const auto q_of = [&](size_t v) { return v < q.size() ? static_cast<double>(q[v]) : 0.0; };
    DecisionPoint d;
    const double p_x = p[x], q_x = q_of(x);
    // x was drawn from q, so q(x) > 0; were it 0, the rule's test u * q(x) < p(x) keeps any x with p(x) > 0
    d.accept_prob = q_x > 0.0 ? std::min(1.0, p_x / q_x) : (p_x > 0.0 ? 1.0 : 0.0);
    d.accepted = correction < 0;
    if (d.accepted) return d;
    const auto r = [&](size_t v) { return std::max(0.0, p[v] - q_of(v)); };
    double total = 0.0;
    for (size_t v = 0; v < p.size(); ++v) total += r(v);
    if (!(total > 0.0)) return d;  // no residual mass: nothing to place the correction in
    const size_t c = static_cast<size_t>(correction);
    const double r_c = c < p.size() ? r(c) : 0.0;
    double ahead = 0.0;
    for (size_t v = 0; v < p.size(); ++v) {
        const double r_v = r(v);
        if (r_v > r_c || (r_v == r_c && v < c)) ahead += r_v;
    }
    d.residual_ahead = ahead / total;
    d.residual_prob = r_c / total;
    return d;
}

}  // namespace

// The round's emitted tokens placed in the p of their own verify rows (independently of how the
// rule used those rows: a fault that reads the wrong row or q shows as a non-uniform PIT): the
// accepted drafts, each under the q it was proposed from, then the correction or bonus token
// (`last`, -1 if an accepted EOG ended the round) under the next draft's q, or none for a bonus.
// And every draft the walk reached, judged apart from the rule (decision_point): the accepted
// ones, then the rejected one (the round's correction `last` in its place) unless all were kept.
void Engine::record_pit(Sequence& seq, const std::vector<int32_t>& drafts, const std::vector<std::vector<float>>& q,
                        int row, int64_t base_index, int accepted, int32_t last, const GenerateParams& p,
                        AcceptScratch& scratch) {
    Context& t = *target_;
    const int drafted = static_cast<int>(drafts.size());
    for (int i = 0; i <= accepted; ++i) {
        const int32_t x = i < accepted ? drafts[i] : last;
        if (x < 0) break;
        const float* logits = t.logits(row + i);
        softmax_norm(logits, t.n_vocab, p.temperature, scratch.norm);
        softmax(logits, t.n_vocab, scratch.norm, scratch.pit_probs);
        const bool proposed = i < drafted;
        PitPoint pit = pit_point(logits, scratch.pit_probs, t.n_vocab, p.temperature, x,
                                 proposed ? q[i].data() : nullptr, proposed ? static_cast<int32_t>(q[i].size()) : 0);
        pit.index = base_index + i;
        seq.pit.push_back(pit);
    }
    const int reached = std::min(drafted, accepted + (last >= 0 ? 1 : 0));
    std::vector<double>& probs = scratch.decision_probs;
    for (int i = 0; i < reached; ++i) {
        DecisionPoint d = decision_point(t.logits(row + i), t.n_vocab, p.temperature, q[i], drafts[i],
                                         i < accepted ? -1 : last, probs);
        d.index = base_index + i;
        seq.decisions.push_back(d);
    }
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

namespace specnative {

SeqCounts GenerateResult::totals() const { return sum_counts(counts); }

SeqCounts sum_counts(const std::vector<SeqCounts>& counts) {
    SeqCounts sum;
    for (const SeqCounts& c : counts) {
        sum.drafted += c.drafted;
        sum.accepted += c.accepted;
        sum.rounds += c.rounds;
        sum.rejected += c.rejected;
        sum.emitted += c.emitted;
        auto add = [](std::vector<int64_t>& into, const std::vector<int64_t>& from) {
            if (into.size() < from.size()) into.resize(from.size(), 0);
            for (size_t i = 0; i < from.size(); ++i) into[i] += from[i];
        };
        add(sum.drafted_at, c.drafted_at);
        add(sum.accepted_at, c.accepted_at);
        add(sum.accept_len_hist, c.accept_len_hist);
        add(sum.offered_rank, c.offered_rank);
        add(sum.accepted_rank, c.accepted_rank);
    }
    return sum;
}

AcceptRates accept_rates(const SeqCounts& c) {
    auto ratio = [](int64_t num, int64_t den) { return den > 0 ? static_cast<double>(num) / den : std::nan(""); };
    return {ratio(c.accepted, c.drafted), ratio(c.accepted, c.accepted + c.rejected), ratio(c.emitted, c.rounds)};
}

double GenerateResult::draft_accept_rate() const { return accept_rates(totals()).draft_accept_rate; }
double GenerateResult::token_accept_rate() const { return accept_rates(totals()).token_accept_rate; }
double GenerateResult::mean_accept_len() const { return accept_rates(totals()).mean_accept_len; }

double GenerateResult::round_ms() const {
    return steps > 0 && speculative ? (times.draft + times.draft_ingest + times.verify + times.resample) / steps
                                    : std::nan("");
}

double GenerateResult::step_ms() const {
    return steps > 0 && !speculative ? times.decode / steps : std::nan("");
}

double GenerateResult::steady_tps() const {
    return steady_ms > 0 ? steady_tokens / (steady_ms / 1000.0) : std::nan("");
}

double GenerateResult::steady_iteration_ms() const {
    return steady_steps > 0 ? steady_ms / steady_steps : std::nan("");
}

double GenerateResult::steady_tau() const {
    return steady_steps > 0 ? static_cast<double>(steady_tokens) / (static_cast<double>(steady_steps) * n_seq)
                            : std::nan("");
}

double GenerateResult::occupancy() const {
    return steps > 0 ? static_cast<double>(active_sum) / (static_cast<double>(steps) * n_seq) : std::nan("");
}

double GenerateResult::tps() const {
    const double decoding_ms = times.draft + times.draft_ingest + times.verify + times.resample + times.decode;
    return decoding_ms > 0 ? decode_tokens / (decoding_ms / 1000.0) : std::nan("");
}

}  // namespace specnative
