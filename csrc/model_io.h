// Loading, describing and quantizing GGUF models; llama.cpp's log routing.
#pragma once

#include <cstdint>
#include <string>

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

}  // namespace specnative
