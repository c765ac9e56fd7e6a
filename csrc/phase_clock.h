// Wall-clock accounting in which every interval is charged to exactly one step bucket, so the
// buckets add up to the run's wall time by construction (minus the few ns between reads).
#pragma once

#include <chrono>

namespace specnative {

class PhaseClock {
public:
    using clock = std::chrono::steady_clock;

    PhaseClock() : start_(clock::now()), last_(start_) {}

    // Adds the time since the previous charge (or construction) to `bucket_ms`.
    // Callers synchronise the device first when the phase queued GPU work.
    void charge(double& bucket_ms) {
        const auto now = clock::now();
        bucket_ms += std::chrono::duration<double, std::milli>(now - last_).count();
        last_ = now;
    }

    double elapsed_ms() const {
        return std::chrono::duration<double, std::milli>(clock::now() - start_).count();
    }

private:
    clock::time_point start_;
    clock::time_point last_;
};

}  // namespace specnative
