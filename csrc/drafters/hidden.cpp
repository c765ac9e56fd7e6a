// llama.cpp's drafters that read the target's hidden states, driven through its own `common`
// library as llama-server and llama-speculative-simple drive them (common/speculative.h):
// draft-dflash (a DFlash or DFlash2 block drafter), draft-dspark (DFlash + a Markov head),
// draft-eagle3, and draft-mtp (the target's own nextn head). Per generate(): common_speculative_init
// (which turns on the target context's feature extraction), common_speculative_process after
// every target decode (prefill chunks and verify; the engine's `draft_ingest` step),
// common_speculative_draft for all sequences, common_speculative_accept per sequence. Serving
// (serve_loop.cpp) drives the same calls per slot: process() over each mixed batch, begin at a
// request's first token, the slot's draft cells dropped when its request finishes. The rollback
// contract of llama-speculative-simple: after a draft the draft cache drops the sequence's cells
// from pos0 on (DFlash leaves its noise block there); after accept it is trimmed to the target's.
// Nothing of the drafters is reimplemented here; what is ours: refusing a pair llama.cpp would
// abort on, from the GGUF metadata alone, before anything is loaded.
#include "common_loop.h"
#include "drafter.h"
#include "phase_clock.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "gguf.h"

#ifdef SPECNATIVE_HAVE_COMMON
#include "common.h"
#include "log.h"
#include "speculative.h"
#include "../src/llama-ext.h"  // staging API: the extraction switches and the draft's target layer ids
#endif

namespace specnative {

namespace {

const std::vector<std::string>& hidden_names() {
    static const std::vector<std::string> names = {"dflash", "dspark", "eagle3", "mtp"};
    return names;
}

// Target architectures whose graph publishes layer inputs (t_layer_inp) at this commit: the ones
// DFlash, DSpark and EAGLE-3 can read (src/models/*.cpp). Gemma 3, for one, does not.
const std::vector<std::string>& layer_input_archs() {
    static const std::vector<std::string> archs = {
        "llama", "nanbeige", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen4exp", "gemma3n",
        "gemma4", "deepseek4", "nemotron_h", "bailingmoe3", "hunyuan_vl", "gpt-oss", "lfm2", "minimax-01",
        "minimax-m2", "mimo2"};
    return archs;
}

// A GGUF file's metadata (no tensor data read), with typed lookups that never assert.
class GgufMeta {
public:
    explicit GgufMeta(const std::string& path) : path_(path) {
        gguf_init_params params = {/*no_alloc=*/true, /*ctx=*/nullptr};
        ctx_ = gguf_init_from_file(path.c_str(), params);
        if (ctx_ == nullptr) throw std::invalid_argument("cannot read " + path + " as a GGUF file");
    }
    ~GgufMeta() { gguf_free(ctx_); }
    GgufMeta(const GgufMeta&) = delete;
    GgufMeta& operator=(const GgufMeta&) = delete;

