// Loading, describing and quantizing GGUF models; llama.cpp's log routing.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

struct llama_model;

namespace specnative {

// Initialises the llama.cpp backend once per process and routes its log to stderr only at the
// chosen level (SPECNATIVE_VERBOSE=1 shows everything), remembering the last error lines so that
// exceptions can say what llama.cpp complained about.
void ensure_backend();
std::string last_llama_errors();

// Throws std::invalid_argument for a missing or non-GGUF file, std::runtime_error when
// llama.cpp refuses it.
llama_model* load_model(const std::string& path, int n_gpu_layers);

struct ModelInfo {
    std::string path;
    std::string description;  // llama_model_desc, e.g. "llama ?B Q8_0"
    std::string ftype;        // llama_ftype_name, e.g. "Q4_K - Medium"
    uint64_t n_params = 0;
    uint64_t size_bytes = 0;
    int32_t n_vocab = 0;
    int32_t n_layer = 0;
    int32_t n_ctx_train = 0;
};
ModelInfo describe_model(const llama_model* model, const std::string& path);

// llama_model_quantize with allow_requantize; `type_name` is e.g. "Q8_0", "Q4_0", "Q4_K_M", "F16".
void quantize_model(const std::string& src, const std::string& dst, const std::string& type_name,
                    int n_threads);

// A model's tokenizer alone (llama.cpp's vocab_only load: metadata, no weights), for building
// prompts before an engine exists: special-token parsing (a chat template's markers) and the
// model's own chat template.
class VocabModel {
public:
    explicit VocabModel(const std::string& path);
    ~VocabModel();
    VocabModel(const VocabModel&) = delete;
    VocabModel& operator=(const VocabModel&) = delete;
    std::vector<int32_t> tokenize(const std::string& text, bool add_special, bool parse_special) const;
    std::string chat_template() const;  // "" when the file has none

private:
    llama_model* model_ = nullptr;
};

// llama_chat_apply_template over (role, content) pairs; throws std::invalid_argument when
// llama.cpp does not recognise the template (it only knows a fixed list, no Jinja).
std::string apply_chat_template(const std::string& tmpl,
                                const std::vector<std::pair<std::string, std::string>>& messages,
                                bool add_assistant);

}  // namespace specnative
