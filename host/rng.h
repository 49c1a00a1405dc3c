// A small seeded random number generator for host-side initialization: SplitMix64 (Steele, Lea,
// Flood 2014) for the bits, Box-Muller for normals. Chosen for reproducibility across platforms
// and compilers (std::normal_distribution is implementation-defined).
#pragma once
#include <cmath>
#include <cstdint>

struct Rng {
    static constexpr uint64_t kIncrement = 0x9E3779B97F4A7C15ull;  // SplitMix64's per-draw step
    uint64_t state;
    explicit Rng(uint64_t seed) : state(seed) {}

    // The generator as it is after `draws` more calls of next_u64 (the state only adds a constant per
    // draw), so a long stream can be cut into pieces drawn in parallel, bit for bit the same.
    void skip(uint64_t draws) { state += draws * kIncrement; }
    static constexpr int kDrawsPerNormal = 2;

    uint64_t next_u64() {
        uint64_t z = (state += kIncrement);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    // Uniform in (0, 1): 53 random bits, never 0 (log(0) in Box-Muller).
    double uniform() { return (double(next_u64() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
    double normal(double mean, double stddev) {
        double u1 = uniform(), u2 = uniform();
        return mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
    }
};