    std::string str(const std::string& key) const {
        const int64_t id = gguf_find_key(ctx_, key.c_str());
        return id >= 0 && gguf_get_kv_type(ctx_, id) == GGUF_TYPE_STRING ? gguf_get_val_str(ctx_, id) : "";
    }
    // -1 when absent or not an integer
    int64_t integer(const std::string& key) const {
        const int64_t id = gguf_find_key(ctx_, key.c_str());
        if (id < 0) return -1;
        switch (gguf_get_kv_type(ctx_, id)) {
            case GGUF_TYPE_UINT32: return gguf_get_val_u32(ctx_, id);
            case GGUF_TYPE_INT32: return gguf_get_val_i32(ctx_, id);
            case GGUF_TYPE_UINT64: return static_cast<int64_t>(gguf_get_val_u64(ctx_, id));
            case GGUF_TYPE_INT64: return gguf_get_val_i64(ctx_, id);
            default: return -1;
        }
    }
    std::vector<int64_t> int_array(const std::string& key) const {
        std::vector<int64_t> out;
        const int64_t id = gguf_find_key(ctx_, key.c_str());
        if (id < 0 || gguf_get_kv_type(ctx_, id) != GGUF_TYPE_ARRAY) return out;
        const gguf_type t = gguf_get_arr_type(ctx_, id);
        const size_t n = gguf_get_arr_n(ctx_, id);
        const void* data = gguf_get_arr_data(ctx_, id);
        for (size_t i = 0; i < n; ++i) {
            if (t == GGUF_TYPE_INT32) out.push_back(static_cast<const int32_t*>(data)[i]);
            else if (t == GGUF_TYPE_UINT32) out.push_back(static_cast<const uint32_t*>(data)[i]);
        }
        return out;
    }
    bool has_tensor(const std::string& name) const { return gguf_find_tensor(ctx_, name.c_str()) >= 0; }
    std::string arch() const { return str("general.architecture"); }
    const std::string& path() const { return path_; }

private:
    std::string path_;
    gguf_context* ctx_ = nullptr;
};

// The drafter kind a file is: dflash, dflash2, dspark or eagle3; "" for any other model.
std::string kind_of(const GgufMeta& m) {
    const std::string arch = m.arch();
    if (arch == "eagle3") return "eagle3";
    if (arch != "dflash") return "";
    if (m.has_tensor("markov_w1.weight")) return "dspark";  // as common_speculative_types_from_gguf
    if (m.has_tensor("selector_hidden.weight")) return "dflash2";
    return "dflash";
}

// Trunk layers of a model (block_count without its nextn layers).
int64_t trunk_layers(const GgufMeta& m) {
    const int64_t blocks = m.integer(m.arch() + ".block_count");
    const int64_t nextn = std::max<int64_t>(0, m.integer(m.arch() + ".nextn_predict_layers"));
    return blocks - nextn;
}

std::string describe(const GgufMeta& m) { return m.path() + " (architecture " + m.arch() + ")"; }

}  // namespace

bool is_hidden_drafter(const std::string& name) {
    return std::find(hidden_names().begin(), hidden_names().end(), name) != hidden_names().end();
}

std::string hidden_drafter_file_kind(const std::string& path) {
    try {
        return kind_of(GgufMeta(path));
    } catch (const std::invalid_argument&) {
        return "";  // not a readable GGUF: load_model says what is wrong with it
    }
}

bool hidden_kind_serves(const std::string& drafter, const std::string& file_kind) {
    return drafter == file_kind || (drafter == "dflash" && file_kind == "dflash2");
}

void check_hidden_pair(const std::string& target_path, const std::string& draft_path) {
    const GgufMeta target(target_path);
    const std::string t_arch = target.arch();
    if (draft_path.empty()) {  // mtp: the target's own nextn head
        const int64_t blocks = target.integer(t_arch + ".block_count");
        const bool has_nextn = target.integer(t_arch + ".nextn_predict_layers") > 0 &&
                               target.has_tensor("blk." + std::to_string(blocks - 1) + ".nextn.eh_proj.weight");
        if (!has_nextn) {
            throw std::invalid_argument("drafter 'mtp' needs a target with nextn (MTP) layers; " + describe(target) +
                                        " has none");
        }
        return;
    }
    const GgufMeta draft(draft_path);
    const std::string kind = kind_of(draft);
    if (kind.empty()) {
        throw std::invalid_argument(describe(draft) + " is not a DFlash, DSpark or EAGLE-3 draft");
    }
    if (std::find(layer_input_archs().begin(), layer_input_archs().end(), t_arch) == layer_input_archs().end()) {
        throw std::invalid_argument("a " + kind + " draft reads the target's layer inputs, which " + describe(target) +
                                    " does not publish at this llama.cpp commit");
    }
    const std::string d_arch = draft.arch();
    const int64_t n_embd_target = target.integer(t_arch + ".embedding_length");
    const int64_t n_embd_draft = draft.integer(d_arch + ".embedding_length");
    if (d_arch == "eagle3") {
        const int64_t hidden = draft.integer("eagle3.target_hidden_size");
        if (hidden != n_embd_target) {
            throw std::invalid_argument(describe(draft) + " was made for a target of n_embd " + std::to_string(hidden) +
                                        "; " + describe(target) + " has n_embd " + std::to_string(n_embd_target));
        }
        if (!draft.has_tensor("token_embd.weight") && n_embd_draft != n_embd_target) {
            throw std::invalid_argument(describe(draft) + " borrows the target's token embeddings but its n_embd " +
                                        std::to_string(n_embd_draft) + " differs from the target's " +
                                        std::to_string(n_embd_target));
        }
    } else if (n_embd_draft != n_embd_target) {
        throw std::invalid_argument(describe(draft) + " has n_embd " + std::to_string(n_embd_draft) + " but " +
                                    describe(target) + " has n_embd " + std::to_string(n_embd_target) +
                                    " (a DFlash draft reads features of its own width)");
    }
    const std::vector<int64_t> layers = draft.int_array(d_arch + ".target_layers");
    const int64_t n_layer = trunk_layers(target);
    if (layers.empty()) throw std::invalid_argument(describe(draft) + " has no " + d_arch + ".target_layers");
    for (int64_t id : layers) {
        if (id < 0 || id >= n_layer) {
            throw std::invalid_argument(describe(draft) + " reads target layer " + std::to_string(id) + " but " +
                                        describe(target) + " has " + std::to_string(n_layer) + " layers");
        }
    }
    if (d_arch == "dflash" && draft.integer("tokenizer.ggml.mask_token_id") < 0) {
        throw std::invalid_argument(describe(draft) + " has no mask token (tokenizer.ggml.mask_token_id), which a "
                                    "DFlash block drafter needs");
    }
}

HiddenDraft::~HiddenDraft() {
    if (ctx != nullptr) llama_free(ctx);
    if (owns_model && model != nullptr) llama_model_free(model);
}

void open_hidden_context(HiddenDraft& h, llama_context* target_ctx, const EngineParams& params) {
    // as common_base_params_to_speculative + common_speculative_init_result build ctx_dft
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = llama_n_ctx(target_ctx);  // as many tokens per sequence as the target
    cp.n_batch = params.n_batch;
    cp.n_ubatch = params.n_batch;
    cp.n_seq_max = params.n_seq_max;
    cp.n_rs_seq = 0;
    cp.n_threads = params.n_threads;
    cp.n_threads_batch = params.n_threads;
    cp.flash_attn_type = static_cast<llama_flash_attn_type>(params.flash_attn);
    cp.kv_unified = params.kv_unified;
    cp.swa_full = true;
    cp.no_perf = true;
    cp.ctx_other = target_ctx;  // borrowed embeddings and output head; the MTP head's trunk
    if (h.kind == "mtp") cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    last_llama_errors();
    h.ctx = llama_init_from_model(h.model, cp);
    if (h.ctx == nullptr) {
        throw std::runtime_error("llama.cpp could not create the " + h.kind + " draft context: " + last_llama_errors());
    }
}

#ifdef SPECNATIVE_HAVE_COMMON
namespace {

// common's own log (LOG_INF of each drafter's setup) to errors only, as llama.cpp's log is routed
// (model_io.cpp): SPECNATIVE_VERBOSE=1 shows everything.
void quiet_common_log() {
    static const bool once = [] {
        const char* v = std::getenv("SPECNATIVE_VERBOSE");
        if (v == nullptr || std::string(v) != "1") common_log_set_verbosity_thold(LOG_LEVEL_ERROR);
        return true;
    }();
    (void)once;
}

common_speculative_type common_type(const std::string& drafter) {
    return common_speculative_type_from_name("draft-" + drafter);
}

// A hidden-state drafter through the shared common_speculative loop (common_loop.h), plus what
// these need: common_speculative_process on every target decode (the extracted features) and the
// draft cache trimmed after each draft and each verify.
class HiddenDrafter final : public CommonSpeculativeDrafter {
public:
    HiddenDrafter(HiddenDraft& h, Engine::Context& target, const GenerateParams& p, int n_seq, bool trim_after_draft)
        : CommonSpeculativeDrafter(p, n_seq, target.n_vocab), h_(h), target_(target),
          trim_after_draft_(trim_after_draft) {
        cparams_.types = {common_type(p.drafter.type)};
        cparams_.draft.n_max = p.k;  // DFlash clamps it to block_size - 1 itself
        cparams_.draft.n_min = 0;
        cparams_.draft.p_min = 0.0f;
        cparams_.draft.backend_sampling = false;  // the CPU sampler: the top candidate, as on the backend
        cparams_.draft.ctx_tgt = target.ctx;
        cparams_.draft.ctx_dft = h.ctx;
        llama_memory_clear(llama_get_memory(h.ctx), true);
        quiet_common_log();
        init(cparams_, n_seq, p.drafter.type);  // turns the target's extraction on
        batch_ = common_batch(target.ctx);
    }

