// pybind11 module specnative._core: the engine, its exact counts as numpy arrays, and the small
// kernels tests need to check statistically (RNG, rejection step) or that sweeps need (quantize).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <thread>

#include "drafter.h"
#include "acceptor.h"
#include "engine.h"
#include "spec_policy.h"
#include "engine_internal.h"  // check_temperature
#include "model_io.h"
#include "sampling.h"
#include "serve.h"
#include "bindings_common.h"

namespace py = pybind11;
using namespace specnative;

namespace {

py::dict counts_dict(const SeqCounts& c) {
    py::dict d;
    d["drafted"] = c.drafted;
    d["accepted"] = c.accepted;
    d["rounds"] = c.rounds;
    d["rejected"] = c.rejected;
    d["emitted"] = c.emitted;
    d["drafted_at"] = to_numpy(c.drafted_at);
    d["accepted_at"] = to_numpy(c.accepted_at);
    d["accept_len_hist"] = to_numpy(c.accept_len_hist);
    d["offered_rank"] = to_numpy(c.offered_rank);    // draft trees: nodes with a child of rank r
    d["accepted_rank"] = to_numpy(c.accepted_rank);  // and walks that moved on to it
    d["k_chosen_hist"] = to_numpy(c.k_chosen_hist);  // rounds the spec policy allowed 0..k drafts
    return d;
}

py::dict times_dict(const StepTimes& t) {
    py::dict d;
    d["prefill_target"] = t.prefill_target;
    d["prefill_draft"] = t.prefill_draft;
    d["draft"] = t.draft;
    d["verify"] = t.verify;
    d["resample"] = t.resample;
    d["draft_ingest"] = t.draft_ingest;  // a hidden-state drafter reading the verify batch
    d["decode"] = t.decode;
    d["policy"] = t.policy;  // the spec policy's own time (its start-up included)
    d["total"] = t.total;
    d["llama"] = t.llama;  // inside llama.cpp, of the decoding buckets (not a bucket itself)
    d["kv_removal"] = t.kv_removal;  // of llama: the rollbacks' KV removal
    d["policy_startup"] = t.policy_startup;  // of policy: the adaptive policy's start-up cost curve
    return d;
}

py::dict info_dict(const ModelInfo& i) {
    py::dict d;
    d["path"] = i.path;
    d["description"] = i.description;
    d["ftype"] = i.ftype;
    d["n_params"] = i.n_params;
    d["size_bytes"] = i.size_bytes;
    d["n_vocab"] = i.n_vocab;
    d["n_layer"] = i.n_layer;
    d["n_ctx_train"] = i.n_ctx_train;
    return d;
}

// Polled by the engine between steps with the GIL released: runs Python's signal handlers so
// Ctrl-C stops a long generate(). The KeyboardInterrupt itself is re-raised by the translator.
constexpr int kSignalPollMs = 5;  // Ctrl-C is seen within this and one step
bool python_interrupt_pending() {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {
        PyErr_Clear();
        return true;
    }
    return false;
}

// Thread contract: one Engine serializes its calls. llama.cpp contexts are not thread-safe and
// every call releases the GIL, so each native method takes the engine's own mutex (after the GIL
// is released: a thread waiting for the mutex must not hold the GIL the running call needs to
// poll Ctrl-C). close() first asks a running generate() to stop at its next step, then waits for
// the mutex; every call after close() raises. New Engine methods must go through `locked`.
struct GuardedEngine : Engine {
    using Engine::Engine;
    std::mutex call_mutex;
    std::atomic<bool> closing{false};
    // The thread inside a call, so that a close() from that same thread (a Python signal handler
    // run while generate() polls for Ctrl-C) defers the close to the call's end instead of
    // waiting for its own lock forever.
    std::atomic<std::thread::id> owner{};
    std::atomic<bool> close_deferred{false};
};

// Thrown out of a generate() that close() (from another thread) asked to stop.
struct ClosedDuringCall : std::runtime_error {
    ClosedDuringCall()
        : std::runtime_error("generate() was stopped: the engine was closed from another thread") {}
};

// Runs f() (pure C++, no Python objects) with the GIL released and the engine's mutex held.
template <typename F>
auto locked(GuardedEngine& engine, F&& f) {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(engine.call_mutex);
    if (engine.closing.load()) throw std::invalid_argument("the engine is closed");
    struct InCall {  // marks the owner; runs a close() deferred during the call (also on throw)
        GuardedEngine& e;
        explicit InCall(GuardedEngine& engine) : e(engine) { e.owner.store(std::this_thread::get_id()); }
        ~InCall() {
            e.owner.store(std::thread::id{});
            if (e.close_deferred.exchange(false)) e.close();
        }
    } in_call(engine);
    return f();
}

// A result and its texts, detokenized under the same lock (a close() right after generate()
// cannot cost the texts). Texts are raw bytes: Python decodes them (UTF-8, errors="replace").
struct GenerateOutput : GenerateResult {
    std::vector<std::string> texts;
};

// Checked every iteration; Python's signal handlers (which need the GIL, ~2 us: a fifth of a
// tiny model's round overhead) at most every kSignalPollMs.
std::function<bool()> stop_poll(GuardedEngine& engine) {
    return [&engine, next_poll = std::chrono::steady_clock::time_point{}]() mutable {
        if (engine.closing.load()) throw ClosedDuringCall();
        const auto now = std::chrono::steady_clock::now();
        if (now < next_poll) return false;
        next_poll = now + std::chrono::milliseconds(kSignalPollMs);
        return python_interrupt_pending();
    };
}

// Python's DecodeSpec fills a GenerateParams (the bound struct) and checked it; the core checks
// again before decoding (Engine::generate), and here what only this path has: the draft temperature.
GenerateOutput generate(GuardedEngine& engine, const std::vector<std::vector<int32_t>>& prompts,
                        const GenerateParams& params) {
    const GenerateParams p = params;  // Python may change its object once the GIL is released
    if (p.draft_temperature != 0.0f) {
        check_temperature(p.draft_temperature);
        if (p.temperature <= 0.0f || p.drafter.type != "model") {
            throw std::invalid_argument("draft_temperature applies to the draft model when sampling (temperature > 0)");
        }
    }
    const auto should_stop = stop_poll(engine);
    return locked(engine, [&] {
        GenerateOutput out;
        static_cast<GenerateResult&>(out) = engine.generate(prompts, p, should_stop);
        for (const auto& tokens : out.tokens) out.texts.push_back(engine.detokenize(tokens));
        return out;
    });
}

// Continuous batching (serve.h): requests as parallel lists (labels: a task label each, or empty);
// the decoding settings a GenerateParams that Python's DecodeSpec filled; the result as a dict.
py::dict serve(GuardedEngine& engine, const std::vector<double>& arrival_ms,
               const std::vector<std::vector<int32_t>>& prompts, const std::vector<int>& n_predict,
               const std::vector<int>& labels, int max_concurrency, bool virtual_clock, const GenerateParams& params) {
    if (arrival_ms.size() != prompts.size() || n_predict.size() != prompts.size() ||
        (!labels.empty() && labels.size() != prompts.size())) {
        throw std::invalid_argument("arrival_ms, prompts, n_predict (and labels, if given) must have one entry per "
                                    "request");
    }
    std::vector<ServeRequest> requests(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
        requests[i] = {arrival_ms[i], prompts[i], n_predict[i], labels.empty() ? 0 : labels[i]};
    }
    ServeParams sp;
    sp.gen = params;   // a copy: Python may change its object once the GIL is released
    sp.gen.n_predict = 1;  // each request's own n_predict decides
    sp.gen.record_margins = false;
    sp.max_concurrency = max_concurrency;
    sp.virtual_clock = virtual_clock;
    const auto should_stop = stop_poll(engine);
    const ServeResult r = locked(engine, [&] { return engine.serve(requests, sp, should_stop); });
    py::list rows;
    for (const RequestRecord& rec : r.requests) {
        py::dict d;
        d["slot"] = rec.slot;
        d["arrival_ms"] = rec.arrival_ms;
        d["admitted_ms"] = rec.admitted_ms;
        d["first_token_ms"] = rec.first_token_ms;
        d["finish_ms"] = rec.finish_ms;
        d["tokens"] = to_numpy(rec.tokens);
        d["emit_ms"] = to_numpy(rec.emit_ms);
        d["emit_tokens"] = to_numpy(rec.emit_tokens);
        d["prefill_batches"] = rec.prefill_batches;
        d["prefill_tokens"] = rec.prefill_tokens;
        d["counts"] = counts_dict(rec.counts);
        rows.append(d);
    }
    py::dict out;
    out["requests"] = rows;
    out["admission_order"] = to_numpy(r.admission_order);
    out["times"] = times_dict(r.times);
    out["idle_ms"] = r.idle_ms;
    out["skipped_ms"] = r.skipped_ms;
    out["duration_ms"] = r.duration_ms;
    out["steps"] = r.steps;
    out["decode_steps"] = r.decode_steps;
    out["mixed_steps"] = r.mixed_steps;
    out["busy_sum"] = r.busy_sum;
    out["decoding_sum"] = r.decoding_sum;
    out["prefill_tokens"] = r.prefill_tokens;
    out["shared_prefix"] = r.shared_prefix;
    out["kv_cells_left"] = r.kv_cells_left;
    out["max_concurrency"] = r.max_concurrency;
    out["speculative"] = r.speculative;
    const SeqCounts totals = r.totals();
    const AcceptRates rates = accept_rates(totals);
    out["totals"] = counts_dict(totals);
    out["draft_accept_rate"] = rates.draft_accept_rate;
    out["token_accept_rate"] = rates.token_accept_rate;
    out["mean_accept_len"] = rates.mean_accept_len;
    return out;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "specnative native core: llama.cpp-based speculative decoding measurement engine";

    py::register_exception_translator([](std::exception_ptr e) {
        try {
            if (e) std::rethrow_exception(e);
        } catch (const Interrupted&) {
            PyErr_SetNone(PyExc_KeyboardInterrupt);
        }
    });

    py::class_<GenerateResult>(m, "GenerateResult")
        .def_property_readonly("tokens", [](const GenerateResult& r) {
            py::list out;
            for (const auto& t : r.tokens) out.append(to_numpy(t));
            return out;
        })
        .def_property_readonly("margins", [](const GenerateResult& r) {
            py::list out;
            for (const auto& t : r.margins) out.append(to_numpy(t));
            return out;
        })
        // per sequence: {field: array}: the emitted tokens' PitPoint fields, and the drafts reached
        // (DecisionPoint) as decision_index, accept_prob, accepted, residual_ahead, residual_prob
        .def_property_readonly("pit", [](const GenerateResult& r) {
            py::list out;
            for (size_t s = 0; s < r.pit.size(); ++s) {
                const auto& points = r.pit[s];
                std::vector<int64_t> index;
                std::vector<double> p_emitted, sure, maybe, draft_sure, draft_maybe;
                for (const PitPoint& pt : points) {
                    index.push_back(pt.index);
                    p_emitted.push_back(pt.p_emitted);
                    sure.push_back(pt.above_sure);
                    maybe.push_back(pt.above_maybe);
                    draft_sure.push_back(pt.draft_above_sure);
                    draft_maybe.push_back(pt.draft_above_maybe);
                }
                py::dict d;
                d["index"] = to_numpy(index);
                d["p_emitted"] = to_numpy(p_emitted);
                d["above_sure"] = to_numpy(sure);
                d["above_maybe"] = to_numpy(maybe);
                d["draft_above_sure"] = to_numpy(draft_sure);
                d["draft_above_maybe"] = to_numpy(draft_maybe);
                std::vector<int64_t> decision_index;
                std::vector<double> accept_prob, residual_ahead, residual_prob;
                std::vector<uint8_t> accepted;
                static const std::vector<DecisionPoint> none;
                for (const DecisionPoint& dp : s < r.decisions.size() ? r.decisions[s] : none) {
                    decision_index.push_back(dp.index);
                    accept_prob.push_back(dp.accept_prob);
                    accepted.push_back(dp.accepted ? 1 : 0);
                    residual_ahead.push_back(dp.residual_ahead);
                    residual_prob.push_back(dp.residual_prob);
                }
                d["decision_index"] = to_numpy(decision_index);
                d["accept_prob"] = to_numpy(accept_prob);
                d["accepted"] = to_numpy(accepted).attr("astype")("bool");
                d["residual_ahead"] = to_numpy(residual_ahead);
                d["residual_prob"] = to_numpy(residual_prob);
                out.append(d);
            }
            return out;
        })
        .def_property_readonly("counts", [](const GenerateResult& r) {
            py::list out;
            for (const auto& c : r.counts) out.append(counts_dict(c));
            return out;
        })
        .def_property_readonly("totals", [](const GenerateResult& r) { return counts_dict(r.totals()); })
        .def_property_readonly("times", [](const GenerateResult& r) { return times_dict(r.times); })
        .def_readonly("speculative", &GenerateResult::speculative)
        .def_readonly("steps", &GenerateResult::steps)
        .def_readonly("decode_tokens", &GenerateResult::decode_tokens)
        .def_readonly("prefill_tokens", &GenerateResult::prefill_tokens)
        .def_readonly("kv_prompt_cells", &GenerateResult::kv_prompt_cells)
        .def_property_readonly("draft_accept_rate", &GenerateResult::draft_accept_rate)
        .def_property_readonly("token_accept_rate", &GenerateResult::token_accept_rate)
        .def_property_readonly("mean_accept_len", &GenerateResult::mean_accept_len)
        .def_property_readonly("round_ms", &GenerateResult::round_ms)
        .def_property_readonly("step_ms", &GenerateResult::step_ms)
        .def_property_readonly("tps", &GenerateResult::tps)
        .def_readonly("steady_steps", &GenerateResult::steady_steps)
        .def_readonly("steady_tokens", &GenerateResult::steady_tokens)
        .def_readonly("steady_ms", &GenerateResult::steady_ms)
        .def_property_readonly("steady_tps", &GenerateResult::steady_tps)
        .def_property_readonly("steady_iteration_ms", &GenerateResult::steady_iteration_ms)
        .def_property_readonly("steady_tau", &GenerateResult::steady_tau)
        .def_property_readonly("occupancy", &GenerateResult::occupancy);

    py::class_<GenerateOutput, GenerateResult>(m, "GenerateOutput")
        .def_property_readonly("texts", [](const GenerateOutput& r) {
            py::list out;
            for (const auto& t : r.texts) out.append(py::bytes(t));
            return out;
        });

    m.def("supports_rpc", [] { return llama_supports_rpc(); },
          "whether this build has ggml's RPC backend (SPECNATIVE_RPC / GGML_RPC)");
    m.def("add_rpc_servers", [](const std::vector<std::string>& endpoints, int timeout_ms) {
              py::gil_scoped_release release;
              add_rpc_servers(endpoints, timeout_ms);
          }, py::arg("endpoints"), py::arg("timeout_ms") = 5000,
          "llama.cpp's --rpc ahead of any Engine: reaches each host:port (bounded) and adds its devices");
    m.def("rpc_device_names", [](const std::vector<std::string>& endpoints) { return rpc_device_names(endpoints); },
          py::arg("endpoints"), "device names (RPC0, ...) of RPC servers an Engine added, in their order");

    // What one generate() decodes (engine.h), field by field: Python's DecodeSpec fills it.
    py::enum_<AcceptRule>(m, "AcceptRule")
        .value("greedy", AcceptRule::greedy)
        .value("match", AcceptRule::match)
        .value("rejection", AcceptRule::rejection);
    py::class_<DrafterParams>(m, "DrafterParams")
        .def(py::init<>())
        .def_readwrite("type", &DrafterParams::type)
        .def_readwrite("options", &DrafterParams::options);
    py::enum_<TreeShape::Kind>(m, "TreeKind")
        .value("none", TreeShape::Kind::none)
        .value("topk", TreeShape::Kind::topk)
        .value("split", TreeShape::Kind::split);
    py::class_<TreeShape>(m, "TreeShape")
        .def(py::init<>())
        .def_readwrite("kind", &TreeShape::kind)
        .def_readwrite("topk", &TreeShape::topk)
        .def_readwrite("depth", &TreeShape::depth)
        .def_readwrite("budget", &TreeShape::budget)
        .def_readwrite("branches", &TreeShape::branches)
        .def_readwrite("p_split", &TreeShape::p_split);
    py::enum_<PolicyParams::Kind>(m, "PolicyKind")
        .value("static", PolicyParams::Kind::static_k)
        .value("by_batch", PolicyParams::Kind::by_batch)
        .value("adaptive", PolicyParams::Kind::adaptive);
    py::class_<PolicyBand>(m, "PolicyBand")
        .def(py::init([](int lo, int hi, int k) { return PolicyBand{lo, hi, k}; }), py::arg("lo"), py::arg("hi"),
             py::arg("k"))
        .def_readwrite("lo", &PolicyBand::lo)
        .def_readwrite("hi", &PolicyBand::hi)
        .def_readwrite("k", &PolicyBand::k);
    py::class_<PolicyParams>(m, "PolicyParams")
        .def(py::init<>())
        .def_readwrite("kind", &PolicyParams::kind)
        .def_readwrite("schedule", &PolicyParams::schedule)
        .def_readwrite("prior_alpha", &PolicyParams::prior_alpha)
        .def_readwrite("prior_weight", &PolicyParams::prior_weight)
        .def_readwrite("calibrate_repeats", &PolicyParams::calibrate_repeats)
        .def_readwrite("optimism", &PolicyParams::optimism)
        .def_readwrite("remember", &PolicyParams::remember);
    py::class_<GenerateParams>(m, "GenerateParams")
        .def(py::init<>())
        .def_readwrite("n_predict", &GenerateParams::n_predict)
        .def_readwrite("temperature", &GenerateParams::temperature)
        .def_readwrite("seed", &GenerateParams::seed)
        .def_readwrite("spec", &GenerateParams::spec)
        .def_readwrite("k", &GenerateParams::k)
        .def_readwrite("rule", &GenerateParams::rule)
        .def_readwrite("stop_at_eog", &GenerateParams::stop_at_eog)
        .def_readwrite("record_margins", &GenerateParams::record_margins)
        .def_readwrite("record_pit", &GenerateParams::record_pit)
        .def_readwrite("reuse_prompts", &GenerateParams::reuse_prompts)
        .def_readwrite("prefix_cache", &GenerateParams::prefix_cache)
        .def_readwrite("prefix_limit", &GenerateParams::prefix_limit)
        .def_readwrite("drafter", &GenerateParams::drafter)
        .def_readwrite("draft_p_min", &GenerateParams::draft_p_min)
        .def_readwrite("draft_temperature", &GenerateParams::draft_temperature)
        .def_readwrite("drafter_settings", &GenerateParams::drafter_settings)
        .def_readwrite("tree", &GenerateParams::tree)
        .def_readwrite("synthetic", &GenerateParams::synthetic)
        .def_readwrite("policy", &GenerateParams::policy);

    py::class_<GuardedEngine>(m, "Engine")
        .def(py::init([](const std::string& target, const std::string& draft, int n_ctx, int n_batch,
                         int n_threads, int n_gpu_layers, int n_seq_max, int flash_attn, bool kv_unified,
                         const std::string& split_mode, const std::vector<float>& tensor_split, int main_gpu,
                         const std::vector<std::string>& devices, const std::vector<std::string>& draft_devices,
                         std::optional<int> n_gpu_layers_draft, const std::vector<std::string>& rpc_servers,
                         int rpc_timeout_ms, bool mtp) {
                 EngineParams p;
                 p.mtp = mtp;
                 p.split_mode = split_mode;  // placement: checked in model_io.cpp before llama.cpp sees it
                 p.tensor_split = tensor_split;
                 p.main_gpu = main_gpu;
                 p.devices = devices;
                 p.draft_devices = draft_devices;
                 p.n_gpu_layers_draft = n_gpu_layers_draft.value_or(EngineParams::kFollowTarget);
                 p.rpc_servers = rpc_servers;
                 p.rpc_timeout_ms = rpc_timeout_ms;
                 p.n_ctx = n_ctx;
                 p.n_batch = n_batch;
                 p.n_threads = n_threads;
                 p.n_gpu_layers = n_gpu_layers;
                 p.n_seq_max = n_seq_max;
                 p.flash_attn = flash_attn;
                 p.kv_unified = kv_unified;
                 py::gil_scoped_release release;
                 return new GuardedEngine(target, draft, p);
             }),
             py::arg("target"), py::arg("draft"), py::arg("n_ctx"), py::arg("n_batch"), py::arg("n_threads"),
             py::arg("n_gpu_layers"), py::arg("n_seq_max"), py::arg("flash_attn"), py::arg("kv_unified"),
             py::arg("split_mode") = "layer", py::arg("tensor_split") = std::vector<float>{}, py::arg("main_gpu") = 0,
             py::arg("devices") = std::vector<std::string>{}, py::arg("draft_devices") = std::vector<std::string>{},
             py::arg("n_gpu_layers_draft") = py::none(), py::arg("rpc_servers") = std::vector<std::string>{},
             py::arg("rpc_timeout_ms") = 5000, py::arg("mtp") = false)
        .def("generate", &generate, py::arg("prompts"), py::arg("params"),
             "decode the prompts under a GenerateParams (Python builds it from a DecodeSpec)")
        .def("serve", &serve, py::arg("arrival_ms"), py::arg("prompts"), py::arg("n_predict"), py::arg("labels"),
             py::arg("max_concurrency"), py::arg("virtual_clock"), py::arg("params"),
             "replay requests through continuous batching under a GenerateParams (from a DecodeSpec)")
        .def("prompt_logits", [](GuardedEngine& e, const std::vector<int32_t>& tokens) {
            return to_numpy(locked(e, [&] { return e.prompt_logits(tokens); }));
        })
        .def("draft_prefix_state", [](GuardedEngine& e) {
            auto [tokens, state] = locked(e, [&] { return e.draft_prefix_state(); });
            return py::make_tuple(tokens, py::bytes(reinterpret_cast<const char*>(state.data()), state.size()));
        })
        .def("load_draft_prefix", [](GuardedEngine& e, const std::vector<int32_t>& tokens, const py::bytes& state) {
            const std::string_view view = state;
            const std::vector<uint8_t> data(view.begin(), view.end());
            return locked(e, [&] { return e.load_draft_prefix(tokens, data); });
        }, py::arg("tokens"), py::arg("state"))
        .def("cache_extent", [](GuardedEngine& e, int seq) { return locked(e, [&] { return e.cache_extent(seq); }); })
        .def("_target_prompt_tokens_fed", [](GuardedEngine& e) { return locked(e, [&] { return e.target_prompt_tokens_fed(); }); })
        .def("is_eog", [](GuardedEngine& e, int32_t token) { return locked(e, [&] { return e.is_eog(token); }); })
        .def("pending_logits", [](GuardedEngine& e, int seq) {
            return to_numpy(locked(e, [&] { return e.pending_logits(seq); }));
        })
        .def("numeric_noise", [](GuardedEngine& e, const std::vector<std::vector<int32_t>>& prompts,
                                 const std::vector<std::vector<int32_t>>& forced, int chunk_a, int chunk_b,
                                 const std::string& settings_of, float temperature, uint64_t seed) {
            const NoiseProbe n =
                locked(e, [&] { return e.numeric_noise(prompts, forced, chunk_a, chunk_b, settings_of, temperature, seed); });
            py::dict d;
            d["seq"] = to_numpy(n.seq);
            d["index"] = to_numpy(n.index);
            d["max_abs_delta"] = to_numpy(n.max_abs_delta);
            d["spread"] = to_numpy(n.spread);
            d["candidate_spread"] = to_numpy(n.candidate_spread);
            d["argmax_a"] = to_numpy(n.argmax_a);
            d["argmax_b"] = to_numpy(n.argmax_b);
            d["draw_a"] = to_numpy(n.draw_a);
            d["draw_b"] = to_numpy(n.draw_b);
            d["state_spread"] = to_numpy(n.state_spread);
            py::list finals;
            for (const auto& f : n.final_logits_a) finals.append(to_numpy(f));
            d["final_logits_a"] = finals;
            return d;
        }, py::arg("prompts"), py::arg("forced"), py::arg("chunk_a"), py::arg("chunk_b"),
           py::arg("settings_of") = "", py::arg("temperature") = 0.0f,
           py::arg("seed") = 0)
        .def("replay", [](GuardedEngine& e, const std::vector<std::vector<int32_t>>& prompts,
                          const std::vector<std::vector<int32_t>>& forced, float temperature, uint64_t seed,
                          const std::vector<uint64_t>& keys) {
            const ReplayCheck r = locked(e, [&] { return e.replay(prompts, forced, temperature, seed, keys); });
            py::dict d;
            d["seq"] = to_numpy(r.seq);
            d["index"] = to_numpy(r.index);
            d["emitted"] = to_numpy(r.emitted);
            d["pick"] = to_numpy(r.pick);
            d["gap"] = to_numpy(r.gap);
            d["u"] = to_numpy(r.u);
            d["cdf_lo"] = to_numpy(r.cdf_lo);
            d["cdf_hi"] = to_numpy(r.cdf_hi);
            py::list finals;
            for (const auto& f : r.final_logits) finals.append(to_numpy(f));
            d["final_logits"] = finals;
            return d;
        }, py::arg("prompts"), py::arg("forced"), py::arg("temperature"), py::arg("seed"),
             py::arg("keys") = std::vector<uint64_t>{})
        .def("cost_curve", [](GuardedEngine& e, const std::vector<std::vector<int32_t>>& prompts, int k_max,
                              int repeats) {
            const CostCurve c = locked(e, [&] { return e.cost_curve(prompts, k_max, repeats); });
            py::dict d;
            d["verify_ms"] = to_numpy(c.verify_ms);
            d["draft_ms_per_pos"] = c.draft_ms_per_pos;
            d["n_seq"] = c.n_seq;
            d["repeats"] = c.repeats;
            return d;
        }, py::arg("prompts"), py::arg("k_max"), py::arg("repeats") = 3)
        // Tests only: what the adaptive policy's runs left behind, by decoding settings: the pooled
        // acceptance tallies by task label ({label: (reached, kept)}) and the cost levels.
        .def("_policy_memory", [](GuardedEngine& e) {
            const PolicyMemory memory = locked(e, [&] { return *e.policy_memory(); });  // a copy: built on below
            py::dict out;
            for (const auto& [key, learned] : memory.by_setting) {
                py::dict pooled;
                for (const auto& [label, t] : learned.pooled) pooled[py::int_(label)] = py::make_tuple(t.reached, t.kept);
                py::dict d;
                d["pooled"] = pooled;
                d["verify_scale"] = learned.verify_scale;
                d["step_scale"] = learned.step_scale;
                d["draft_step_ms"] = learned.draft_step_ms;
                d["other_ms"] = learned.other_ms;
                out[py::str(key)] = d;
            }
            return out;
        })
        // Tests of the lossless verdict only: plants a known bug in the speculative loop.
        .def("_inject_fault", [](GuardedEngine& e, const std::string& name) {
            const Fault fault = fault_named(name);
            locked(e, [&] { e.inject_fault(fault); });
        })
        .def("tokenize", [](GuardedEngine& e, const std::string& text, bool add_special) {
            return locked(e, [&] { return e.tokenize(text, add_special); });
        }, py::arg("text"), py::arg("add_special"))
        .def("detokenize", [](GuardedEngine& e, const std::vector<int32_t>& tokens) {
            return py::bytes(locked(e, [&] { return e.detokenize(tokens); }));  // may end mid-character
        })
        .def_property_readonly("has_draft", [](GuardedEngine& e) { return locked(e, [&] { return e.has_draft(); }); })
        .def_property_readonly("hidden_drafter", [](GuardedEngine& e) {
            return locked(e, [&] { return e.hidden_drafter(); });
        })
        .def_property_readonly("n_ctx", [](GuardedEngine& e) { return locked(e, [&] { return e.n_ctx(); }); })
        .def_property_readonly("n_ctx_seq", [](GuardedEngine& e) { return locked(e, [&] { return e.n_ctx_seq(); }); })
        .def_property_readonly("target_info", [](GuardedEngine& e) {
            return info_dict(locked(e, [&] { return e.target_info(); }));
        })
        .def_property_readonly("draft_info", [](GuardedEngine& e) {
            return info_dict(locked(e, [&] { return e.draft_info(); }));
        })
        // The context's parameters as llama.cpp set them, and its perf counters (graph reuse).
        .def("context_info", [](GuardedEngine& e, bool draft) {
            const ContextInfo i = locked(e, [&] { return e.context_info(draft); });
            py::dict d;
            d["n_ctx"] = i.n_ctx;
            d["n_batch"] = i.n_batch;
            d["n_ubatch"] = i.n_ubatch;
            d["n_seq_max"] = i.n_seq_max;
            d["n_threads"] = i.n_threads;
            d["n_threads_batch"] = i.n_threads_batch;
            d["kv_unified"] = i.kv_unified;
            d["swa_full"] = i.swa_full;
            d["flash_attn"] = i.flash_attn;
            d["n_eval"] = i.n_eval;
            d["n_p_eval"] = i.n_p_eval;
            d["n_reused"] = i.n_reused;
            return d;
        }, py::arg("draft") = false)
        .def("close", [](GuardedEngine& e) {
            e.closing.store(true);  // a running generate() stops at its next step ...
            if (e.owner.load() == std::this_thread::get_id()) {  // called from inside that call
                e.close_deferred.store(true);
                return;
            }
            py::gil_scoped_release release;
            std::lock_guard<std::mutex> lock(e.call_mutex);  // ... and is waited for
            e.close();
        });

    m.def("quantize", [](const std::string& src, const std::string& dst, const std::string& type, int n_threads) {
        py::gil_scoped_release release;
        quantize_model(src, dst, type, n_threads);
    }, py::arg("src"), py::arg("dst"), py::arg("type"), py::arg("n_threads") = 0,
          "Quantize a GGUF model with llama.cpp (allow_requantize), e.g. type='Q8_0'.");
    m.def("accept_rates", [](int64_t drafted, int64_t accepted, int64_t rejected, int64_t rounds, int64_t emitted) {
        SeqCounts c;
        c.drafted = drafted;
        c.accepted = accepted;
        c.rejected = rejected;
        c.rounds = rounds;
        c.emitted = emitted;
        const AcceptRates r = accept_rates(c);
        py::dict d;
        d["draft_accept_rate"] = r.draft_accept_rate;
        d["token_accept_rate"] = r.token_accept_rate;
        d["mean_accept_len"] = r.mean_accept_len;
        return d;
    }, py::arg("drafted"), py::arg("accepted"), py::arg("rejected"), py::arg("rounds"), py::arg("emitted"),
          "alpha, per-token alpha and tau of pooled counts (the engine's own definitions)");
    bind_kernels(m);  // the sampling and acceptance kernels' test bindings (bindings_kernels.cpp)
    m.attr("drafter_names") = drafter_names();
    m.def("drafter_defaults", &ngram_drafter_defaults,
          "llama.cpp's n-gram drafter options by CLI name (no dashes) with their defaults at this commit");
    m.def("drafter_of_option", &drafter_of_option, py::arg("option"),
          "the n-gram drafter an option belongs to (e.g. spec-ngram-mod-n-min -> ngram-mod), '' if unknown");
    m.def("check_hidden_pair", [](const std::string& target, const std::string& draft) {
        check_hidden_pair(target, draft);
    }, py::arg("target"), py::arg("draft"), "ValueError naming what a target and a hidden-state drafter file "
       "(\"\" for mtp: the target's nextn head) lack, from their GGUF metadata, before any loading");
    m.def("hidden_drafter_file_kind", &hidden_drafter_file_kind, py::arg("path"),
          "dflash, dflash2, dspark or eagle3 from a drafter file's GGUF metadata; \"\" for any other model");
    m.def("validate_drafter", [](const std::string& type, const std::map<std::string, std::string>& options) {
        validate_drafter(DrafterParams{type, options});
    }, py::arg("drafter"), py::arg("drafter_options"), "ValueError for an unknown drafter, option or value, "
       "or an unreadable lookup cache file: the check generate() makes before decoding");
    m.attr("max_parallel_sequences") = static_cast<int>(llama_max_parallel_sequences());
    m.attr("candidate_window") = kCandidateWindow;
    m.attr("slow_accept_ms") = kSlowAcceptMs;  // a planted slowdown's busy-wait per sequence (acceptor.h)
    m.def("build_info", [] {
        ensure_backend();
        py::dict d;
        d["llama_commit"] = SPECNATIVE_LLAMA_COMMIT;
        d["specnative_commit"] = SPECNATIVE_COMMIT;  // at build time
        d["build_flags"] = SPECNATIVE_BUILD_FLAGS;
        d["backend"] = SPECNATIVE_BACKEND;
        d["system_info"] = std::string(llama_print_system_info());
        d["gpu_offload"] = llama_supports_gpu_offload();
        return d;
    });
    py::class_<VocabModel>(m, "VocabModel", "a GGUF file's tokenizer and chat template (no weights loaded)")
        .def(py::init<const std::string&>(), py::arg("path"))
        .def("tokenize", &VocabModel::tokenize, py::arg("text"), py::arg("add_special"),
             py::arg("parse_special"))
        .def_property_readonly("chat_template", &VocabModel::chat_template)
        .def("incompatibility_as_draft_of", &VocabModel::incompatibility_as_draft_of, py::arg("target"),
             "why this file cannot draft for `target` (the check Engine makes at load), or ''")
        .def("tolerated_differences_as_draft_of", &VocabModel::tolerated_differences_as_draft_of,
             py::arg("target"), "differences llama.cpp's check tolerates (token ids 0-4, EOS id), one line each");
    m.def("chat_apply_template", &apply_chat_template, py::arg("template"), py::arg("messages"),
          py::arg("add_assistant") = true,
          "llama_chat_apply_template over [(role, content), ...]; ValueError for an unknown template");
}
