// Causal flash attention (kernels/attention.cuh) against a plain double-precision reference that
// builds the full T x T softmax: out and lse forward; dq, dk, dv as the analytic gradient of
// sum(out * G) for a random G. Then with document masks (packed rows), fully masked tiles skipped,
// and the document starts computed from the tokens (host/documents.h). Every check runs both row
// splits, a thread a row (what the CPU build runs) and four threads a row (what a GPU runs), and
// the two must agree bit for bit.
#include "test_util.h"

#include "attention_reference.h"

#include "host/documents.h"
#include "kernels/attention.cuh"

#include <cmath>
#include <cstring>
#include <random>

using namespace attention_reference;

// Tolerances relative to each tensor's max |ref|: out and dv, dq and dk, lse (see the first test).
struct Tolerances {
    double out, dqk, lse;
};
constexpr Tolerances kTolerances = std::is_same_v<floatX, float> ? Tolerances{5e-6, 5e-6, 1e-6}
                                                                 : Tolerances{0x1p-8 + 5e-6, 1e-2, 1e-6};

// The SIMT kernels' row splits a head size has in this build (kernels/attention.cuh, ROW_THREADS).
std::vector<int> row_splits(const Sizes& s) {
    if (attention_detail::one_thread_rows_exist(s.C / s.NH)) return {1, 4};
    return {4};
}

template <typename T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
}
// Both row splits compute every value in the same order: the CPU build's runs of the one-thread form
// then speak for the four-thread form a GPU runs.
void check_same_bits(const Results& a, const Results& b) {
    CHECK(same_bits(a.out, b.out));
    CHECK(same_bits(a.lse, b.lse));
    CHECK(same_bits(a.dqkv, b.dqkv));
}

// out, lse, dq, dk and dv of the kernels against the reference, within kTolerances.
void check_against_reference(const Results& got, const Reference& ref, int C) {
    const auto [dq, dk, dv] = split_qkv(got.dqkv, C);
    const auto [dq_ref, dk_ref, dv_ref] = split_qkv(ref.dqkv, C);
    CHECK(tensor_error(got.out, ref.out) <= kTolerances.out);
    CHECK(tensor_error(got.lse, ref.lse) <= kTolerances.lse);
    CHECK(tensor_error(dq, dq_ref) <= kTolerances.dqk);
    CHECK(tensor_error(dk, dk_ref) <= kTolerances.dqk);
    CHECK(tensor_error(dv, dv_ref) <= kTolerances.out);  // dv = P^T dO: no D, only accumulation and rounding
}

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
        std::vector<Results> splits;
        for (const int rows : row_splits(s)) {
            CAPTURE(rows);
            const Results got = run_attention(Kernels::simt, qkv, dout, s, nullptr, rows);
            splits.push_back(got);

            // Errors relative to each tensor's max |ref|, measured over these cases under every schedule.
            // FP32: float accumulation over <= T keys and hs dims; measured max 1.3e-6 (out, the sharpest
            // rows), gradients <= 8e-7, lse <= 1.9e-7. BF16: out and dqkv are rounded to bf16 (at most
            // 2^-8 of the element, itself <= the scale); measured out <= 1.98e-3, dv <= 2.8e-3. dq and dk
            // also inherit the rounding of out through D = rowsum(dO * out), which backward reads from
            // the stored bf16 out as FlashAttention-2 does: measured <= 5.8e-3 (dk, hs 16). lse stays float.
            check_against_reference(got, ref, s.C);
            // A query that sees one key has P = 1 and out = its value row, so D = dO . out and dP = dO . V
            // are one sum of the same products (attention_backward_rowdot_kernel sums in the dots' order):
            // dS = 0 and dq = dk = 0 exactly, as in the reference. The relative errors above would pass
            // ~1e-7 of rounding noise there.
            if (s.T == 1) {
                const auto grad = split_qkv(got.dqkv, s.C);
                for (int part = 0; part < 2; ++part)
                    for (size_t i = 0; i < grad[part].size(); ++i) {
                        INFO((part == 0 ? "dq" : "dk") << " element " << i);
                        REQUIRE(to_float(grad[part][i]) == 0.0f);
                    }
            }
        }
        if (splits.size() == 2) check_same_bits(splits[0], splits[1]);
    }
}

