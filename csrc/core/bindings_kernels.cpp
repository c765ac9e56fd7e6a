// The kernels' test bindings of specnative._core: the engine's greedy pick, softmax and inverse-CDF
// draws (checked against numpy), the rejection step drawn many times, and the acceptance rule's own
// harness (rule_harness.h), each argument checked before any kernel reads it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings_common.h"
#include "engine_internal.h"  // check_temperature
#include "acceptor.h"        // fault_named
#include "rule_harness.h"
#include "sampling.h"
#include "spec_policy.h"

namespace py = pybind11;
using namespace specnative;

namespace {

// Arguments of the kernels' test bindings, checked before any kernel reads them.
using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

int32_t array_length(const FloatArray& a, const char* name) {
    if (a.ndim() != 1 || a.size() == 0) throw std::invalid_argument(std::string(name) + " must be a non-empty 1-D array");
    if (a.size() > std::numeric_limits<int32_t>::max()) throw std::invalid_argument(std::string(name) + " is too long");
    return static_cast<int32_t>(a.size());
}

void check_sampling_temperature(float temperature) {
    check_temperature(temperature);  // the engine's own check (finite, >= 0, 1/T finite)
    if (temperature == 0.0f) throw std::invalid_argument("softmax needs a temperature > 0");
}

void check_uniform(double u) {
    if (!(u >= 0.0 && u < 1.0)) throw std::invalid_argument("u must be in [0, 1)");
}

// Draws n times: x ~ q, then the engine's rejection step; returns how often each token came out
// and how many draws were accepted. Lets tests check that the output is distributed as p.
py::tuple rejection_histogram(const FloatArray& p, const FloatArray& q, int64_t n_draws, uint64_t seed) {
    if (p.ndim() != 1 || q.ndim() != 1 || p.size() != q.size() || p.size() == 0) {
        throw std::invalid_argument("p and q must be 1-D arrays of the same non-zero length");
    }
    std::vector<int64_t> hist;
    int64_t accepted = 0;
    {
        py::gil_scoped_release release;
        accepted = kernel_draws(p.data(), q.data(), static_cast<int32_t>(p.size()), n_draws, seed, hist);
    }
    return py::make_tuple(to_numpy(hist), accepted);
}

std::vector<std::vector<float>> rows_of(const FloatArray& a, const char* name) {
    if (a.ndim() != 2 || a.shape(0) == 0 || a.shape(1) == 0) {
        throw std::invalid_argument(std::string(name) + " must be a non-empty 2-D array");
    }
    std::vector<std::vector<float>> rows(a.shape(0));
    for (py::ssize_t r = 0; r < a.shape(0); ++r) rows[r].assign(a.data(r, 0), a.data(r, 0) + a.shape(1));
    return rows;
}

// The acceptance rule's own harness (rule_harness.h): the emitted tokens' counts by depth, a
// (depth + 1) x vocab array, for the chain (siblings 0) or a tree of `siblings` children per node.
py::array_t<int64_t> rule_draws(const FloatArray& logits, const FloatArray& q, int siblings, int64_t n_draws,
                                uint64_t seed, const std::string& fault, float temperature) {
    const std::vector<std::vector<float>> l_rows = rows_of(logits, "logits"), q_rows = rows_of(q, "q");
    const Fault f = fault_named(fault);
    std::vector<int64_t> hist;
    {
        py::gil_scoped_release release;
        const RuleInputs in{l_rows, q_rows, temperature, n_draws, seed};
        hist = siblings == 0 ? chain_rule_draws(f, in) : tree_rule_draws(f, in, siblings);
    }
    py::array_t<int64_t> out({static_cast<py::ssize_t>(l_rows.size()), static_cast<py::ssize_t>(l_rows[0].size())});
    std::copy(hist.begin(), hist.end(), out.mutable_data());
    return out;
}
}  // namespace

