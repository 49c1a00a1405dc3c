// The wgmma attention forward (kernels/attention_wgmma.cuh, head size 64) against the double
// reference that builds the full T x T softmax (test/attention_reference.h) and against the mma.sync
// forward (attention_tc.cuh): causal, with documents, over spans (context parallelism's ring steps,
// bf16 and float outputs), NaN in a skipped document, determinism, and its recorded FLOPs against the
// MMAs the emulator ran.
//
// On a GPU it needs sm_90 (built for sm_90a alone) and reports itself skipped elsewhere.
// precision: BF16 only (the kernels take BF16 operands)
// gpu arch: sm_90a
#include "test_util.h"

#include "attention_reference.h"

#include "kernels/attention_wgmma.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

namespace {

static_assert(std::is_same_v<floatX, __nv_bfloat16>, "the tensor-core kernels take BF16 operands: build in BF16");

using namespace attention_reference;

// test_kernel_attention_tc's tolerances, relative to each tensor's max |ref|: out rounds to bf16
// (2^-8), and P is rounded to bf16 for P V (2^-9 relative, averaging out over a row). Measured over
// these cases (the same under every schedule order): out 3.2e-3 against the reference, 3.9e-3 against
// the mma.sync forward (neighbouring bf16 values); lse 1.6e-7.
constexpr double kOutTolerance = 0x1p-8 + 1e-3, kLseTolerance = 1e-6;

struct Forward {
    std::vector<floatX> out;
    std::vector<float> lse;
};
enum class Which { wgmma, mma_sync };

// The causal forward of either kernel on NaN-filled outputs (every element must be written).
Forward run_forward(Which which, const std::vector<floatX>& qkv_host, const Sizes& s, const std::vector<int>* docs_host = nullptr) {
    const size_t BT = size_t(s.B) * s.T;
    DeviceBuffer<floatX> qkv(qkv_host), out(BT * s.C);
    DeviceBuffer<float> lse(BT * s.NH);
    DeviceBuffer<int> docs(docs_host ? *docs_host : std::vector<int>(1));
    out.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
    const int* doc_start = docs_host ? docs.ptr : nullptr;
    if (which == Which::wgmma) attention_wgmma_forward(out.ptr, lse.ptr, qkv.ptr, s.B, s.T, s.C, s.NH, 0, doc_start);
    else attention_tc_forward(out.ptr, lse.ptr, qkv.ptr, s.B, s.T, s.C, s.NH, 0, doc_start);
    CUDA_CHECK(cudaDeviceSynchronize());
    return {out.download(), lse.download()};
}

void check_forward(const Forward& got, const Forward& tc, const Reference& ref) {
    CHECK(tensor_error(got.out, ref.out) <= kOutTolerance);
    CHECK(tensor_error(got.lse, ref.lse) <= kLseTolerance);
    // Each within the tolerances of the exact result; the two sum P V over other tile boundaries.
    CHECK(tensor_error(got.out, tc.out) <= 2 * kOutTolerance);
    CHECK(tensor_error(got.lse, tc.lse) <= 2 * kLseTolerance);
}

}  // namespace

TEST_CASE("wgmma attention forward matches a double reference and the mma.sync forward (causal, hs 64)") {
    skip_unless_hopper();
    const Sizes cases[] = {
        {2, 100, 128, 2, 2.0f},   // one partial query block and key tile, B * NH = 4
        {1, 64, 128, 2, 4.0f},    // half a key tile; very sharp rows
        {3, 1, 128, 2, 2.0f},     // T = 1: one key per row
        {1, 19, 1600, 25, 2.0f},  // GPT-2 1.5B heads: NH 25
        {1, 300, 128, 2, 2.0f},   // three query blocks, three key tiles (the last partial)
        {1, 1024, 64, 1, 2.0f},   // 8 key tiles: long online-softmax chains; 8 query blocks
    };
    for (const Sizes& s : cases) {
        CAPTURE(s.B, s.T, s.C, s.NH);
        REQUIRE(attention_wgmma_requirements(s.B, s.T, s.C, s.NH) == "");
        std::mt19937 rng(4321 + s.T * 7 + s.C);
        const std::vector<floatX> qkv = random_qkv(s, rng);
        const std::vector<floatX> dout = random_floatX(size_t(s.B) * s.T * s.C, 1.0f, rng);
        const Reference ref = reference_attention(qkv, dout, s);
        check_forward(run_forward(Which::wgmma, qkv, s), run_forward(Which::mma_sync, qkv, s), ref);
    }
}

