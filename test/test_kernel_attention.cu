// Causal flash attention (kernels/attention.cuh) against a plain double-precision reference that
// builds the full T x T softmax: out and lse forward; dq, dk, dv as the analytic gradient of
// sum(out * G) for a random G.
#include "test_util.h"

#include "attention_reference.h"

#include "kernels/attention.cuh"

#include <cmath>
#include <cstring>
#include <random>

using namespace attention_reference;

TEST_CASE("attention forward and backward match a double reference") {
    const Sizes cases[] = {
        {2, 37, 32, 2, 3.0f},     // hs 16; T = 37: a full and a partial tile
        {3, 37, 96, 3, 2.0f},     // hs 32, NH 3
        {2, 33, 80, 2, 2.0f},     // hs 40: not a power of two, uneven float4 groups per thread
        {2, 100, 128, 2, 2.0f},   // hs 64 (GPT-2); T = 100: 4 tiles, the last partial
        {2, 64, 128, 2, 4.0f},    // T a multiple of the tile; very sharp rows
        {3, 1, 128, 2, 2.0f},     // T = 1: one key per row
        {1, 45, 256, 2, 1.5f},    // hs 128 (opts into more than 48 KB of shared memory)
        {1, 19, 1600, 25, 2.0f},  // GPT-2 1.5B heads: NH 25, hs 64
        {1, 200, 64, 1, 2.0f},    // 7 tiles: long online-softmax chains
    };
    for (const Sizes& s : cases) {
        CAPTURE(s.B, s.T, s.C, s.NH);
        std::mt19937 rng(1234 + s.T * 7 + s.C);
        const std::vector<floatX> qkv = random_qkv(s, rng);
        const std::vector<floatX> dout = random_floatX(size_t(s.B) * s.T * s.C, 1.0f, rng);

        const Reference ref = reference_attention(qkv, dout, s);
        const Results got = run_attention(Kernels::simt, qkv, dout, s);

        const auto [dq, dk, dv] = split_qkv(got.dqkv, s.C);
        const auto [dq_ref, dk_ref, dv_ref] = split_qkv(ref.dqkv, s.C);
        // Errors relative to each tensor's max |ref|, measured over these cases under every schedule.
        // FP32: float accumulation over <= T keys and hs dims; measured max 1.3e-6 (out, the sharpest
        // rows), gradients <= 8e-7, lse <= 1.9e-7. BF16: out and dqkv are rounded to bf16 (at most
        // 2^-8 of the element, itself <= the scale); measured out <= 1.98e-3, dv <= 2.8e-3. dq and dk
        // also inherit the rounding of out through D = rowsum(dO * out), which backward reads from
        // the stored bf16 out as FlashAttention-2 does: measured <= 5.8e-3 (dk, hs 16). lse stays float.
        double out_tol, lse_tol, dqk_tol;
        if constexpr (std::is_same_v<floatX, float>) {
            out_tol = 5e-6, lse_tol = 1e-6, dqk_tol = 5e-6;
        } else {
            out_tol = 0x1p-8 + 5e-6, lse_tol = 1e-6, dqk_tol = 1e-2;
        }
        CHECK(tensor_error(got.out, ref.out) <= out_tol);
        CHECK(tensor_error(got.lse, ref.lse) <= lse_tol);
        CHECK(tensor_error(dq, dq_ref) <= dqk_tol);
        CHECK(tensor_error(dk, dk_ref) <= dqk_tol);
        CHECK(tensor_error(dv, dv_ref) <= out_tol);  // dv = P^T dO: no D, only accumulation and rounding
    }
}

TEST_CASE("attention is bitwise deterministic, also across more emulator threads") {
    const Sizes s{2, 70, 128, 2, 2.0f};
    std::mt19937 rng(99);
    const std::vector<floatX> qkv = random_floatX(size_t(s.B) * s.T * 3 * s.C, 2.0f, rng);
    const std::vector<floatX> dout = random_floatX(size_t(s.B) * s.T * s.C, 1.0f, rng);
    const Results first = run_attention(Kernels::simt, qkv, dout, s);
#ifndef __CUDACC__
    const int threads = cuemu::threads();
    cuemu::set_threads(2);  // blocks now finish in a different order
#endif
    const Results second = run_attention(Kernels::simt, qkv, dout, s);
#ifndef __CUDACC__
    cuemu::set_threads(threads);
#endif
    auto same_bits = [](const auto& a, const auto& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    CHECK(same_bits(first.out, second.out));
    CHECK(same_bits(first.lse, second.lse));
    CHECK(same_bits(first.dqkv, second.dqkv));
}

TEST_CASE("attention_requirements accepts GPT-2 shapes and names the broken constraint otherwise") {
    CHECK(attention_requirements(768, 12) == "");   // 124M: hs 64
    CHECK(attention_requirements(1600, 25) == "");  // 1.5B: hs 64
    CHECK(attention_requirements(2048, 16) == "");  // hs 128, the largest supported
    CHECK(attention_requirements(32, 2) == "");     // hs 16
    CHECK(attention_requirements(96, 3) == "");     // hs 32
    CHECK(attention_requirements(100, 3) == "attention: C = 100 is not divisible by NH = 3");
    CHECK(attention_requirements(100, 4) == "attention: head size C/NH = 25 is not a multiple of 8");
    CHECK(attention_requirements(512, 2) == "attention: head size C/NH = 256 exceeds the supported maximum 128");
    CHECK(attention_requirements(768, 0) == "attention: C = 768 and NH = 0 must be positive");
}

// The tensor-core kernels take BF16 operands (their tests, test_kernel_attention_tc.cu, build in BF16
// only); in the FP32 build their requirements function must refuse, naming the alternative.
TEST_CASE("attention_tc_requirements: accepted in the BF16 build, refused with the reason in the FP32 build") {
    const std::string verdict = attention_tc_requirements(1, 64, 768, 12);
    if (std::is_same_v<floatX, float>)
        CHECK(verdict == "attention tc: needs the BF16 build (floatX = bf16); use --attention simt");
    else
        CHECK(verdict == "");
}
