// Can a draft model speculate for a target model? The same conditions llama.cpp's
// common_speculative_are_compatible checks, reported as a reason instead of a log line.
#pragma once

#include <string>

struct llama_model;

namespace specnative {

// Returns an empty string when compatible, else a sentence saying what differs.
std::string vocab_incompatibility(const llama_model* target, const llama_model* draft);

}  // namespace specnative
