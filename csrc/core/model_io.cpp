#include "model_io.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <netdb.h>
#include <poll.h>
#include <set>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "llama.h"
#include "vocab_check.h"

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

namespace {

// ------------------------------------------------------------------------------------------
// RPC servers (llama.cpp's --rpc, common/arg.cpp add_rpc_devices)
// ------------------------------------------------------------------------------------------
std::mutex g_rpc_mutex;

// "host:port" split the way ggml's RPC client splits it (at the first ':').
std::pair<std::string, int> parse_endpoint(const std::string& endpoint) {
    const size_t colon = endpoint.find(':');
    const std::string host = colon == std::string::npos ? "" : endpoint.substr(0, colon);
    const std::string port_text = colon == std::string::npos ? "" : endpoint.substr(colon + 1);
    char* end = nullptr;
    const long port = std::strtol(port_text.c_str(), &end, 10);
    if (host.empty() || port_text.empty() || *end != '\0' || port < 1 || port > 65535) {
        throw std::invalid_argument("RPC server '" + endpoint + "' is not host:port (e.g. 127.0.0.1:50052)");
    }
    return {host, static_cast<int>(port)};
}

// ggml-rpc's hello at this llama.cpp commit (ggml/src/ggml-rpc/ggml-rpc.cpp, transport.h): the
// client sends | RPC_CMD_HELLO (1 byte, 14) | request size (uint64, 24) | conn_caps (24 bytes) |
// and the server answers | size (uint64, 28) | major, minor, patch, padding, conn_caps (24) |.
constexpr uint8_t kRpcCmdHello = 14;
constexpr uint64_t kRpcCapsSize = 24;
constexpr uint64_t kRpcHelloReplySize = 4 + kRpcCapsSize;
constexpr int kRpcProtoMajor = 7;  // RPC_PROTO_MAJOR_VERSION (ggml-rpc.h)
constexpr int kRpcProtoMinor = 0;  // RPC_PROTO_MINOR_VERSION: a server's may not be newer

// Sends or receives exactly n bytes within the deadline; "" or what went wrong.
std::string transfer(int fd, void* data, size_t n, bool sending, std::chrono::steady_clock::time_point deadline) {
    auto* bytes = static_cast<uint8_t*>(data);
    size_t done = 0;
    while (done < n) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now()).count();
        pollfd waiting = {fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0};
        const int ready = left > 0 ? poll(&waiting, 1, static_cast<int>(left)) : 0;
        if (ready == 0) return sending ? "did not take the handshake in time" : "timeout";
        if (ready < 0) return std::strerror(errno);
        const ssize_t got = sending ? send(fd, bytes + done, n - done, MSG_NOSIGNAL) : recv(fd, bytes + done, n - done, 0);
        if (got == 0) return "closed";
        if (got < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
            return errno == ECONNRESET || errno == EPIPE ? "closed" : std::strerror(errno);
        }
        done += static_cast<size_t>(got);
    }
    return "";
}

// ggml's hello on a connected socket, bounded: ggml's client aborts the process on a peer that
// closes or answers anything else, and waits forever on one that never answers.
std::string rpc_hello(int fd, int timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    uint8_t request[1 + 8 + kRpcCapsSize] = {kRpcCmdHello};
    std::memcpy(request + 1, &kRpcCapsSize, 8);  // little-endian hosts, as ggml's client assumes
    std::string why = transfer(fd, request, sizeof(request), true, deadline);
    if (why == "closed") return "closed the connection at the handshake: not an rpc-server";
    if (!why.empty()) return "did not take the handshake (" + why + ")";
    uint64_t size = 0;
    why = transfer(fd, &size, sizeof(size), false, deadline);
    if (why == "timeout") {
        return "accepted the connection but sent no handshake reply within " + std::to_string(timeout_ms) +
               " ms: not an rpc-server, or one busy serving another client";
    }
    if (why == "closed") return "closed the connection without a handshake reply: not an rpc-server";
    if (!why.empty()) return "failed during the handshake (" + why + ")";
    if (size != kRpcHelloReplySize) {
        return "answered the handshake with something that is not ggml-rpc's reply (size field " +
               std::to_string(size) + ", expected " + std::to_string(kRpcHelloReplySize) + "): not an rpc-server";
    }
    uint8_t reply[kRpcHelloReplySize] = {};
    why = transfer(fd, reply, sizeof(reply), false, deadline);
    if (!why.empty()) return "cut its handshake reply short (" + why + "): not an rpc-server";
    if (reply[0] != kRpcProtoMajor || reply[1] > kRpcProtoMinor) {
        return "speaks ggml-rpc protocol " + std::to_string(reply[0]) + "." + std::to_string(reply[1]) + "." +
               std::to_string(reply[2]) + ", this build " + std::to_string(kRpcProtoMajor) + "." +
               std::to_string(kRpcProtoMinor) + ": run an rpc-server from the same llama.cpp commit";
    }
    return "";
}

