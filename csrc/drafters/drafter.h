// The one interface every drafter implements, so that the round loop (core/round_loop.cpp, a
// chain's proposals in core/chain_round.cpp) treats a draft model and llama.cpp's model-free
// n-gram drafters alike: ask for at most k_max[s] tokens per sequence, verify what came back
// (0..k_max[s] tokens), report what was accepted.
// One file per family: drafter_model.cpp (a second GGUF model), drafter_ngram.cpp (llama.cpp's
// common/speculative.h types ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache),
// drafter_hidden.cpp (llama.cpp's drafters that read the target's hidden states: draft-dflash,
// draft-dspark, draft-eagle3, draft-mtp).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine.h"
#include "engine_internal.h"

namespace specnative {

// What happened to one sequence's draft in one round (given to Drafter::accept).
struct RoundOutcome {
    int32_t pos0;           // position of the pending token (the first verified one)
    int drafted;            // tokens the drafter proposed this round (0..k_max)
    int accepted;           // of those, how many the target kept
    int stale;              // cells kept (+1) or lost (-1) beyond the accepted ones: 0 but for a planted fault
    bool stopped_on_eog;    // an accepted end-of-generation token ended the sequence
    int32_t correction;     // the corrected/bonus token emitted after the accepted drafts (-1 if none)
    int32_t last_draft;     // the last proposed token (when drafted > 0)
};

// q[s][j]: the distribution draft j+1 of sequence s was drawn from, `vocab` floats (rejection rule).
using DraftDists = std::vector<std::vector<std::vector<float>>>;

// Whether anything reads q: the rejection rule when sampling (its accept test, its residual,
// record_pit's evidence). At temperature 0, and under greedy or match when sampling, a chain's
// drafter keeps no q: a draft is its argmax or its keyed sample, nothing more.
inline bool draft_dists_read(const GenerateParams& p) {
    return p.temperature > 0.0f && (p.rule == AcceptRule::rejection || p.record_pit);
}

class Drafter {
public:
    virtual ~Drafter() = default;
    // Tokens a q vector has: at least the target's vocabulary (p and q are zero-padded alike).
    virtual int n_vocab() const = 0;
    // Sees every prompt once, after the target's prefill (each sequence holds its first token as
    // pending). Charged to the prefill_draft timer.
    virtual void begin(std::vector<Engine::Sequence>& seqs, int shared_prefix) = 0;
    // Proposes drafts[s] (cleared by the caller) of 0..k_max[s] tokens for every sequence with
    // k_max[s] >= 1 (k_max[s] = 0: none wanted; -1: the sequence is done). Where q is read
    // (draft_dists_read) it also fills q[s][j] for every proposed token. Charged to `draft`.
    virtual void draft(std::vector<Engine::Sequence>& seqs, const std::vector<int>& k_max,
                       std::vector<std::vector<int32_t>>& drafts, DraftDists& q) = 0;
    // After the target judged sequence `seq`'s draft (also when it proposed nothing).
    virtual void accept(Engine::Sequence& seq, const RoundOutcome& outcome) = 0;
    // Serving (serve.cpp), instead of begin(): slot `seq` starts a new request after the target's
    // prefill gave its first token (pending); the drafter takes in its prompt. Charged to
    // prefill_draft.
    virtual void admit(Engine::Sequence& seq) = 0;
    // The request in slot `seq` finished: the drafter drops its state (the draft KV cells).
    virtual void release(const Engine::Sequence& seq) = 0;
    // Serving with the prefix cache: every request's first `length` prompt tokens are the same; a
    // drafter with its own cache keeps them once in sequence `holder` (filled at the first admit)
    // and copies them into each admitted slot. Called before the first admit, and with length 0
    // after the last release (the holder's cells go). The families without a cache of their own
    // (n-gram) or with per-sequence state from each whole prompt (hidden-state) ignore it.
    virtual void share_prefix(int /*length*/, int /*holder*/) {}
    // After every target decode of a speculative run (each prefill chunk, each verify), with the
    // batch the target decoded: the hidden-state drafters read its extracted features here
    // (common_speculative_process). Charged to prefill_draft during the prefill, else to
    // draft_ingest. The other families need nothing from the target's decodes.
    virtual void after_target_decode(const llama_batch& /*batch*/) {}
    // Milliseconds spent inside llama.cpp calls the drafter makes other than Context::decode
    // (which keeps its own count, Context::llama_ms), since it was made: an n-gram drafter's
    // common_speculative_* calls. The round loop adds its delta to StepTimes::llama.
    virtual double library_ms() const { return 0.0; }
    // Milliseconds of the draft phase spent taking in tokens the draft model has not seen (rounds
    // at k = 0 before, a prompt a policy deferred), since it was made: part of draft, not a step.
    virtual double catch_up_ms() const { return 0.0; }
};

// ---- the draft-model family (drafter_model.cpp) -------------------------------------------------
using DraftPrefill = std::function<void(std::vector<Engine::Sequence>&, int shared_prefix)>;
std::unique_ptr<Drafter> make_model_drafter(Engine::Context& draft, const DraftPrefill& prefill,
                                            const GenerateParams& p, int target_vocab, int n_seq);

// ---- the n-gram family (drafter_ngram.cpp) ------------------------------------------------------
// The names a generate() call may ask for ("model" plus llama.cpp's model-free --spec-type names).
const std::vector<std::string>& drafter_names();
bool is_ngram_drafter(const std::string& name);
// llama.cpp's parameters of the n-gram drafters by their CLI names without the dashes
// (common/arg.cpp: spec-ngram-simple-size-n, ..., lookup-cache-static), with the defaults of
// common_params_speculative at this commit. Values are strings (cache files are paths).
std::map<std::string, std::string> ngram_drafter_defaults();
// The n-gram drafter an option belongs to (spec-ngram-<type>-..., lookup-cache-* -> ngram-cache),
// "" for a name that is none of llama.cpp's drafter options.
std::string drafter_of_option(const std::string& option);
// Throws std::invalid_argument for an unknown drafter or option, an option of another drafter
// (llama.cpp would ignore it), a value out of llama.cpp's
// range, a cache file that cannot be read, or a build without llama.cpp's common library.
void validate_drafter(const DrafterParams& params);
std::unique_ptr<Drafter> make_ngram_drafter(const DrafterParams& params, const GenerateParams& p, int n_seq,
                                            int target_vocab);

// ---- the hidden-state family (drafter_hidden.cpp) -----------------------------------------------
// dflash, dspark, eagle3, mtp (llama.cpp's --spec-type names without "draft-").
bool is_hidden_drafter(const std::string& name);
// What a drafter file is, from its GGUF metadata: dflash, dflash2 (conv + selector), dspark
// (Markov head) or eagle3; "" for any other model (a plain draft model).
std::string hidden_drafter_file_kind(const std::string& path);
// Whether drafter `drafter` runs a file of kind `file_kind` (dflash runs DFlash2 files too).
bool hidden_kind_serves(const std::string& drafter, const std::string& file_kind);
// From the GGUF metadata alone, before anything is loaded: throws std::invalid_argument with one
// line naming what the pair lacks (a target without layer-input extraction or nextn layers, a
// width mismatch, target layers out of range, a DFlash file without a mask token).
// draft_path "" checks the target for mtp.
void check_hidden_pair(const std::string& target_path, const std::string& draft_path);

// The drafter's model and llama_context, made with the engine and kept across generate() calls:
// a DFlash/DSpark/EAGLE-3 file, or (mtp) the target model itself in a context of type MTP. Its
// context shares the target's (ctx_other) as llama.cpp's common_speculative_init_result builds it.
struct HiddenDraft {
    std::string kind;  // dflash, dflash2, dspark, eagle3, mtp
    llama_model* model = nullptr;
    bool owns_model = false;  // false for mtp (the target's model)
    llama_context* ctx = nullptr;
    ~HiddenDraft();
};
// Makes h.ctx for h.model, sharing the target's context (ctx_other).
void open_hidden_context(HiddenDraft& h, llama_context* target_ctx, const EngineParams& params);
// One generate()'s drafter; trim_after_draft=false skips the draft-cache trim after each draft
// (a planted fault: a test that it changes acceptance, never the output).
std::unique_ptr<Drafter> make_hidden_drafter(HiddenDraft& h, Engine::Context& target, const GenerateParams& p,
                                             int n_seq, bool trim_after_draft);

}  // namespace specnative