TEST_CASE("document-masked attention matches a double reference with an explicit mask") {
    // Documents shorten the rows, so the errors are those of the causal test or smaller: measured
    // over these cases (the same under every schedule), FP32 out 1.7e-6 (the sharp rows), lse
    // 1.5e-7, dq 6.0e-7, dk 7.4e-7, dv 5.3e-7; BF16 out 1.95e-3, lse 1.0e-7, dq 2.6e-3, dk 4.7e-3,
    // dv 3.7e-3. Its tolerances apply unchanged.
    for (const DocumentCase& c : document_cases()) {
        const Sizes& s = c.s;
        CAPTURE(c.what, s.B, s.T, s.C, s.NH);
        std::mt19937 rng(777 + s.T * 7 + s.C);
        const std::vector<floatX> qkv = random_qkv(s, rng);
        const std::vector<floatX> dout = random_floatX(size_t(s.B) * s.T * s.C, 1.0f, rng);
        const std::vector<int> docs = packed_rows(s.T, c.eots);

        const Reference ref = reference_attention(qkv, dout, s, &docs);
        std::vector<Results> splits;
        for (const int rows : row_splits(s)) {
            CAPTURE(rows);
            splits.push_back(run_attention(Kernels::simt, qkv, dout, s, &docs, rows));
            check_against_reference(splits.back(), ref, s.C);
            // The mask matters in every case: plain causal attention is far from it.
            CHECK(tensor_error(splits.back().out, reference_attention(qkv, dout, s).out).value > 10 * kTolerances.out);
        }
        if (splits.size() == 2) check_same_bits(splits[0], splits[1]);
    }
}

// A span (AttentionSpan) against a windowed reference (attention_reference.h, check_spans), written and
// accumulated, with floatX results and with the FP32 ones context parallelism sums; the causal test's
// tolerances (a span is the same computation over fewer pairs; FP32 results are rounded less).
TEST_CASE("attention over a span: one range's queries against another's keys, written or accumulated") {
    const SpanTolerances tolerances{kTolerances.out, kTolerances.lse, kTolerances.dqk};
    for (const int rows : row_splits(Sizes{1, 1, 64, 1, 1.0f})) {  // the splits of hs <= 64 (larger hs take 4)
        check_spans<floatX>(Kernels::simt, tolerances, rows);
        check_spans<float>(Kernels::simt, tolerances, rows);
    }
}

// A key tile that lies wholly before a query tile's documents, or a query tile wholly after the
// documents of a key tile, is skipped, not loaded and masked: NaN planted in one document (q, k, v
// and dout) reaches no result of the other, though masking would multiply it by a probability of 0.
TEST_CASE("document masking skips fully masked tiles: NaN in one document stays out of the other") {
    const Sizes s{1, 128, 128, 2, 2.0f};
    const std::vector<int> docs = packed_rows(s.T, {{64}});  // documents [0, 64) and [64, 128): tile edges
    for (const int rows : row_splits(s))
    for (const bool poison_first : {true, false}) {
        CAPTURE(rows, poison_first);
        std::mt19937 rng(31);
        std::vector<floatX> qkv = random_qkv(s, rng), dout = random_floatX(size_t(s.T) * s.C, 1.0f, rng);
        const int from = poison_first ? 0 : 64, to = from + 64, kept = poison_first ? 64 : 0;
        poison_positions(qkv, dout, s, 0, from, to);
        const Reference ref = reference_attention(qkv, dout, s, &docs);
        const Results got = run_attention(Kernels::simt, qkv, dout, s, &docs, rows);
        auto kept_rows = [&](const auto& x, int width) { return positions_of(x, s, width, 0, kept, kept + 64); };
        CHECK(tensor_error(kept_rows(got.out, s.C), kept_rows(ref.out, s.C)) <= kTolerances.out);
        CHECK(tensor_error(lse_positions_of(got.lse, s, 0, kept, kept + 64), lse_positions_of(ref.lse, s, 0, kept, kept + 64)) <=
              kTolerances.lse);
        const auto grad = split_qkv(got.dqkv, s.C);
        const auto grad_ref = split_qkv(ref.dqkv, s.C);
        for (int part = 0; part < 3; ++part) {
            CAPTURE(part);
            CHECK(tensor_error(kept_rows(grad[part], s.C), kept_rows(grad_ref[part], s.C)) <= kTolerances.dqk);
        }
    }
}