namespace specnative {

void bind_kernels(py::module_& m) {
    // The adaptive spec policy's choice on given acceptance (per sequence, by position) and costs:
    // a verify of r rows costs verify_ms[r - 1], a draft position draft_step_ms, a round other_ms.
    // A row count other than last_rows (0: none) adds rebuild_ms (the graph rebuilt).
    m.def("_policy_choice", [](const std::vector<std::vector<double>>& acceptance, const std::vector<int>& budget,
                               const std::vector<double>& verify_ms, double draft_step_ms, double other_ms,
                               int last_rows, double rebuild_ms) {
        if (acceptance.size() != budget.size() || budget.empty()) {
            throw std::invalid_argument("acceptance and budget need one entry per sequence");
        }
        std::vector<std::vector<double>> expect;
        int rows_max = 0;
        for (size_t s = 0; s < budget.size(); ++s) {
            if (budget[s] > static_cast<int>(acceptance[s].size())) {
                throw std::invalid_argument("a budget exceeds its sequence's acceptance positions");
            }
            expect.push_back(expected_tokens(acceptance[s]));
            rows_max += std::max(budget[s], 0) + 1;
        }
        if (static_cast<int>(verify_ms.size()) < rows_max) {
            throw std::invalid_argument("verify_ms needs one entry per row count up to " + std::to_string(rows_max));
        }
        const auto cost_ms = [&](int rows, int depth) {
            return other_ms + draft_step_ms * depth + verify_ms[rows - 1] + (rows != last_rows ? rebuild_ms : 0.0);
        };
        const std::vector<int> ks = best_lengths(expect, budget, cost_ms);
        // which sequences at k = 0 the policy goes on probing (their acceptance could switch them on)
        std::vector<bool> probed(budget.size(), false);
        for (size_t s = 0; s < budget.size(); ++s) {
            if (ks[s] == 0 && budget[s] > 0) probed[s] = pays_if_always_kept(expect, ks, budget, static_cast<int>(s), cost_ms);
        }
        return std::make_pair(ks, probed);
    }, py::arg("acceptance"), py::arg("budget"), py::arg("verify_ms"), py::arg("draft_step_ms"), py::arg("other_ms"),
       py::arg("last_rows") = 0, py::arg("rebuild_ms") = 0.0);
    // The engine's kernels, for tests: the greedy pick (the first index of the max, NaNs skipped,
    // at any length), the softmax and the two inverse-CDF draws (against numpy).
    m.def("_argmax", [](const FloatArray& logits) {
        return argmax(logits.data(), array_length(logits, "logits"));
    }, py::arg("logits"));
    m.def("_softmax", [](const FloatArray& logits, float temperature) {
        const int32_t n = array_length(logits, "logits");
        check_sampling_temperature(temperature);
        SoftmaxNorm norm;
        softmax_norm(logits.data(), n, temperature, norm);
        std::vector<float> probs;
        softmax(logits.data(), n, norm, probs);
        return to_numpy(probs);
    }, py::arg("logits"), py::arg("temperature"));
    m.def("_sample_softmax", [](const FloatArray& logits, float temperature, double u) {
        const int32_t n = array_length(logits, "logits");
        check_sampling_temperature(temperature);
        check_uniform(u);
        SoftmaxNorm norm;
        softmax_norm(logits.data(), n, temperature, norm);
        return sample_softmax(logits.data(), n, norm, u);
    }, py::arg("logits"), py::arg("temperature"), py::arg("u"));
    m.def("_sample_from_weights", [](const FloatArray& weights, double u) {
        const int32_t n = array_length(weights, "weights");
        check_uniform(u);
        return sample_from_weights(weights.data(), n, u);
    }, py::arg("weights"), py::arg("u"));
    m.def("rejection_histogram", &rejection_histogram, py::arg("p"), py::arg("q"), py::arg("n_draws"),
          py::arg("seed"));
    m.def("_rule_draws", &rule_draws, py::arg("logits"), py::arg("q"), py::arg("siblings"), py::arg("n_draws"),
          py::arg("seed"), py::arg("fault") = "none", py::arg("temperature") = 1.0f,
          "tests only: the acceptance rule (a planted fault by name) on synthetic rows; counts by depth");
}

}  // namespace specnative
