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

// Where a model's weights go, with llama.cpp's names (-ngl, -sm, -ts, -mg, -dev).
struct Placement {
    int n_gpu_layers = 0;               // -1 = all
    std::string split_mode = "layer";   // none, layer, row, tensor
    std::vector<float> tensor_split;    // proportion per device; empty: llama.cpp's default
    int main_gpu = 0;                   // split_mode none: the device used (-1: none)
    std::vector<std::string> devices;   // device names, or {"none"}; empty: llama.cpp's default
                                        // (with RPC servers: only those of `rpc_servers`)
    std::vector<std::string> rpc_servers;  // host:port servers (added) the default list may use
};

// llama.cpp's --rpc: makes each "host:port" rpc-server's devices (named RPC0, RPC1, ...) usable
// by Placement::devices. Each new server is first reached with a TCP connect and ggml-rpc's
// hello, each bounded by `timeout_ms`: a server that is down, refuses, does not answer, or is
// not an rpc-server (closes, answers garbage or another protocol version) is a
// std::invalid_argument naming it, where ggml's RPC client would abort the process or hang.
// Adding a server twice is a no-op (reached again with a TCP connect).
void add_rpc_servers(const std::vector<std::string>& endpoints, int timeout_ms);
// The device names (ggml_backend_dev_name) of the servers' devices, in the servers' order.
std::vector<std::string> rpc_device_names(const std::vector<std::string>& endpoints);

// Throws std::invalid_argument for a missing or non-GGUF file or a bad placement (split mode,
// tensor split, unknown device), std::runtime_error when llama.cpp refuses it.
// load_mtp: also the nextn (MTP) layers, which llama.cpp skips unless a drafter needs them.
llama_model* load_model(const std::string& path, const Placement& placement, bool load_mtp = false);
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
    // vocab_incompatibility (vocab_check.h) with this file as the draft: "" when it can draft
    std::string incompatibility_as_draft_of(const VocabModel& target) const;
    // vocab_tolerated_differences with this file as the draft
    std::vector<std::string> tolerated_differences_as_draft_of(const VocabModel& target) const;

private:
    llama_model* model_ = nullptr;
};

// llama_chat_apply_template over (role, content) pairs; throws std::invalid_argument when
// llama.cpp does not recognise the template (it only knows a fixed list, no Jinja).
std::string apply_chat_template(const std::string& tmpl,
                                const std::vector<std::pair<std::string, std::string>>& messages,
                                bool add_assistant);

}  // namespace specnative