TEST_CASE("document_starts: each token's document starts at the last EOT at or before it, else at the row's start") {
    constexpr int E = kGpt2EotToken, T = 9;
    const std::vector<int> tokens = {
        5, 6, E, 7, E, E, 8, 9, E,  // EOTs mid-row, twice in a row, last
        E, 1, 2, 3, 4, 5, 6, 7, 8,  // one at the row's start
        1, 2, 3, 4, 5, 6, 7, 8, 9,  // none: the row is one document
    };
    const std::vector<int> starts = document_starts(tokens.data(), 3, T, E);
    CHECK(starts == std::vector<int>{0, 0, 2, 2, 4, 5, 5, 5, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
    // Against the brute force of the tests' reference, on random rows.
    std::mt19937 rng(5);
    std::vector<int> random_tokens(4 * 100);
    std::vector<std::vector<int>> eots(4);
    for (size_t i = 0; i < random_tokens.size(); ++i) {
        random_tokens[i] = rng() % 5 == 0 ? E : int(rng() % 1000);
        if (random_tokens[i] == E) eots[i / 100].push_back(int(i % 100));
    }
    CHECK(document_starts(random_tokens.data(), 4, 100, E) == packed_rows(100, eots));
}

TEST_CASE("attention is bitwise deterministic, also across more emulator threads") {
    const Sizes s{2, 70, 128, 2, 2.0f};
    std::mt19937 rng(99);
    const std::vector<floatX> qkv = random_floatX(size_t(s.B) * s.T * 3 * s.C, 2.0f, rng);
    const std::vector<floatX> dout = random_floatX(size_t(s.B) * s.T * s.C, 1.0f, rng);
    for (const int rows : row_splits(s)) {
        CAPTURE(rows);
        const Results first = run_attention(Kernels::simt, qkv, dout, s, nullptr, rows);
#ifndef __CUDACC__
        const int threads = cuemu::threads();
        cuemu::set_threads(2);  // blocks now finish in a different order
#endif
        const Results second = run_attention(Kernels::simt, qkv, dout, s, nullptr, rows);
#ifndef __CUDACC__
        cuemu::set_threads(threads);
#endif
        check_same_bits(first, second);
    }
}

// D = rowsum(dO * O), the first step of every backward pass, in both forms the launcher has: through
// shared memory (a GPU's) and read directly (the emulator's). Both must give the bits of the documented
// order, computed here on the host: four running sums, one per float4 component, in element order,
// each a fused multiply-add, then added pairwise. Rows not a multiple of the 32-row block, head sizes
// 16 to 128 (40: five 16-byte pieces a row in BF16), GPT-2 1.5B's 25 heads.
TEST_CASE("the row-dot D: staged through shared memory and read directly, the documented order bit for bit") {
    const Sizes cases[] = {{2, 37, 32, 2, 1.0f}, {3, 37, 96, 3, 1.0f}, {2, 33, 80, 2, 1.0f}, {2, 100, 128, 2, 1.0f},
                           {3, 1, 128, 2, 1.0f}, {1, 45, 256, 2, 1.0f}, {1, 19, 1600, 25, 1.0f}};
    for (const Sizes& s : cases) {
        CAPTURE(s.B, s.T, s.C, s.NH);
        std::mt19937 rng(77 + s.T + s.C);
        const size_t n = size_t(s.B) * s.T * s.C;
        const std::vector<floatX> dout = random_floatX(n, 1.0f, rng), out = random_floatX(n, 1.0f, rng);
        const int hs = s.C / s.NH;
        std::vector<float> want(size_t(s.B) * s.NH * s.T);
        for (int b = 0; b < s.B; ++b)
            for (int t = 0; t < s.T; ++t)
                for (int h = 0; h < s.NH; ++h) {
                    const size_t at = (size_t(b) * s.T + t) * s.C + size_t(h) * hs;
                    float sums[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    for (int d = 0; d < hs; ++d) sums[d % 4] = std::fma(to_float(dout[at + d]), to_float(out[at + d]), sums[d % 4]);
                    want[(size_t(b) * s.NH + h) * s.T + t] = (sums[0] + sums[1]) + (sums[2] + sums[3]);
                }
        DeviceBuffer<floatX> d_dout(dout), d_out(out);
        for (const int staged : {1, 0}) {
            INFO((staged ? "staged through shared memory" : "read directly"));
            DeviceBuffer<float> D(want.size());
            D.fill_bytes(0xFF);  // NaN: every value must be written
            attention_backward_rowdot(D.ptr, d_dout.ptr, d_out.ptr, s.B, s.T, s.C, s.NH, nullptr, staged);
            CHECK(bitwise_equal(D.download(), want));
        }
    }
}

TEST_CASE("the SIMT row split: a thread a row where the emulator runs the kernels (hs <= 64), else 4; others refused") {
    using attention_detail::simt_row_threads;
    CHECK(simt_row_threads(128) == 4);
#ifdef __CUDACC__
    CHECK(simt_row_threads(64) == 4);
#else
    CHECK(simt_row_threads(64) == 1);
    CHECK(simt_row_threads(16) == 1);
    cuemu::set_record_only(true);  // launches recorded for a GPU's roofline take the GPU's split
    const int recorded = simt_row_threads(64);
    cuemu::set_record_only(false);
    CHECK(recorded == 4);
#endif
    const Sizes s{1, 8, 256, 2, 1.0f};  // hs 128
    DeviceBuffer<floatX> qkv(size_t(s.T) * 3 * s.C), out(size_t(s.T) * s.C);
    DeviceBuffer<float> lse(size_t(s.T) * s.NH);
    CHECK_THROWS_WITH(attention_forward(out.ptr, lse.ptr, qkv.ptr, s.B, s.T, s.C, s.NH, 0, nullptr, 1),
                      Catch::Matchers::Contains(kEmulatedDevice ? "row_threads = 1 takes head sizes up to 64, got 128"
                                                                : "row_threads = 1 exists in the CPU build only") &&
                          Catch::Matchers::Contains("attention_forward"));
    CHECK_THROWS_WITH(attention_forward(out.ptr, lse.ptr, qkv.ptr, s.B, s.T, 128, 2, 0, nullptr, 2),
                      Catch::Matchers::Contains("row_threads = 2 must be 0 (automatic), 1 or 4"));
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
