// Everything generate() and serve() refuse before they touch llama.cpp (what llama.cpp would
// abort on, or what cannot be measured), each with a message naming what is wrong.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "drafter.h"
#include "engine.h"
#include "engine_internal.h"
#include "spec_policy.h"
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

}  // namespace

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
    if (!p.spec && p.policy.kind != PolicyParams::Kind::static_k) {
        throw std::invalid_argument("a spec policy other than static applies to speculative runs (spec=True)");
    }
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
    check_policy(p.policy, p.k, p.tree.on());
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

}  // namespace specnative