// A TCP connect and ggml-rpc's hello, bounded in time (each by timeout_ms): ggml's client connects
// without a timeout and aborts the process when the connect or the hello fails, so a server that
// is down, does not answer, or is not an rpc-server must be found here first. The probe's
// connection is closed before ggml connects (an rpc-server serves one client at a time).
void probe_endpoint(const std::string& endpoint, int timeout_ms, bool handshake) {
    const auto [host, port] = parse_endpoint(endpoint);
    addrinfo hints = {};
    hints.ai_family = AF_INET;  // ggml's client is IPv4
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || found == nullptr) {
        throw std::invalid_argument("RPC server " + endpoint + ": cannot resolve host '" + host + "'");
    }
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    std::string why, did;
    if (fd < 0) {
        why = std::strerror(errno);
    } else {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
        if (connect(fd, found->ai_addr, found->ai_addrlen) != 0 && errno != EINPROGRESS) {
            why = std::strerror(errno);
        } else {
            pollfd waiting = {fd, POLLOUT, 0};
            const int ready = poll(&waiting, 1, timeout_ms);
            int error = 0;
            socklen_t size = sizeof(error);
            if (ready == 0) {
                why = "no answer within " + std::to_string(timeout_ms) + " ms";
            } else if (ready < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0 || error != 0) {
                why = std::strerror(ready < 0 ? errno : error);
            } else if (handshake) {
                did = rpc_hello(fd, timeout_ms);
            }
        }
        close(fd);
    }
    freeaddrinfo(found);
    if (!why.empty()) {
        throw std::invalid_argument("RPC server " + endpoint + " cannot be reached (" + why +
                                    "); is rpc-server running there?");
    }
    if (!did.empty()) throw std::invalid_argument("RPC server " + endpoint + " " + did);
}

bool is_registered(ggml_backend_reg_t reg) {
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
        if (ggml_backend_reg_get(i) == reg) return true;
    }
    return false;
}

bool is_rpc_device(ggml_backend_dev_t dev) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    return reg != nullptr && std::strcmp(ggml_backend_reg_name(reg), "RPC") == 0;
}

std::string offload_device_names() {
    std::string names;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
            names += std::string(names.empty() ? "" : ", ") + ggml_backend_dev_name(dev) + " (" +
                     ggml_backend_dev_description(dev) + ")";
        }
    }
    return names.empty() ? "none in this build and process" : names;
}

// ------------------------------------------------------------------------------------------
// Placement -> llama_model_params
// ------------------------------------------------------------------------------------------
llama_split_mode split_mode_of(const std::string& name) {
    if (name == "none") return LLAMA_SPLIT_MODE_NONE;
    if (name == "layer") return LLAMA_SPLIT_MODE_LAYER;
    if (name == "row") return LLAMA_SPLIT_MODE_ROW;
    if (name == "tensor") return LLAMA_SPLIT_MODE_TENSOR;
    throw std::invalid_argument("split_mode must be none, layer, row or tensor, not '" + name + "'");
}

