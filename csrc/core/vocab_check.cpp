#include "vocab_check.h"

#include <cstdlib>
#include <algorithm>
#include <cstring>

#include "llama.h"

namespace specnative {

namespace {
constexpr int kMaxVocabSizeDifference = 128;  // llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
constexpr int kFirstComparedToken = 5;        // llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID
}  // namespace

std::string vocab_incompatibility(const llama_model* target, const llama_model* draft) {
    const llama_vocab* vt = llama_model_get_vocab(target);
    const llama_vocab* vd = llama_model_get_vocab(draft);
    if (llama_vocab_type(vt) != llama_vocab_type(vd)) {
        return "tokenizer types differ (target " + std::to_string(llama_vocab_type(vt)) +
               ", draft " + std::to_string(llama_vocab_type(vd)) + ")";
    }
    if (llama_vocab_get_add_bos(vt) != llama_vocab_get_add_bos(vd) ||
        (llama_vocab_get_add_bos(vt) && llama_vocab_bos(vt) != llama_vocab_bos(vd))) {
        return "BOS tokens differ";
    }
    if (llama_vocab_get_add_eos(vt) != llama_vocab_get_add_eos(vd) ||
        (llama_vocab_get_add_eos(vt) && llama_vocab_eos(vt) != llama_vocab_eos(vd))) {
        return "EOS tokens differ";
    }
    const int n_target = llama_vocab_n_tokens(vt);
    const int n_draft = llama_vocab_n_tokens(vd);
    if (std::abs(n_target - n_draft) > kMaxVocabSizeDifference) {
        return "vocabulary sizes differ too much (target " + std::to_string(n_target) +
               ", draft " + std::to_string(n_draft) + ")";
    }
    // llama.cpp tolerates sizes that differ by up to 128; a speculative loop cannot: the draft must
    // consume every id the target emits, and the target verify every id the draft proposes.
    if (n_draft < n_target) {
        return "the draft vocabulary (" + std::to_string(n_draft) + " tokens) is smaller than the target's (" +
               std::to_string(n_target) + "): target tokens beyond it cannot be fed to the draft";
    }
    if (n_draft > n_target) {
        return "the draft vocabulary (" + std::to_string(n_draft) + " tokens) is larger than the target's (" +
               std::to_string(n_target) + "): the draft could propose ids the target does not have";
    }
    const int n_common = n_target;
    for (int id = kFirstComparedToken; id < n_common; ++id) {
        if (std::strcmp(llama_vocab_get_text(vt, id), llama_vocab_get_text(vd, id)) != 0) {
            return "token " + std::to_string(id) + " differs (target '" +
                   llama_vocab_get_text(vt, id) + "', draft '" + llama_vocab_get_text(vd, id) + "')";
        }
    }
    return "";
}

std::vector<std::string> vocab_tolerated_differences(const llama_model* target, const llama_model* draft) {
    const llama_vocab* vt = llama_model_get_vocab(target);
    const llama_vocab* vd = llama_model_get_vocab(draft);
    std::vector<std::string> notes;
    const int n_common = std::min(llama_vocab_n_tokens(vt), llama_vocab_n_tokens(vd));
    for (int id = 0; id < std::min(kFirstComparedToken, n_common); ++id) {
        if (std::strcmp(llama_vocab_get_text(vt, id), llama_vocab_get_text(vd, id)) != 0) {
            notes.push_back("token " + std::to_string(id) + " differs (target '" + llama_vocab_get_text(vt, id) +
                            "', draft '" + llama_vocab_get_text(vd, id) + "')");
        }
    }
    if (llama_vocab_eos(vt) != llama_vocab_eos(vd)) {
        notes.push_back("EOS ids differ (target " + std::to_string(llama_vocab_eos(vt)) + ", draft " +
                        std::to_string(llama_vocab_eos(vd)) + ")");
    }
    return notes;
}

std::string generation_unsupported(const llama_model* model, bool speculative) {
    if (llama_vocab_type(llama_model_get_vocab(model)) == LLAMA_VOCAB_TYPE_NONE) {
        return "it has no tokenizer (its GGUF holds no vocabulary)";  // llama.cpp's tokenizer asserts
    }
    if (llama_model_has_encoder(model) || !llama_model_has_decoder(model)) {
        return "it is an encoder or encoder-decoder model; only decoder-only models generate here";
    }
    if (llama_model_is_diffusion(model)) return "it is a diffusion model, which does not decode token by token";
    if (speculative && (llama_model_is_recurrent(model) || llama_model_is_hybrid(model))) {
        return "its recurrent state cannot be rolled back to drop rejected drafts";
    }
    return "";
}

}  // namespace specnative
