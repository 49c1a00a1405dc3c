// AdamW (kernels/adamw.cuh) against a double-precision step for t = 1..5, stochastic rounding
// (neighbours, unbiasedness, reproducibility), invariance to how the flat buffer is split into
// calls or shards, and the global gradient norm (kernels/global_norm.cuh) against a double sum.
#include "test_util.h"

#include "kernels/adamw.cuh"
#include "kernels/global_norm.cuh"

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

constexpr bool kFp32 = std::is_same_v<floatX, float>;
constexpr double kFp32Unit = 0x1p-24;
// Each element of the step is a handful of FP32 operations (scale, two products, fma, divide,
// sqrt, fma), each rounding by at most 2^-24 times the magnitude of its terms; `scale` below is
// that magnitude, computed by the reference. Measured worst cases (both builds): master 3.8
// units, m 2.3, v 3.6; allow 8 (the count of roundings in the longest chain).
constexpr double kAdamWUnits = 8;

std::vector<float> uniform_floats(size_t n, float lo, float hi, std::mt19937& rng) {
    std::uniform_real_distribution<float> uniform(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = uniform(rng);
    return v;
}

// Gradients over three decades of magnitude, so v and the Adam step vary across elements.
std::vector<floatX> random_grads(size_t n, std::mt19937& rng) {
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f), decades(-3.0f, 0.0f);
    std::vector<floatX> g(n);
    for (auto& x : g) x = from_float<floatX>(uniform(rng) * std::pow(10.0f, decades(rng)));
    return g;
}

float bf16_value(__nv_bfloat16 x) { return __bfloat162float(x); }

// The bf16 values next to x: truncated toward zero, and one bf16 ulp further out (equal when x is
// a bf16 value).
struct Bf16Neighbours {
    float toward_zero, away_from_zero;
};
Bf16Neighbours bf16_neighbours(float x) {
    const uint32_t bits = float_bits(x), truncated = bits & 0xFFFF0000u;
    return {float_from_bits(truncated), float_from_bits(truncated == bits ? bits : truncated + 0x10000u)};
}


// Worst |got - want| / (kAdamWUnits 2^-24 scale) over all elements; must be <= 1.
void check_adamw_close(const std::string& what, const std::vector<float>& got, const std::vector<double>& want,
                       const std::vector<double>& scale) {
    double worst_ratio = 0;
    size_t worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double ratio = std::abs(double(got[i]) - want[i]) / (kAdamWUnits * kFp32Unit * scale[i] + 1e-30);
        if (new_worst(ratio, worst_ratio)) worst_ratio = ratio, worst = i;  // NaN counts as worst
    }
    if (std::getenv("REPORT_ERRORS")) std::printf("%-28s worst %.2f units\n", what.c_str(), worst_ratio * kAdamWUnits);
    INFO(what << ": worst element " << worst << " got " << got[worst] << " want " << want[worst]
              << " (error / tolerance = " << worst_ratio << ")");
    CHECK(worst_ratio <= 1.0);
}

// Host copies of an optimizer state, and their device twins.
struct HostState {
    std::vector<float> master, m, v;
    std::vector<floatX> params;
};
struct DeviceState {
    DeviceBuffer<floatX> params;
    DeviceBuffer<float> master, m, v;
    explicit DeviceState(const HostState& s) : params(s.master.size()), master(s.master), m(s.m), v(s.v) {
        params.fill_bytes(0);
    }
    HostState download() const { return {master.download(), m.download(), v.download(), params.download()}; }
};