// NULL-terminated device list for llama_model_params.devices; empty: let llama.cpp choose.
std::vector<ggml_backend_dev_t> resolve_devices(const std::vector<std::string>& names) {
    std::vector<ggml_backend_dev_t> devices;
    if (names.size() == 1 && names[0] == "none") {
        return {nullptr};  // an empty list: no offload (llama.cpp's -dev none)
    }
    for (const std::string& name : names) {
        ggml_backend_dev_t dev = ggml_backend_dev_by_name(name.c_str());
        if (dev == nullptr || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            throw std::invalid_argument("unknown offload device '" + name + "'; available: " +
                                        offload_device_names() + " (or 'none'; RPC devices appear once "
                                        "their servers are given)");
        }
        devices.push_back(dev);
    }
    if (!devices.empty()) devices.push_back(nullptr);
    return devices;
}

// llama.cpp's default device choice uses every registered RPC device, but RPC servers are
// process-wide: an Engine must not land on servers another Engine added. With RPC devices
// registered, the default list is spelled out the way llama.cpp orders it (this Engine's RPC
// servers first, then GPUs, integrated GPUs only without GPUs); otherwise llama.cpp chooses.
std::vector<ggml_backend_dev_t> default_devices(const std::vector<std::string>& rpc_servers) {
    std::vector<ggml_backend_dev_t> gpus, igpus;
    bool any_rpc = false;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const auto type = ggml_backend_dev_type(dev);
        if (is_rpc_device(dev)) {
            any_rpc = true;
        } else if (type == GGML_BACKEND_DEVICE_TYPE_GPU) {
            gpus.push_back(dev);
        } else if (type == GGML_BACKEND_DEVICE_TYPE_IGPU) {
            igpus.push_back(dev);
        }
    }
    if (!any_rpc) return {};
    std::vector<ggml_backend_dev_t> devices;
    for (const std::string& name : rpc_device_names(rpc_servers)) {
        devices.push_back(ggml_backend_dev_by_name(name.c_str()));
    }
    const auto& local = gpus.empty() ? igpus : gpus;
    devices.insert(devices.end(), local.begin(), local.end());
    devices.push_back(nullptr);  // (an empty list: no offload)
    return devices;
}

void check_tensor_split(const Placement& placement, size_t n_devices) {
    if (placement.tensor_split.size() > llama_max_devices()) {
        throw std::invalid_argument("tensor_split has " + std::to_string(placement.tensor_split.size()) +
                                    " entries; llama.cpp takes at most " + std::to_string(llama_max_devices()));
    }
    if (n_devices > 0 && placement.tensor_split.size() > n_devices) {
        throw std::invalid_argument("tensor_split has " + std::to_string(placement.tensor_split.size()) +
                                    " entries for " + std::to_string(n_devices) + " device(s)");
    }
    for (float share : placement.tensor_split) {
        if (!std::isfinite(share) || share < 0) {
            throw std::invalid_argument("tensor_split entries must be finite proportions >= 0");
        }
    }
}

}  // namespace

void add_rpc_servers(const std::vector<std::string>& endpoints, int timeout_ms) {
    if (endpoints.empty()) return;
    ensure_backend();
    for (const std::string& endpoint : endpoints) parse_endpoint(endpoint);  // all well-formed first
    ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
    if (rpc == nullptr) {
        throw std::invalid_argument("this build has no RPC backend: rebuild with -DSPECNATIVE_RPC=ON "
                                    "(GGML_RPC) to use RPC servers");
    }
    using add_server_fn = ggml_backend_reg_t (*)(const char* endpoint);
    auto add_server = reinterpret_cast<add_server_fn>(ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_add_server"));
    if (add_server == nullptr) {
        throw std::runtime_error("the RPC backend lacks ggml_backend_rpc_add_server");
    }
    std::lock_guard<std::mutex> lock(g_rpc_mutex);
    for (const std::string& endpoint : endpoints) {
        // A server added before has a live client in ggml (one client at a time: a hello would
        // wait behind it), so it is only reached again; a new one must also answer ggml's hello.
        probe_endpoint(endpoint, timeout_ms, rpc_device_names({endpoint}).empty());
        ggml_backend_reg_t reg = add_server(endpoint.c_str());  // cached per endpoint by ggml
        if (reg == nullptr) {
            throw std::invalid_argument("RPC server " + endpoint + " offers no devices");
        }
        if (!is_registered(reg)) ggml_backend_register(reg);
    }
}

std::vector<std::string> rpc_device_names(const std::vector<std::string>& endpoints) {
    std::vector<std::string> names;
    for (const std::string& endpoint : endpoints) {
        for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
            ggml_backend_dev_t dev = ggml_backend_dev_get(i);
            if (is_rpc_device(dev) && endpoint == ggml_backend_dev_description(dev)) {
                names.push_back(ggml_backend_dev_name(dev));
            }
        }
    }
    return names;
}

