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

// Adds the wall time of the scope it lives in to `into_ms` (milliseconds): the time spent inside
// llama.cpp calls (Context::decode, an n-gram drafter's lookups), a part of the phase buckets.
class ScopedMs {
public:
    explicit ScopedMs(double& into_ms) : into_(into_ms), t0_(PhaseClock::clock::now()) {}
    ~ScopedMs() { into_ += std::chrono::duration<double, std::milli>(PhaseClock::clock::now() - t0_).count(); }
    ScopedMs(const ScopedMs&) = delete;
    ScopedMs& operator=(const ScopedMs&) = delete;

private:
    double& into_;
    PhaseClock::clock::time_point t0_;
};

}  // namespace specnative