HostState random_state(size_t n, std::mt19937& rng) {
    HostState s;
    s.master = uniform_floats(n, -1.0f, 1.0f, rng);
    s.m = uniform_floats(n, -0.1f, 0.1f, rng);
    s.v = uniform_floats(n, 0.0f, 0.01f, rng);
    return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// AdamW

TEST_CASE("adamw_update matches a double-precision AdamW step for t = 1..5") {
    std::mt19937 rng(2024);
    const float grad_scale = 0.37f;  // a clipping factor min(1, clip / norm)
    const uint64_t seed = 1234, element_offset = 77;
    for (size_t n : {size_t(1), size_t(1000), size_t(4099)}) {
        for (float weight_decay : {0.0f, 0.1f}) {
            const AdamWHyper hyper{1e-2f, 0.9f, 0.95f, 1e-8f, weight_decay};
            HostState state{uniform_floats(n, -1.0f, 1.0f, rng), std::vector<float>(n, 0.0f),
                            std::vector<float>(n, 0.0f), {}};
            DeviceState device(state);
            long rounded_away = 0, inexact = 0;
            for (int t = 1; t <= 5; ++t) {
                const std::vector<floatX> grads = random_grads(n, rng);
                DeviceBuffer<floatX> d_grads(grads);
                adamw_update(device.params.ptr, device.master.ptr, device.m.ptr, device.v.ptr, d_grads.ptr, n, hyper,
                             t, grad_scale, seed, element_offset, nullptr);
                const HostState got = device.download();

                // The step in double from the kernel's previous FP32 state (exact in double).
                const double b1 = hyper.beta1, b2 = hyper.beta2, lr = hyper.lr;
                const double bias1 = 1.0 - std::pow(b1, t), bias2 = 1.0 - std::pow(b2, t);
                std::vector<double> master(n), m(n), v(n), master_scale(n), m_scale(n), v_scale(n);
                for (size_t i = 0; i < n; ++i) {
                    const double g = double(to_float(grads[i])) * grad_scale;
                    m[i] = b1 * state.m[i] + (1.0 - b1) * g;
                    v[i] = b2 * state.v[i] + (1.0 - b2) * g * g;
                    const double denominator = std::sqrt(v[i] / bias2) + hyper.eps;
                    master[i] = state.master[i] - lr * hyper.weight_decay * state.master[i] -
                                lr * (m[i] / bias1) / denominator;
                    m_scale[i] = b1 * std::abs(state.m[i]) + (1.0 - b1) * std::abs(g);
                    v_scale[i] = v[i];
                    master_scale[i] = std::abs(state.master[i]) + lr * (m_scale[i] / bias1) / denominator;
                }
                const std::string where = "n " + std::to_string(n) + " wd " + std::to_string(weight_decay) +
                                          " t " + std::to_string(t);
                check_adamw_close("master " + where, got.master, master, master_scale);
                check_adamw_close("m " + where, got.m, m, m_scale);
                check_adamw_close("v " + where, got.v, v, v_scale);

                // Parameters: the master exactly in FP32; in BF16 one of its two bf16 neighbours,
                // chosen by stochastic_round_bf16 with the bits of the element's global index.
                for (size_t i = 0; i < n; ++i) {
                    INFO(where << " element " << i << " master " << got.master[i]);
                    const float param = to_float(got.params[i]);
                    if constexpr (kFp32) {
                        REQUIRE(float_bits(param) == float_bits(got.master[i]));
                    } else {
                        const Bf16Neighbours near = bf16_neighbours(got.master[i]);
                        REQUIRE((param == near.toward_zero || param == near.away_from_zero));
                        const float expect = bf16_value(
                            stochastic_round_bf16(got.master[i], rounding_bits(seed, t, element_offset + i)));
                        REQUIRE(float_bits(param) == float_bits(expect));
                        inexact += near.toward_zero != near.away_from_zero;
                        rounded_away += near.toward_zero != near.away_from_zero && param == near.away_from_zero;
                    }
                }
                state = got;
            }
            // Stochastic, not nearest and not truncation: for fractions f spread evenly over an
            // ulp, a value goes away from zero with probability E[f] = 1/2. Over 20495 values the
            // standard deviation of the share is 0.0035; [0.45, 0.55] is 14 of them.
            if (!kFp32 && inexact > 10000) {
                const double share = double(rounded_away) / double(inexact);
                INFO("share rounded away from zero " << share);
                CHECK((share > 0.45 && share < 0.55));
            }
        }
    }
}

// Runs one AdamW step per entry of grads_per_step over [0, n) as calls over [begin, end) ranges given by `cuts` (e.g. {0, k,
// n}); with `shard_local_state` each range after the first keeps master/m/v in buffers of its own
// (as a ZeRO shard does), while params and grads stay views of the whole buffer.
// chunks_per_item: adamw_update's (0: the build's).
HostState run_split(const HostState& initial, const std::vector<std::vector<floatX>>& grads_per_step,
                    const std::vector<size_t>& cuts, bool shard_local_state, uint64_t seed, uint64_t base_offset,
                    int chunks_per_item = 0) {
    const AdamWHyper hyper{3e-3f, 0.9f, 0.999f, 1e-8f, 0.1f};
    DeviceState whole(initial);
    std::vector<std::unique_ptr<DeviceState>> shards;
    for (size_t r = 0; r + 1 < cuts.size(); ++r) {
        const size_t begin = cuts[r], end = cuts[r + 1];
        auto slice = [&](const std::vector<float>& a) { return std::vector<float>(a.begin() + begin, a.begin() + end); };
        shards.push_back(std::make_unique<DeviceState>(
            HostState{slice(initial.master), slice(initial.m), slice(initial.v), {}}));
    }
    for (size_t t = 1; t <= grads_per_step.size(); ++t) {
        DeviceBuffer<floatX> grads(grads_per_step[t - 1]);
        for (size_t r = 0; r + 1 < cuts.size(); ++r) {
            const size_t begin = cuts[r], count = cuts[r + 1] - cuts[r];
            const bool local = shard_local_state && r > 0;
            float* master = local ? shards[r]->master.ptr : whole.master.ptr + begin;
            float* m = local ? shards[r]->m.ptr : whole.m.ptr + begin;
            float* v = local ? shards[r]->v.ptr : whole.v.ptr + begin;
            adamw_update(whole.params.ptr + begin, master, m, v, grads.ptr + begin, count, hyper, int(t), 1.0f, seed,
                         base_offset + begin, nullptr, chunks_per_item);
        }
    }
    HostState result = whole.download();
    if (shard_local_state) {
        for (size_t r = 1; r + 1 < cuts.size(); ++r) {
            const HostState part = shards[r]->download();
            std::copy(part.master.begin(), part.master.end(), result.master.begin() + cuts[r]);
            std::copy(part.m.begin(), part.m.end(), result.m.begin() + cuts[r]);
            std::copy(part.v.begin(), part.v.end(), result.v.begin() + cuts[r]);
        }
    }
    return result;
}

void require_same_bits(const HostState& a, const HostState& b) {
    REQUIRE(bitwise_equal(a.master, b.master));
    REQUIRE(bitwise_equal(a.m, b.m));
    REQUIRE(bitwise_equal(a.v, b.v));
    REQUIRE(bitwise_equal(a.params, b.params));
}

TEST_CASE("adamw_update: splitting the buffer into calls or ZeRO shards changes no bit") {
    const size_t n = 4099;
    const uint64_t seed = 99, base_offset = 1000003;
    std::mt19937 rng(7);
    const HostState initial = random_state(n, rng);
    std::vector<std::vector<floatX>> grads;
    for (int t = 0; t < 3; ++t) grads.push_back(random_grads(n, rng));

    const HostState whole = run_split(initial, grads, {0, n}, false, seed, base_offset);
    // k = 13: the second call starts 13 elements in (a scalar head, then vectors); 2048: aligned;
    // 4098: a one-element call. Shard-local state at 13 disagrees in alignment with the params
    // view, so that call runs all-scalar; the bits must not care.
    for (size_t k : {size_t(13), size_t(2048), size_t(4098)}) {
        for (bool shard_local : {false, true}) {
            INFO("split at " << k << (shard_local ? " with shard-local master/m/v" : ""));
            require_same_bits(run_split(initial, grads, {0, k, n}, shard_local, seed, base_offset), whole);
        }
    }
    INFO("three calls with cuts at 5, 1003");
    require_same_bits(run_split(initial, grads, {0, 5, 1003, n}, true, seed, base_offset), whole);
}

// A vector work item takes kAdamWChunksPerItem chunks: 1 on a GPU, 2 in the CPU build. Every count
// gives the same bits, also where the last item is short of chunks (the call over [3, n): 255 chunks
// after a 5-element head in BF16, 1 over at 2 an item; the call over [2048, n): 128 chunks, 2 and 3
// over at 3 and 5) and where a call runs all-scalar (shard-local state cut at 13).
TEST_CASE("adamw_update: chunks per work item change no bit") {
    const size_t n = 4099;
    const uint64_t seed = 3, base_offset = 17;
    std::mt19937 rng(8);
    const HostState initial = random_state(n, rng);
    const std::vector<std::vector<floatX>> grads{random_grads(n, rng), random_grads(n, rng)};
    const HostState one = run_split(initial, grads, {0, 3, n}, false, seed, base_offset, 1);
    for (int chunks_per_item : {2, 3, 5}) {
        INFO(chunks_per_item << " chunks a work item");
        require_same_bits(run_split(initial, grads, {0, 3, n}, false, seed, base_offset, chunks_per_item), one);
        require_same_bits(run_split(initial, grads, {0, 13, 2048, n}, true, seed, base_offset, chunks_per_item), one);
    }
    CHECK(kAdamWChunksPerItem == (kEmulatedDevice ? 2 : 1));
    DeviceState state(initial);
    DeviceBuffer<floatX> g(grads[0]);
    CHECK_THROWS_WITH(adamw_update(state.params.ptr, state.master.ptr, state.m.ptr, state.v.ptr, g.ptr, n,
                                   AdamWHyper{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f}, 1, 1.0f, seed, 0, nullptr, -1),
                      Catch::Matchers::Contains("chunks_per_item = -1 must be >= 0"));
}

TEST_CASE("adamw_update: reproducible for a seed, different rounding for another, same bits on more OS threads") {
    const size_t n = 4099;
    std::mt19937 rng(11);
    const HostState initial = random_state(n, rng);
    const std::vector<std::vector<floatX>> grads{random_grads(n, rng), random_grads(n, rng)};
    const HostState first = run_split(initial, grads, {0, n}, false, 5, 0);
    require_same_bits(run_split(initial, grads, {0, n}, false, 5, 0), first);
#ifndef __CUDACC__
    const int threads = cuemu::threads();
    cuemu::set_threads(3);
    const HostState threaded = run_split(initial, grads, {0, n}, false, 5, 0);
    cuemu::set_threads(threads);
    require_same_bits(threaded, first);
#endif
    // Another seed: the same master weights and moments (rounding does not feed back), and in BF16
    // different roundings. Two independent draws disagree with probability 2 f (1 - f), 1/3 on
    // average over an ulp; over 4099 values (sd 0.007) more than 25% must differ.
    const HostState reseeded = run_split(initial, grads, {0, n}, false, 6, 0);
    REQUIRE(bitwise_equal(reseeded.master, first.master));
    REQUIRE(bitwise_equal(reseeded.m, first.m));
    REQUIRE(bitwise_equal(reseeded.v, first.v));
    size_t differ = 0;
    for (size_t i = 0; i < n; ++i) differ += float_bits(to_float(reseeded.params[i])) != float_bits(to_float(first.params[i]));
    if constexpr (kFp32) {
        REQUIRE(differ == 0);
    } else {
        INFO(differ << " of " << n << " parameters differ");
        REQUIRE(differ > n / 4);
    }
}

TEST_CASE("adamw_requirements rejects torch's invalid hyperparameters, step < 1 and a bad grad_scale") {
    const AdamWHyper good{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
    CHECK(adamw_requirements(good, 1, 1.0f) == "");
    CHECK(adamw_requirements(good, 1, 0.0f) == "");
    auto with = [&](auto change) {
        AdamWHyper h = good;
        change(h);
        return adamw_requirements(h, 1, 1.0f);
    };
    CHECK(with([](AdamWHyper& h) { h.beta1 = 1.0f; }) == "adamw: beta1 = 1.000000 is outside [0, 1)");
    CHECK(with([](AdamWHyper& h) { h.beta2 = -0.5f; }).find("beta2") != std::string::npos);
    CHECK(with([](AdamWHyper& h) { h.lr = -1.0f; }).find("lr") != std::string::npos);
    CHECK(with([](AdamWHyper& h) { h.eps = NAN; }).find("eps") != std::string::npos);
    CHECK(with([](AdamWHyper& h) { h.weight_decay = -0.1f; }).find("weight_decay") != std::string::npos);
    CHECK(adamw_requirements(good, 0, 1.0f) == "adamw: step = 0 must be >= 1 (the first step is 1)");
    CHECK(adamw_requirements(good, 1, INFINITY).find("grad_scale") != std::string::npos);
    CHECK(adamw_requirements(good, 1, NAN).find("grad_scale") != std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Stochastic rounding and its random bits (host calls of the __host__ __device__ functions).

TEST_CASE("stochastic_round_bf16 gives one of the two neighbouring bf16 values, with the documented carry") {
    std::mt19937 rng(3);
    for (int trial = 0; trial < 200000; ++trial) {
        // Any finite float: every sign, exponent (subnormals included) and mantissa.
        const uint32_t sign_and_mantissa = rng() & 0x807FFFFFu, exponent = rng() % 255u;
        const uint32_t bits = sign_and_mantissa | exponent << 23;
        const float x = float_from_bits(bits);
        const uint32_t random = rng();
        const float rounded = bf16_value(stochastic_round_bf16(x, random));
        const Bf16Neighbours near = bf16_neighbours(x);
        INFO("x bits " << std::hex << bits << " random " << random);
        REQUIRE((rounded == near.toward_zero || rounded == near.away_from_zero));
        // Away from zero exactly when the random high half carries out of the dropped 16 bits.
        const bool carries = (bits & 0xFFFFu) + (random >> 16) >= 0x10000u;
        REQUIRE((float_bits(rounded) == float_bits(near.away_from_zero)) == (carries || near.toward_zero == near.away_from_zero));
    }
    // Values bf16 holds exactly never move; zero keeps its sign; infinities and NaN survive.
    for (uint32_t random : {0u, 0xFFFFFFFFu, 0x80000000u}) {
        CHECK(bf16_value(stochastic_round_bf16(1.5f, random)) == 1.5f);
        CHECK(float_bits(bf16_value(stochastic_round_bf16(-0.0f, random))) == 0x80000000u);
        CHECK(bf16_value(stochastic_round_bf16(INFINITY, random)) == INFINITY);
        CHECK(bf16_value(stochastic_round_bf16(-INFINITY, random)) == -INFINITY);
        CHECK(std::isnan(bf16_value(stochastic_round_bf16(float_from_bits(0x7F800001u), random))));
    }
    // A carry out of the mantissa lands on the next binade: just below 2 rounds to 1.9921875 or 2.
    CHECK(bf16_value(stochastic_round_bf16(float_from_bits(0x3FFFFFFFu), 0xFFFF0000u)) == 2.0f);
    CHECK(bf16_value(stochastic_round_bf16(float_from_bits(0x3FFFFFFFu), 0u)) == 1.9921875f);
}

TEST_CASE("stochastic_round_bf16 is unbiased") {
    // Random x over 2^-24..2^24 (both signs) and random bits. The error in ulps, e = (|round(x)| -
    // |x|) / ulp, is 1 - f with probability f and -f otherwise (f: x's fraction of an ulp above
    // its lower neighbour): mean 0, variance f (1 - f) <= 1/4. With N draws the mean has standard
    // deviation <= 0.5 / sqrt(N) = 4.9e-4 for N = 2^20; allow 5 of them. Truncation (mean -1/2)
    // or rounding with a biased carry would be far outside.
    std::mt19937 rng(17);
    const int draws = 1 << 20;
    double error_sum = 0;
    for (int i = 0; i < draws; ++i) {
        const uint32_t bits = (rng() & 0x807FFFFFu) | (103u + rng() % 48u) << 23;
        const float x = float_from_bits(bits);
        const Bf16Neighbours near = bf16_neighbours(x);
        const double ulp = double(near.away_from_zero) - double(near.toward_zero);
        if (ulp == 0) continue;  // x is a bf16 value: no error, no draw
        const double rounded = bf16_value(stochastic_round_bf16(x, rng()));
        error_sum += (std::abs(rounded) - std::abs(double(x))) / std::abs(ulp);
    }
    const double bound = 5 * 0.5 / std::sqrt(double(draws));
    INFO("mean error " << error_sum / draws << " ulp, bound " << bound);
    CHECK(std::abs(error_sum / draws) < bound);

    // One x again and again, with the optimizer's own bits rounding_bits(seed, step, i): the share
    // of draws rounded up must be f, within 5 standard deviations sqrt(f (1 - f) / N).
    for (uint32_t dropped : {0x0100u, 0x5555u, 0xC000u, 0xFFF0u}) {
        const float x = float_from_bits(0x3F800000u | dropped);  // 1 + dropped 2^-23
        const double f = dropped / 65536.0;
        const int repeats = 1 << 18;
        int up = 0;
        for (int i = 0; i < repeats; ++i) up += bf16_value(stochastic_round_bf16(x, rounding_bits(42, 3, uint64_t(i)))) > x;
        const double share = double(up) / repeats;
        INFO("dropped bits " << std::hex << dropped << std::dec << ": rounded up " << share << ", expected " << f);
        CHECK(std::abs(share - f) < 5 * std::sqrt(f * (1 - f) / repeats));
    }
}

TEST_CASE("rounding_bits is a pure function of (seed, step, index) and changes with each of them") {
    CHECK(rounding_bits(1, 2, 3) == rounding_bits(1, 2, 3));
    // Independent 32-bit values collide with probability 2^-32: over 4096 indices, none should.
    int same_seed = 0, same_step = 0, same_neighbour = 0;
    for (uint64_t i = 0; i < 4096; ++i) {
        const uint32_t bits = rounding_bits(1, 2, i);
        same_seed += bits == rounding_bits(2, 2, i);
        same_step += bits == rounding_bits(1, 3, i);
        same_neighbour += bits == rounding_bits(1, 2, i + 1);
    }
    CHECK(same_seed == 0);
    CHECK(same_step == 0);
    CHECK(same_neighbour == 0);
    // The mean of the high 16 bits (the ones rounding uses) over 2^16 indices: uniform on [0, 65535]
    // has mean 32767.5 and sd 18918 / sqrt(2^16) = 73.9; allow 5 sd.
    double sum = 0;
    for (uint64_t i = 0; i < 65536; ++i) sum += rounding_bits(9, 1, i) >> 16;
    CHECK(std::abs(sum / 65536 - 32767.5) < 5 * 73.9);
}

// ---------------------------------------------------------------------------------------------
// Global norm

TEST_CASE("global_norm_squared matches a double sum of squares, bitwise reproducible on more OS threads") {
    std::mt19937 rng(5);
    // n: empty, single, partial vector, partial blocks, and ~1e6 (several blocks of up to 256 vectors a
    // thread); start 0 or 3 elements into an aligned buffer (scalar head before vectors).
    for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(4099), size_t(1 << 20) + 5}) {
        for (size_t start : {size_t(0), size_t(3)}) {
            std::vector<floatX> values = random_grads(n + start, rng);
            double want = 0;
            for (size_t i = start; i < n + start; ++i) want += double(to_float(values[i])) * to_float(values[i]);
            DeviceBuffer<floatX> d_values(values);
            DeviceBuffer<float> scratch(global_norm_scratch_floats(n)), out(1);
            global_norm_squared(out.ptr, d_values.ptr + start, n, scratch.ptr, nullptr);
            const float got = out.download()[0];
            // All terms are non-negative, so FP32 summation errs by at most (additions along the
            // longest chain) x 2^-24 relative: here <= 64 squares per running sum of a vector lane
            // (256 vectors a thread over kGlobalNormChains sums; the ~1e6 case: 57), 4 x 8 sums a
            // thread, then up to 63 adds of the block's thread sums and 5 + 5 levels of the finishing
            // block's: < 175 additions, 1.0e-5 at worst, but rounding errors of random sign grow as
            // the square root of the chain. Measured: at most 2.4e-7 (BF16; 1.6e-7 FP32, where one
            // square's own rounding is up to 6e-8), deterministic, so the check holds 1e-5.
            INFO("n " << n << " start " << start << " got " << got << " want " << want);
            if (std::getenv("REPORT_ERRORS")) std::printf("global norm n %zu: relative error %.2e\n", n, std::abs(got - want) / (want + 1e-30));
            CHECK(std::abs(got - want) <= 1e-5 * want);

            global_norm_squared(out.ptr, d_values.ptr + start, n, scratch.ptr, nullptr);
            CHECK(float_bits(out.download()[0]) == float_bits(got));
#ifndef __CUDACC__
            const int threads = cuemu::threads();
            cuemu::set_threads(threads == 3 ? 1 : 3);
            global_norm_squared(out.ptr, d_values.ptr + start, n, scratch.ptr, nullptr);
            cuemu::set_threads(threads);
            CHECK(float_bits(out.download()[0]) == float_bits(got));
#endif
        }
    }
}
