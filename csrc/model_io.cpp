#include "model_io.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>

#include "llama.h"

namespace specnative {

namespace {

std::mutex g_log_mutex;
std::string g_last_errors;

void log_callback(ggml_log_level level, const char* text, void* /*user_data*/) {
    static const bool verbose = [] {
        const char* v = std::getenv("SPECNATIVE_VERBOSE");
        return v != nullptr && std::strcmp(v, "0") != 0 && v[0] != '\0';
    }();
    if (level == GGML_LOG_LEVEL_ERROR) {
        std::lock_guard<std::mutex> lock(g_log_mutex);
        g_last_errors += text;
        if (g_last_errors.size() > 4000) {
            g_last_errors.erase(0, g_last_errors.size() - 4000);
        }
    }
    if (verbose || level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

bool has_gguf_magic(const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    char magic[4] = {};
    file.read(magic, 4);
    return file.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace

void ensure_backend() {
    static std::once_flag once;
    std::call_once(once, [] {
        llama_log_set(log_callback, nullptr);
        llama_backend_init();
    });
}

std::string last_llama_errors() {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    std::string errors;
    errors.swap(g_last_errors);
    return errors;
}

llama_model* load_model(const std::string& path, int n_gpu_layers) {
    ensure_backend();
    std::ifstream probe(path, std::ios::binary);
    if (!probe.good()) {
        throw std::invalid_argument("model file not found or not readable: " + path);
    }
    if (!has_gguf_magic(path)) {
        throw std::invalid_argument("not a GGUF file (bad magic): " + path);
    }
    llama_model_params params = llama_model_default_params();
    params.n_gpu_layers = n_gpu_layers;
    last_llama_errors();  // drop stale messages
    llama_model* model = llama_model_load_from_file(path.c_str(), params);
    if (model == nullptr) {
        throw std::runtime_error("llama.cpp could not load " + path + ": " + last_llama_errors());
    }
    return model;
}

ModelInfo describe_model(const llama_model* model, const std::string& path) {
    ModelInfo info;
    info.path = path;
    char buf[256];
    llama_model_desc(model, buf, sizeof(buf));
    info.description = buf;
    info.ftype = llama_ftype_name(llama_model_ftype(model));
    info.n_params = llama_model_n_params(model);
    info.size_bytes = llama_model_size(model);
    info.n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    info.n_layer = llama_model_n_layer(model);
    info.n_ctx_train = llama_model_n_ctx_train(model);
    return info;
}

void quantize_model(const std::string& src, const std::string& dst, const std::string& type_name,
                    int n_threads) {
    ensure_backend();
    static const std::map<std::string, llama_ftype> kTypes = {
        {"F32", LLAMA_FTYPE_ALL_F32},         {"F16", LLAMA_FTYPE_MOSTLY_F16},
        {"BF16", LLAMA_FTYPE_MOSTLY_BF16},    {"Q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},
        {"Q6_K", LLAMA_FTYPE_MOSTLY_Q6_K},    {"Q5_K_M", LLAMA_FTYPE_MOSTLY_Q5_K_M},
        {"Q5_0", LLAMA_FTYPE_MOSTLY_Q5_0},    {"Q4_K_M", LLAMA_FTYPE_MOSTLY_Q4_K_M},
        {"Q4_K_S", LLAMA_FTYPE_MOSTLY_Q4_K_S}, {"Q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},
        {"Q3_K_M", LLAMA_FTYPE_MOSTLY_Q3_K_M}, {"Q2_K", LLAMA_FTYPE_MOSTLY_Q2_K},
    };
    const auto it = kTypes.find(type_name);
    if (it == kTypes.end()) {
        std::string known;
        for (const auto& kv : kTypes) known += " " + kv.first;
        throw std::invalid_argument("unknown quantization type '" + type_name + "'; known:" + known);
    }
    if (!has_gguf_magic(src)) {
        throw std::invalid_argument("not a GGUF file (or missing): " + src);
    }
    llama_model_quantize_params params = llama_model_quantize_default_params();
    params.nthread = n_threads;
    params.ftype = it->second;
    params.allow_requantize = true;
    last_llama_errors();
    if (llama_model_quantize(src.c_str(), dst.c_str(), &params) != 0) {
        throw std::runtime_error("llama_model_quantize failed for " + src + " -> " + dst + ": " +
                                 last_llama_errors());
    }
}

VocabModel::VocabModel(const std::string& path) {
    ensure_backend();
    if (!has_gguf_magic(path)) {
        throw std::invalid_argument("not a GGUF file (or missing): " + path);
    }
    llama_model_params params = llama_model_default_params();
    params.vocab_only = true;
    last_llama_errors();
    model_ = llama_model_load_from_file(path.c_str(), params);
    if (model_ == nullptr) {
        throw std::runtime_error("llama.cpp could not read the vocabulary of " + path + ": " + last_llama_errors());
    }
}

VocabModel::~VocabModel() { llama_model_free(model_); }

std::vector<int32_t> VocabModel::tokenize(const std::string& text, bool add_special, bool parse_special) const {
    const llama_vocab* vocab = llama_model_get_vocab(model_);
    std::vector<int32_t> tokens(text.size() + 8);
    int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                           static_cast<int32_t>(tokens.size()), add_special, parse_special);
    if (n < 0) {  // -n: the size it needs
        tokens.resize(-n);
        n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                           static_cast<int32_t>(tokens.size()), add_special, parse_special);
    }
    if (n < 0) throw std::runtime_error("tokenization failed");
    tokens.resize(n);
    return tokens;
}

std::string VocabModel::chat_template() const {
    const char* tmpl = llama_model_chat_template(model_, nullptr);
    return tmpl ? std::string(tmpl) : std::string();
}

std::string apply_chat_template(const std::string& tmpl,
                                const std::vector<std::pair<std::string, std::string>>& messages,
                                bool add_assistant) {
    std::vector<llama_chat_message> chat;
    size_t chars = 0;
    for (const auto& [role, content] : messages) {
        chat.push_back({role.c_str(), content.c_str()});
        chars += role.size() + content.size();
    }
    std::string out(2 * chars + 256, '\0');
    int32_t n = llama_chat_apply_template(tmpl.c_str(), chat.data(), chat.size(), add_assistant, out.data(),
                                          static_cast<int32_t>(out.size()));
    if (n < 0) {
        throw std::invalid_argument("llama_chat_apply_template does not support this chat template");
    }
    if (n > static_cast<int32_t>(out.size())) {  // n: the length it needs
        out.resize(n);
        n = llama_chat_apply_template(tmpl.c_str(), chat.data(), chat.size(), add_assistant, out.data(), n);
    }
    out.resize(n);
    return out;
}

}  // namespace specnative