TEST_CASE("document-masked wgmma attention matches a double reference with an explicit mask") {
    skip_unless_hopper();
    int ran = 0;
    for (const DocumentCase& c : document_cases()) {
        const Sizes& s = c.s;
        if (attention_wgmma_requirements(s.B, s.T, s.C, s.NH) != "") continue;  // hs 64 only
        CAPTURE(c.what, s.B, s.T, s.C, s.NH);
        ++ran;
        std::mt19937 rng(888 + s.T * 7 + s.C);
        const std::vector<floatX> qkv = random_qkv(s, rng);
        const std::vector<floatX> dout = random_floatX(size_t(s.B) * s.T * s.C, 1.0f, rng);
        const std::vector<int> docs = packed_rows(s.T, c.eots);
        const Reference ref = reference_attention(qkv, dout, s, &docs);
        const Forward got = run_forward(Which::wgmma, qkv, s, &docs);
        check_forward(got, run_forward(Which::mma_sync, qkv, s, &docs), ref);
        // The mask matters in every case: plain causal attention is far from it.
        CHECK(tensor_error(got.out, reference_attention(qkv, dout, s).out).value > 10 * kOutTolerance);
    }
    CHECK(ran == 3);
}

// Key tiles before a warpgroup's documents are skipped, not masked: NaN planted in one document
// reaches no result of the other (documents at 128-key tile and 64-row warpgroup edges).
TEST_CASE("wgmma attention skips a document's tiles: NaN in one document stays out of the other") {
    skip_unless_hopper();
    const Sizes s{1, 256, 128, 2, 2.0f};
    const std::vector<int> docs = packed_rows(s.T, {{128}});  // documents [0, 128) and [128, 256)
    for (const bool poison_first : {true, false}) {
        CAPTURE(poison_first);
        std::mt19937 rng(32);
        std::vector<floatX> qkv = random_qkv(s, rng), dout = random_floatX(size_t(s.T) * s.C, 1.0f, rng);
        const int from = poison_first ? 0 : 128, kept = poison_first ? 128 : 0;
        poison_positions(qkv, dout, s, 0, from, from + 128);
        const Reference ref = reference_attention(qkv, dout, s, &docs);
        const Forward got = run_forward(Which::wgmma, qkv, s, &docs);
        CHECK(tensor_error(positions_of(got.out, s, s.C, 0, kept, kept + 128), positions_of(ref.out, s, s.C, 0, kept, kept + 128)) <=
              kOutTolerance);
        CHECK(tensor_error(lse_positions_of(got.lse, s, 0, kept, kept + 128), lse_positions_of(ref.lse, s, 0, kept, kept + 128)) <=
              kLseTolerance);
    }
}

// Context parallelism's ring steps: one position range's queries against another's keys (a compact
// k|v buffer with NaN padding rows), with and without documents, the output in bf16 and in float.
TEST_CASE("wgmma attention over a span: one range's queries against another's keys") {
    skip_unless_hopper();
    struct SpanCase {
        const char* what;
        Sizes s;
        Window w;
    };
    const SpanCase cases[] = {
        {"keys wholly before the queries: every key seen (key_lead = Tk)", {2, 100, 128, 2, 2.0f}, {40, 100, 0, 40}},
        {"overlapping ranges, key_lead 17: tiles partly masked", {2, 100, 128, 2, 2.0f}, {37, 90, 20, 70}},
        {"keys in 2 tiles from before the queries, key_lead 90", {1, 260, 128, 2, 2.0f}, {100, 260, 10, 230}},
        {"fewer keys than queries, key_lead 0", {1, 160, 128, 2, 3.0f}, {0, 150, 0, 5}},
    };
    for (const bool documents : {false, true})
        for (const bool float_out : {false, true})
            for (const SpanCase& c : cases) {
                const Sizes& s = c.s;
                const Window& w = c.w;
                CAPTURE(documents, float_out, c.what);
                std::mt19937 rng(4321 + s.T + s.C + w.q_begin);
                const std::vector<floatX> qkv = random_qkv(s, rng);
                const std::vector<floatX> dout = random_floatX(size_t(s.B) * s.T * s.C, 1.0f, rng);
                const SpanInputs in = span_inputs(qkv, s, w);  // as check_spans takes them
                const Reference ref = reference_attention(qkv, dout, s, documents ? &in.doc_starts : nullptr, w);
                const int C = s.C;
                DeviceBuffer<int> first_keys_device(in.first_keys);
                const int* docs = documents ? first_keys_device.ptr + w.q_begin : nullptr;
                const AttentionSpan span = in.span;
                const size_t BT = size_t(s.B) * s.T, q_off = size_t(w.q_begin);
                DeviceBuffer<floatX> q(qkv), kv(in.kv);
                DeviceBuffer<float> lse(BT * s.NH);
                lse.fill_bytes(0xFF);
                std::vector<double> out_window, lse_window, out_ref, lse_ref;
                bool outside_untouched = true, empty_rows_ok = true;
                auto collect = [&](const auto& out_all, const std::vector<float>& lse_all) {
                    for (int b = 0; b < s.B; ++b)
                        for (int t = 0; t < s.T; ++t) {
                            const bool in = w.q_begin <= t && t < w.q_end;
                            for (int c2 = 0; c2 < C; ++c2) {
                                const float got = to_float(out_all[(size_t(b) * s.T + t) * C + c2]);
                                if (!in) {
                                    outside_untouched &= std::isnan(got);
                                    continue;
                                }
                                out_window.push_back(got);
                                out_ref.push_back(ref.out[(size_t(b) * s.T + t) * C + c2]);
                            }
                            for (int hh = 0; hh < s.NH && in; ++hh) {
                                const float got = lse_all[(size_t(b) * s.NH + hh) * s.T + t];
                                const double expected = ref.lse[(size_t(b) * s.NH + hh) * s.T + t];
                                if (expected == -INFINITY) {  // a row that sees none of the keys (documents)
                                    empty_rows_ok &= got == -INFINITY;
                                    continue;
                                }
                                lse_window.push_back(got);
                                lse_ref.push_back(expected);
                            }
                        }
                };
                if (float_out) {
                    DeviceBuffer<float> out(BT * C);
                    out.fill_bytes(0xFF);
                    attention_wgmma_forward(out.ptr + q_off * C, lse.ptr + q_off, q.ptr + q_off * 3 * C, kv.ptr, span, s.B, C, s.NH, 0, docs);
                    CUDA_CHECK(cudaDeviceSynchronize());
                    collect(out.download(), lse.download());
                } else {
                    DeviceBuffer<floatX> out(BT * C);
                    out.fill_bytes(0xFF);
                    attention_wgmma_forward(out.ptr + q_off * C, lse.ptr + q_off, q.ptr + q_off * 3 * C, kv.ptr, span, s.B, C, s.NH, 0, docs);
                    CUDA_CHECK(cudaDeviceSynchronize());
                    collect(out.download(), lse.download());
                }
                // The float output is not rounded, but P V takes P rounded to bf16: the same tolerance.
                CHECK(tensor_error(out_window, out_ref) <= kOutTolerance);
                CHECK(tensor_error(lse_window, lse_ref) <= kLseTolerance);
                CHECK(empty_rows_ok);      // lse -inf (and out 0, within out_window) where no key is seen
                CHECK(outside_untouched);  // rows outside the span's queries keep their NaN
            }
}

