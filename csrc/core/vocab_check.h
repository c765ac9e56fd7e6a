// Can a draft model speculate for a target model? The conditions llama.cpp's
// common_speculative_are_compatible checks, reported as a reason instead of a log line, and one
// more: the vocabulary sizes must be equal (llama.cpp lets them differ by up to 128 ids, but then
// one side emits ids the other cannot take, and the run fails mid-way instead of at load).
#pragma once

#include <string>
#include <vector>

struct llama_model;

namespace specnative {

// Returns an empty string when compatible, else a sentence saying what differs.
std::string vocab_incompatibility(const llama_model* target, const llama_model* draft);

// What llama.cpp's check tolerates and vocab_incompatibility therefore accepts too, said so that
// a run can record it: texts of ids 0..4 (SPEC_VOCAB_CHECK_START_TOKEN_ID: control tokens such as
// <unk>, <s>, </s> whose text differs between conversions of one tokenizer) and the EOS id where
// neither model adds EOS to a prompt. Neither changes the output (the target verifies every
// token and decides where a sequence ends); a draft that reads them otherwise proposes worse.
std::vector<std::string> vocab_tolerated_differences(const llama_model* target, const llama_model* draft);

// Why a loaded model cannot be decoded by the engine (no tokenizer, an encoder, no decoder,
// diffusion; with `speculative`, memory that cannot roll back rejected drafts), or "". llama.cpp
// asserts, or silently returns no logits, on such models instead of refusing them.
std::string generation_unsupported(const llama_model* model, bool speculative);

}  // namespace specnative
