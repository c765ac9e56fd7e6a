// What the binding files share: numpy arrays from vectors, and the kernels' test bindings' entry.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <vector>

namespace specnative {

template <typename T>
pybind11::array_t<T> to_numpy(const std::vector<T>& v) {
    pybind11::array_t<T> a(v.size());
    std::copy(v.begin(), v.end(), a.mutable_data());
    return a;
}

// The engine's sampling and acceptance kernels for tests (bindings_kernels.cpp): the greedy pick,
// the softmax and its draws, the rejection step's histogram and the rule harness.
void bind_kernels(pybind11::module_& m);

}  // namespace specnative