    // The target context goes back to plain decoding (what a user runs without speculation).
    ~HiddenDrafter() override {
        release_state();
        const int32_t n_layer = llama_model_n_layer(llama_get_model(target_.ctx));
        if (h_.kind != "mtp") {
            const int32_t* ids = llama_model_target_layer_ids(h_.model);
            for (uint32_t i = 0; i < llama_model_target_layer_ids_n(h_.model); ++i) {
                if (ids[i] >= 0 && ids[i] <= n_layer) llama_set_embeddings_layer_inp(target_.ctx, ids[i], false);
            }
        }
        llama_set_embeddings_nextn(target_.ctx, false, false);
    }

    // common_speculative_process on what the target just decoded: the features it extracted.
    void after_target_decode(const llama_batch& batch) override {
        const ScopedMs timer(library_ms_);
        batch_.clear();
        for (int i = 0; i < batch.n_tokens; ++i) {
            batch_.add(batch.token[i], batch.pos[i], batch.seq_id[i][0], batch.logits[i] != 0);
        }
        if (!common_speculative_process(state(), batch_)) {
            throw std::runtime_error("llama.cpp's " + p_.drafter.type + " drafter failed to process a target batch: " +
                                     last_llama_errors());
        }
        llama_synchronize(h_.ctx);  // its clock stops after the device work
    }

