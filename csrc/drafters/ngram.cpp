// llama.cpp's model-free n-gram drafters, driven through its own `common` library exactly as its
// server and llama-speculative-simple drive them (common/speculative.h): common_speculative_init
// with one --spec-type, common_speculative_begin per sequence with its prompt, then per round
// common_speculative_get_draft_params + common_speculative_draft for all sequences together and
// common_speculative_accept per sequence. Nothing of the n-gram algorithms is reimplemented here.
//
// A lookup proposes 0..n tokens: nothing when the history holds no matching n-gram (that round
// is a plain target step for the sequence). Drafts are deterministic, so when sampling the
// proposal distribution is one-hot: the rejection rule then accepts x with probability p(x) and
// resamples from p without x (still exactly p in distribution); `match` works unchanged.
#include "common_loop.h"
#include "drafter.h"
#include "phase_clock.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <sys/stat.h>

#ifdef SPECNATIVE_HAVE_COMMON
#include "common.h"
#include "ngram-cache.h"
#include "speculative.h"
#endif

namespace specnative {

const std::vector<std::string>& drafter_names() {
    static const std::vector<std::string> names = {"model",     "ngram-simple", "ngram-map-k", "ngram-map-k4v",
                                                   "ngram-mod", "ngram-cache",  "dflash",      "dspark",
                                                   "eagle3",    "mtp"};
    return names;
}

bool is_ngram_drafter(const std::string& name) {
    return name.rfind("ngram-", 0) == 0 && std::find(drafter_names().begin(), drafter_names().end(), name) != drafter_names().end();
}

#ifdef SPECNATIVE_HAVE_COMMON
namespace {

// One option of common_params_speculative by its llama.cpp CLI name, with arg.cpp's range.
struct IntOption {
    const char* name;
    int lo, hi;
    std::function<int&(common_params_speculative&)> field;
};

const std::vector<IntOption>& int_options() {
    // (the ngram-map-style groups hold uint16_t fields: kMapGroups below)
    static const std::vector<IntOption> options = {
        {"spec-ngram-mod-n-match", 1, 1024, [](common_params_speculative& c) -> int& { return c.ngram_mod.n_match; }},
        {"spec-ngram-mod-n-min", 0, 1024, [](common_params_speculative& c) -> int& { return c.ngram_mod.n_min; }},
        {"spec-ngram-mod-n-max", 0, 1024, [](common_params_speculative& c) -> int& { return c.ngram_mod.n_max; }},
    };
    return options;
}

// The three ngram-map-style option groups (uint16_t fields in llama.cpp).
struct MapGroup {
    const char* prefix;  // spec-ngram-simple, spec-ngram-map-k, spec-ngram-map-k4v
    common_params_speculative_ngram_map common_params_speculative::*field;
};
const MapGroup kMapGroups[] = {
    {"spec-ngram-simple", &common_params_speculative::ngram_simple},
    {"spec-ngram-map-k", &common_params_speculative::ngram_map_k},
    {"spec-ngram-map-k4v", &common_params_speculative::ngram_map_k4v},
};

int parse_int(const std::string& name, const std::string& value, int lo, int hi) {
    size_t used = 0;
    long v = 0;
    try {
        v = std::stol(value, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used == 0 || used != value.size()) {
        throw std::invalid_argument("drafter option " + name + " must be an integer, not '" + value + "'");
    }
    if (v < lo || v > hi) {
        throw std::invalid_argument("drafter option " + name + "=" + value + " is out of llama.cpp's range [" +
                                    std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return static_cast<int>(v);
}

// A lookup cache file as common_ngram_cache_load reads it (records of one n-gram, a count of
// continuations, then (token, count) pairs). llama.cpp asserts (aborts the process) on a damaged
// file, so its structure is checked here first; the contents are read by llama.cpp itself.
void check_lookup_cache_file(const std::string& option, const std::string& path) {
    // A regular file first: llama.cpp opens a directory and then asserts on the failed read, and
    // opening a FIFO blocks until someone writes to it.
    struct stat info = {};
    if (stat(path.c_str(), &info) != 0) {
        throw std::invalid_argument(option + ": cannot read the lookup cache file '" + path + "' (" +
                                    std::strerror(errno) + ")");
    }
    if (!S_ISREG(info.st_mode)) {
        throw std::invalid_argument(option + ": '" + path + "' is " +
                                    (S_ISDIR(info.st_mode) ? "a directory" : "not a regular file (a FIFO, socket or device)") +
                                    ", not a llama.cpp lookup cache file");
    }
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::invalid_argument(option + ": cannot read the lookup cache file '" + path + "'");
    auto bad = [&](const std::string& why) {
        return std::invalid_argument(option + ": '" + path + "' is not a llama.cpp lookup cache (" + why +
                                     "); make one with llama-lookup-create");
    };
    common_ngram ngram;
    while (f.read(reinterpret_cast<char*>(&ngram), sizeof(ngram))) {
        int32_t n_tokens = 0;
        if (!f.read(reinterpret_cast<char*>(&n_tokens), sizeof(n_tokens)) || n_tokens <= 0) {
            throw bad("a record without continuations");
        }
        for (int32_t i = 0; i < n_tokens; ++i) {
            int32_t token_and_count[2];
            if (!f.read(reinterpret_cast<char*>(token_and_count), sizeof(token_and_count)) || token_and_count[1] <= 0) {
                throw bad("a truncated or zero-count record");
            }
        }
    }
    if (f.gcount() != 0) throw bad("it ends inside a record");
}

common_params_speculative to_common_params(const DrafterParams& params) {
    common_params_speculative c;
    const common_speculative_type type = common_speculative_type_from_name(params.type);
    c.types = {type};
    for (const auto& [name, value] : params.options) {
        bool known = false;
        for (const IntOption& o : int_options()) {
            if (name == o.name) {
                o.field(c) = parse_int(name, value, o.lo, o.hi);
                known = true;
            }
        }
        for (const MapGroup& g : kMapGroups) {
            common_params_speculative_ngram_map& m = c.*(g.field);
            const std::string prefix = g.prefix;
            if (name == prefix + "-size-n") m.size_n = static_cast<uint16_t>(parse_int(name, value, 1, 1024)), known = true;
            if (name == prefix + "-size-m") m.size_m = static_cast<uint16_t>(parse_int(name, value, 1, 1024)), known = true;
            if (name == prefix + "-min-hits") m.min_hits = static_cast<uint16_t>(parse_int(name, value, 1, 65535)), known = true;
        }
        if (name == "lookup-cache-static") c.ngram_cache.lookup_cache_static = value, known = true;
        if (name == "lookup-cache-dynamic") c.ngram_cache.lookup_cache_dynamic = value, known = true;
        if (!known) {
            std::string all;
            for (const auto& [n, v] : ngram_drafter_defaults()) all += (all.empty() ? "" : ", ") + n;
            throw std::invalid_argument("unknown drafter option '" + name + "' (llama.cpp's names: " + all + ")");
        }
    }
    for (const auto& [name, value] : params.options) {
        const std::string owner = drafter_of_option(name);
        if (owner != params.type) {  // llama.cpp would ignore it: the run would not be what was asked
            throw std::invalid_argument("drafter option " + name + " belongs to drafter " + owner + ", not " +
                                        params.type);
        }
    }
    if (type == COMMON_SPECULATIVE_TYPE_NGRAM_CACHE) {
        if (!c.ngram_cache.lookup_cache_static.empty()) {
            check_lookup_cache_file("lookup-cache-static", c.ngram_cache.lookup_cache_static);
        }
        if (!c.ngram_cache.lookup_cache_dynamic.empty()) {
            check_lookup_cache_file("lookup-cache-dynamic", c.ngram_cache.lookup_cache_dynamic);
        }
    }
    return c;
}

// llama.cpp's n-gram lookups through the shared common_speculative loop (common_loop.h).
class NgramDrafter final : public CommonSpeculativeDrafter {
public:
    NgramDrafter(const DrafterParams& params, const GenerateParams& p, int n_seq, int target_vocab)
        : CommonSpeculativeDrafter(p, n_seq, target_vocab), cparams_(to_common_params(params)) {
        init(cparams_, n_seq, params.type);
    }

    void begin(std::vector<Engine::Sequence>& seqs, int /*shared_prefix*/) override {
        for (Engine::Sequence& seq : seqs) start(seq);
    }
    void admit(Engine::Sequence& seq) override { start(seq); }
    void release(const Engine::Sequence& seq) override { forget(seq); }

private:
    common_params_speculative cparams_;
};

}  // namespace

std::map<std::string, std::string> ngram_drafter_defaults() {
    common_params_speculative c;  // llama.cpp's defaults (common/common.h)
    std::map<std::string, std::string> out;
    for (const IntOption& o : int_options()) out[o.name] = std::to_string(o.field(c));
    for (const MapGroup& g : kMapGroups) {
        const common_params_speculative_ngram_map& m = c.*(g.field);
        const std::string prefix = g.prefix;
        out[prefix + "-size-n"] = std::to_string(m.size_n);
        out[prefix + "-size-m"] = std::to_string(m.size_m);
        out[prefix + "-min-hits"] = std::to_string(m.min_hits);
    }
    out["lookup-cache-static"] = c.ngram_cache.lookup_cache_static;
    out["lookup-cache-dynamic"] = c.ngram_cache.lookup_cache_dynamic;
    return out;
}

std::string drafter_of_option(const std::string& option) {
    if (ngram_drafter_defaults().count(option) == 0) return "";
    if (option.rfind("lookup-cache-", 0) == 0) return "ngram-cache";
    // spec-ngram-<type>-<field>: the longest type name that prefixes it (map-k4v before map-k)
    std::string owner;
    for (const std::string& type : drafter_names()) {
        if (option.rfind("spec-" + type + "-", 0) == 0 && type.size() > owner.size()) owner = type;
    }
    return owner;
}

void validate_drafter(const DrafterParams& params) {
    if (std::find(drafter_names().begin(), drafter_names().end(), params.type) == drafter_names().end()) {
        std::string all;
        for (const auto& n : drafter_names()) all += (all.empty() ? "" : ", ") + n;
        throw std::invalid_argument("unknown drafter '" + params.type + "' (one of: " + all + ")");
    }
    if (!is_ngram_drafter(params.type)) {  // the draft model and the hidden-state drafters
        if (!params.options.empty()) {
            throw std::invalid_argument("drafter '" + params.type + "' takes no n-gram options (got " +
                                        params.options.begin()->first + ")");
        }
        return;
    }
    to_common_params(params);  // throws for a bad option or cache file
}

std::unique_ptr<Drafter> make_ngram_drafter(const DrafterParams& params, const GenerateParams& p, int n_seq,
                                            int target_vocab) {
    return std::make_unique<NgramDrafter>(params, p, n_seq, target_vocab);
}

#else  // built against prebuilt llama.cpp libraries without `common`

std::map<std::string, std::string> ngram_drafter_defaults() { return {}; }

std::string drafter_of_option(const std::string&) { return ""; }

void validate_drafter(const DrafterParams& params) {
    if (params.type == "model") return;
    if (is_hidden_drafter(params.type)) return;  // refused with the reason when the drafter is made
    throw std::invalid_argument("drafter '" + params.type + "' needs llama.cpp's common library, which this "
                                "build does not link (SPECNATIVE_PREBUILT_LLAMA without libllama-common)");
}

std::unique_ptr<Drafter> make_ngram_drafter(const DrafterParams& params, const GenerateParams&, int, int) {
    validate_drafter(params);
    return nullptr;
}

#endif

}  // namespace specnative