llama_model* load_model(const std::string& path, int n_gpu_layers) {
    Placement placement;
    placement.n_gpu_layers = n_gpu_layers;
    return load_model(path, placement);
}

llama_model* load_model(const std::string& path, const Placement& placement, bool load_mtp) {
    ensure_backend();
    std::ifstream probe(path, std::ios::binary);
    if (!probe.good()) {
        throw std::invalid_argument("model file not found or not readable: " + path);
    }
    if (!has_gguf_magic(path)) {
        throw std::invalid_argument("not a GGUF file (bad magic): " + path);
    }
    llama_model_params params = llama_model_default_params();
    params.n_gpu_layers = placement.n_gpu_layers;
    params.load_mtp = load_mtp;
    params.split_mode = split_mode_of(placement.split_mode);
    if (placement.main_gpu < -1) throw std::invalid_argument("main_gpu must be >= -1 (-1: no device)");
    params.main_gpu = placement.main_gpu;
    std::vector<ggml_backend_dev_t> devices =
        placement.devices.empty() ? default_devices(placement.rpc_servers) : resolve_devices(placement.devices);
    const size_t n_devices = devices.empty() ? 0 : devices.size() - 1;
    if (!placement.devices.empty() && params.split_mode == LLAMA_SPLIT_MODE_NONE && n_devices > 0 &&
        placement.main_gpu >= static_cast<int>(n_devices)) {
        throw std::invalid_argument("main_gpu " + std::to_string(placement.main_gpu) + " is not one of the " +
                                    std::to_string(n_devices) + " device(s) given");
    }
    params.devices = devices.empty() ? nullptr : devices.data();
    check_tensor_split(placement, placement.devices.empty() ? 0 : n_devices);
    std::vector<float> split(llama_max_devices(), 0.0f);  // llama.cpp reads llama_max_devices() entries
    std::copy(placement.tensor_split.begin(), placement.tensor_split.end(), split.begin());
    if (!placement.tensor_split.empty()) params.tensor_split = split.data();
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
    // No devices: with none given llama.cpp asks every registered device for its memory, and an
    // RPC device whose server has gone (they stay registered for the process) aborts there.
    static ggml_backend_dev_t no_devices[] = {nullptr};
    params.devices = no_devices;
    last_llama_errors();
    model_ = llama_model_load_from_file(path.c_str(), params);
    if (model_ == nullptr) {
        throw std::runtime_error("llama.cpp could not read the vocabulary of " + path + ": " + last_llama_errors());
    }
    // The checks an Engine makes at load (llama.cpp's tokenizer asserts on a file without one)
    const std::string why = generation_unsupported(model_, false);
    if (!why.empty()) {
        llama_model_free(model_);
        model_ = nullptr;
        throw std::invalid_argument("cannot generate with " + path + ": " + why);
    }
}

std::string VocabModel::incompatibility_as_draft_of(const VocabModel& target) const {
    return vocab_incompatibility(target.model_, model_);
}

std::vector<std::string> VocabModel::tolerated_differences_as_draft_of(const VocabModel& target) const {
    return vocab_tolerated_differences(target.model_, model_);
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