TEST_CASE("wgmma attention is bitwise deterministic, also across more emulator threads") {
    skip_unless_hopper();
    const Sizes s{2, 300, 128, 2, 2.0f};
    std::mt19937 rng(99);
    const std::vector<floatX> qkv = random_floatX(size_t(s.B) * s.T * 3 * s.C, 2.0f, rng);
    const Forward first = run_forward(Which::wgmma, qkv, s);
#ifndef __CUDACC__
    const int threads = cuemu::threads();
    cuemu::set_threads(threads == 1 ? 2 : 1);  // blocks now finish in a different order
#endif
    const Forward second = run_forward(Which::wgmma, qkv, s);
#ifndef __CUDACC__
    cuemu::set_threads(threads);
#endif
    CHECK(bitwise_equal(first.out, second.out));
    CHECK(bitwise_equal(first.lse, second.lse));
}

#ifndef __CUDACC__
TEST_CASE("wgmma attention records the FLOPs of the MMAs it runs") {
    // The emulator counts a wgmma m64nNk16 as the N / 8 m16n8k16 MMAs of each of its four warps.
    for (const Sizes& s : {Sizes{1, 1024, 64, 1, 2.0f}, Sizes{2, 300, 128, 2, 2.0f}, Sizes{1, 100, 128, 2, 2.0f}}) {
        CAPTURE(s.B, s.T, s.C, s.NH);
        std::mt19937 rng(91 + s.T);
        const std::vector<floatX> qkv = random_qkv(s, rng);
        launch_record::start(false);
        const uint64_t before = cuemu::mma_count();
        const Forward r = run_forward(Which::wgmma, qkv, s);
        const uint64_t mmas = cuemu::mma_count() - before;
        std::vector<LaunchRecord> records;
        for (const LaunchRecord& record : launch_record::stop())
            if (record.kind == WorkKind::tensor_cores) records.push_back(record);  // not the fills and copies
        REQUIRE(records.size() == 1);
        CHECK(records[0].name.rfind("attention_wgmma_forward_kernel", 0) == 0);
        CHECK(mmas > 0);
        CHECK(records[0].flops == 2.0 * 16 * 8 * 16 * double(mmas));
        if (s.T == 1024) {
            // By hand: a product over the causal half is T^2 hs FLOPs (FlashAttention's 2 T^2 hs / 2); S takes
            // whole 128-key tiles, 64 rows a warpgroup, (1 + 128 / T); P V the 16-key slices up to each
            // warpgroup's last row's last key, (1 + 64 / T).
            const double product = double(s.T) * s.T * 64;
            CHECK(records[0].flops == Approx(product * (1 + 128.0 / s.T) + product * (1 + 64.0 / s.T)).epsilon(1e-12));
        }
        CHECK(std::all_of(r.out.begin(), r.out.end(), [](floatX x) { return std::isfinite(to_float(x)); }));
    }
}
#endif

TEST_CASE("attention_wgmma_requirements takes head size 64 and names what it cannot do") {
    CHECK(attention_wgmma_requirements(8, 1024, 768, 12) == "");
    CHECK(attention_wgmma_requirements(1, 1024, 1600, 25) == "");
    CHECK(attention_wgmma_requirements(1, 1024, 768, 6).find("head size 64, not 128") != std::string::npos);
    CHECK(attention_wgmma_requirements(1, 1024, 768, 24).find("head size 64, not 32") != std::string::npos);
}