    void begin(std::vector<Engine::Sequence>& seqs, int /*shared_prefix*/) override {
        for (Engine::Sequence& seq : seqs) {
            check_prompt_ingested(seq);
            start(seq);
        }
    }

    // Serving (serve_loop.cpp), as llama-server runs these drafters: the slot's new request was
    // ingested by process() from the target's prefill chunks (its draft cells were dropped when the
    // slot's last request finished); its history begins with its prompt.
    void admit(Engine::Sequence& seq) override {
        check_prompt_ingested(seq);
        start(seq);
    }
    // The finished request's draft cells go, so the slot's next prompt is ingested into an empty
    // sequence; its history is dropped.
    void release(const Engine::Sequence& seq) override {
        {
            const ScopedMs timer(library_ms_);
            llama_memory_seq_rm(llama_get_memory(h_.ctx), seq.id, -1, -1);  // a whole sequence: any memory drops it
        }
        forget(seq);
    }

protected:
    void after_draft(std::vector<Engine::Sequence>& seqs, const std::vector<int>& k_max) override {
        for (size_t s = 0; s < seqs.size(); ++s) {  // the noise block / draft positions go
            if (k_max[s] >= 1 && trim_after_draft_) trim(seqs[s].id, seqs[s].n_past_target, "after a draft");
        }
    }
    void after_accept(Engine::Sequence& seq) override {
        trim(seq.id, seq.n_past_target, "after a verify");  // the draft cache follows the target's
    }

private:
    // A file drafter's cache holds every prompt position after the prefill (EAGLE-3 defers the last
    // one to its first draft): llama.cpp only warns when process() missed a prefill chunk and then
    // drafts from a cache with a hole; here that is an error.
    void check_prompt_ingested(const Engine::Sequence& seq) const {
        if (h_.kind == "mtp") return;  // an MTP head may share the target's memory (gemma4)
        const int32_t n = static_cast<int32_t>(seq.prompt.size());
        const int32_t need = h_.kind == "eagle3" ? n - 2 : n - 1;
        const llama_pos pos_max = llama_memory_seq_pos_max(llama_get_memory(h_.ctx), seq.id);
        if (pos_max < need) {
            throw std::runtime_error("the " + p_.drafter.type + " draft cache of sequence " + std::to_string(seq.id) +
                                     " ends at position " + std::to_string(pos_max) + " after a prompt of " +
                                     std::to_string(n) + " tokens: a prefill chunk was not ingested");
        }
    }

    // Drops the draft cache's cells of `seq` from `pos` on; a cache that refuses (recurrent or
    // hybrid memory cannot drop a suffix) is an error, not a silent inconsistency.
    void trim(int seq, int32_t pos, const char* when) {
        llama_memory_t mem = llama_get_memory(h_.ctx);
        if (llama_memory_seq_pos_max(mem, seq) < pos) return;
        if (!llama_memory_seq_rm(mem, seq, pos, -1)) {
            throw std::runtime_error(std::string("the ") + p_.drafter.type + " draft cache refused to drop sequence " +
                                     std::to_string(seq) + "'s cells from position " + std::to_string(pos) + " " +
                                     when + " (its memory cannot roll back)");
        }
    }

    HiddenDraft& h_;
    Engine::Context& target_;
    bool trim_after_draft_;
    common_params_speculative cparams_;
    common_batch batch_;
};

}  // namespace

std::unique_ptr<Drafter> make_hidden_drafter(HiddenDraft& h, Engine::Context& target, const GenerateParams& p,
                                             int n_seq, bool trim_after_draft) {
    return std::make_unique<HiddenDrafter>(h, target, p, n_seq, trim_after_draft);
}

#else

std::unique_ptr<Drafter> make_hidden_drafter(HiddenDraft&, Engine::Context&, const GenerateParams& p, int, bool) {
    throw std::invalid_argument("drafter '" + p.drafter.type + "' needs llama.cpp's common library, which this "
                                "build does not link");
}

#endif

}  // namespace specnative
