// Tensor-core causal flash attention (kernels/attention_tc.cuh) against a plain double-precision
// reference that builds the full T x T softmax, and against the SIMT kernels (attention.cuh):
// out and lse forward; dq, dk, dv as the analytic gradient of sum(out * G) for a random G; then
// with document masks (packed rows), and fully masked tiles skipped.
// precision: BF16 only (the kernels take BF16 operands; the Makefile and test/tests.cmake read this
// line and build no FP32 twin; the FP32 build's refusal is tested in test_kernel_attention.cu).
#include "test_util.h"

#include "attention_reference.h"

#include "kernels/attention_tc.cuh"
#include "kernels/matmul.cuh"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>

namespace {

static_assert(std::is_same_v<floatX, __nv_bfloat16>, "the tensor-core kernels take BF16 operands: build in BF16");

using namespace attention_reference;

// Relative to each tensor's max |ref| (measured errors beside the causal test): out and dv, lse, dq and dk.
constexpr double kOutTolerance = 0x1p-8 + 1e-3, kLseTolerance = 1e-6, kGradTolerance = 1e-2;

// out, lse, dq, dk and dv of the tensor-core kernels against the reference, within the tolerances.
void check_against_reference(const Results& tc, const Reference& ref, int C) {
    const auto grad = split_qkv(tc.dqkv, C);
    const auto grad_ref = split_qkv(ref.dqkv, C);
    CHECK(tensor_error(tc.out, ref.out) <= kOutTolerance);
    CHECK(tensor_error(tc.lse, ref.lse) <= kLseTolerance);
    CHECK(tensor_error(grad[0], grad_ref[0]) <= kGradTolerance);
    CHECK(tensor_error(grad[1], grad_ref[1]) <= kGradTolerance);
    CHECK(tensor_error(grad[2], grad_ref[2]) <= kOutTolerance);
}

// Both backward paths: the split dK/dV and dQ kernels, and the fused kernel.
constexpr Kernels kTensorCoreKernels[] = {Kernels::tensor_core, Kernels::tensor_core_fused};

// Sizes with documents (each row's end-of-text positions; none: plain causal) and its random inputs.
struct SizesAndDocuments {
    Sizes s;
    std::vector<std::vector<int>> eots;
};
struct CaseInputs {
    std::vector<floatX> qkv, dout;
    std::vector<int> docs;  // doc_start per position, empty without documents
    const std::vector<int>* doc_start() const { return docs.empty() ? nullptr : &docs; }
};
CaseInputs inputs_of(const SizesAndDocuments& c, uint32_t seed) {
    const Sizes& s = c.s;
    std::mt19937 rng(seed + s.T + s.C);
    CaseInputs in;
    in.qkv = random_qkv(s, rng);
    in.dout = random_floatX(size_t(s.B) * s.T * s.C, 1.0f, rng);
    if (!c.eots.empty()) in.docs = packed_rows(s.T, c.eots);
    return in;
}

}  // namespace

TEST_CASE("tensor-core attention matches a double reference and the SIMT kernels") {
    const Sizes cases[] = {
        {2, 37, 32, 2, 3.0f},     // hs 16; T = 37: one partial query block, a partial key tile
        {1, 100, 64, 2, 2.0f},    // hs 32; T = 100: two query blocks, the second partial
        {2, 100, 128, 2, 2.0f},   // hs 64 (GPT-2), B * NH = 4
        {1, 64, 128, 2, 4.0f},    // T a multiple of the tile; very sharp rows
        {3, 1, 128, 2, 2.0f},     // T = 1: one key per row
        {1, 19, 1600, 25, 2.0f},  // GPT-2 1.5B heads: NH 25, hs 64
        {1, 200, 64, 1, 2.0f},    // hs 64, 4 query blocks: long online-softmax chains
        {1, 70, 256, 2, 1.5f},    // hs 128: 32-row streamed tiles in backward, > 48 KB of shared memory
        {1, 150, 128, 1, 2.0f},   // hs 128, 3 query blocks, 5 streamed 32-row tiles
    };
    for (const Sizes& s : cases) {
        CAPTURE(s.B, s.T, s.C, s.NH);
        std::mt19937 rng(4321 + s.T * 7 + s.C);
        const std::vector<floatX> qkv = random_qkv(s, rng);
        const std::vector<floatX> dout = random_floatX(size_t(s.B) * s.T * s.C, 1.0f, rng);

        const Reference ref = reference_attention(qkv, dout, s);
        const Results simt = run_attention(Kernels::simt, qkv, dout, s);
        const auto grad_simt = split_qkv(simt.dqkv, s.C);
        for (const Kernels which : kTensorCoreKernels) {
            CAPTURE(kernels_name(which));
            const Results tc = run_attention(which, qkv, dout, s);
            const auto grad = split_qkv(tc.dqkv, s.C);

            // Errors relative to each tensor's max |ref|, measured over these cases (the same under every
            // schedule order): out 2.8e-3, lse 1.4e-7, dq 5.2e-3, dk 5.6e-3, dv 3.6e-3 (SIMT kernels: out
            // 2.0e-3, dq 3.6e-3, dk 4.6e-3, dv 2.9e-3). out and dqkv are rounded to bf16 (2^-8 = 3.9e-3 of
            // an element at most); dq and dk also inherit the rounding of out through D = rowsum(dO * out);
            // beyond that the tensor cores take P and dS rounded to bf16 (2^-9 relative, averaging out over
            // a row). lse stays float: bf16 products are exact and accumulate in FP32.
            check_against_reference(tc, ref, s.C);
            // Against the SIMT kernels, each within the tolerances above of the exact result; measured
            // out 4.0e-3 (neighbouring bf16 values), lse 1.6e-7, dq 7.4e-3, dk 5.7e-3, dv 5.3e-3.
            CHECK(tensor_error(tc.out, simt.out) <= 2 * kOutTolerance);
            CHECK(tensor_error(tc.lse, simt.lse) <= 2 * kLseTolerance);
            for (int part = 0; part < 3; ++part) CHECK(tensor_error(grad[part], grad_simt[part]) <= 2 * kGradTolerance);
        }
    }
}

TEST_CASE("document-masked tensor-core attention matches a double reference with an explicit mask") {
    // Tolerances of the causal test above. Measured over these cases (the same under every schedule):
    // out 3.0e-3, lse 1.7e-7, dq 4.0e-3, dk 5.5e-3, dv 3.9e-3; against the SIMT kernels out 3.9e-3,
    // lse 1.8e-7, dq 5.7e-3, dk 7.0e-3, dv 7.7e-3. Where the exact gradient is zero (every query
    // seeing only itself: dS = P (dP - D) with P = 1 and D = dP), the reference's errors are absolute
    // (both kernels within 2.4e-7) and the two kernels' rounding noise is not compared.
    for (const DocumentCase& c : document_cases()) {
        const Sizes& s = c.s;
        if (attention_tc_requirements(s.B, s.T, s.C, s.NH) != "") continue;  // hs 16, 32, 64, 128 only
        CAPTURE(c.what, s.B, s.T, s.C, s.NH);
        std::mt19937 rng(888 + s.T * 7 + s.C);
        const std::vector<floatX> qkv = random_qkv(s, rng);
        const std::vector<floatX> dout = random_floatX(size_t(s.B) * s.T * s.C, 1.0f, rng);
        const std::vector<int> docs = packed_rows(s.T, c.eots);

        const Reference ref = reference_attention(qkv, dout, s, &docs);
        const Results simt = run_attention(Kernels::simt, qkv, dout, s, &docs);
        const auto grad_simt = split_qkv(simt.dqkv, s.C);
        const auto grad_ref = split_qkv(ref.dqkv, s.C);
        for (const Kernels which : kTensorCoreKernels) {
            CAPTURE(kernels_name(which));
            const Results tc = run_attention(which, qkv, dout, s, &docs);
            const auto grad = split_qkv(tc.dqkv, s.C);
            check_against_reference(tc, ref, s.C);
            CHECK(tensor_error(tc.out, simt.out) <= 2 * kOutTolerance);
            CHECK(tensor_error(tc.lse, simt.lse) <= 2 * kLseTolerance);
            for (int part = 0; part < 3; ++part) {
                const bool zero = std::all_of(grad_ref[part].begin(), grad_ref[part].end(), [](double g) { return g == 0.0; });
                if (!zero) CHECK(tensor_error(grad[part], grad_simt[part]) <= 2 * kGradTolerance);
            }
            // The mask matters in every case: plain causal attention is far from it.
            CHECK(tensor_error(tc.out, reference_attention(qkv, dout, s).out).value > 10 * kOutTolerance);
        }
    }
}

// As for the SIMT kernels (test_kernel_attention.cu): NaN planted in one document reaches no result
// of the other, so key tiles before a block's documents (forward, dQ) and query tiles after a key
// block's (dK/dV) are skipped, not masked. hs 64 streams 64-row tiles, hs 128 32-row ones in backward.
TEST_CASE("tensor-core document masking skips fully masked tiles: NaN in one document stays out of the other") {
    for (const Sizes& s : {Sizes{1, 128, 128, 2, 2.0f}, Sizes{1, 128, 256, 2, 1.5f}}) {
        const std::vector<int> docs = packed_rows(s.T, {{64}});  // documents [0, 64) and [64, 128): tile edges
        for (const bool poison_first : {true, false}) {
            CAPTURE(s.C, poison_first);
            std::mt19937 rng(32);
            std::vector<floatX> qkv = random_qkv(s, rng), dout = random_floatX(size_t(s.T) * s.C, 1.0f, rng);
            const int from = poison_first ? 0 : 64, kept = poison_first ? 64 : 0;
            poison_positions(qkv, dout, s, 0, from, from + 64);
            const Reference ref = reference_attention(qkv, dout, s, &docs);
            for (const Kernels which : kTensorCoreKernels) {
                CAPTURE(kernels_name(which));
                const Results got = run_attention(which, qkv, dout, s, &docs);
                auto kept_rows = [&](const auto& x) { return positions_of(x, s, s.C, 0, kept, kept + 64); };
                CHECK(tensor_error(kept_rows(got.out), kept_rows(ref.out)) <= 0x1p-8 + 1e-3);
                CHECK(tensor_error(lse_positions_of(got.lse, s, 0, kept, kept + 64),
                                   lse_positions_of(ref.lse, s, 0, kept, kept + 64)) <= 1e-6);
                const auto grad = split_qkv(got.dqkv, s.C);
                const auto grad_ref = split_qkv(ref.dqkv, s.C);
                for (int part = 0; part < 3; ++part) {
                    CAPTURE(part);
                    CHECK(tensor_error(kept_rows(grad[part]), kept_rows(grad_ref[part])) <= 1e-2);
                }
            }
        }
    }
}

TEST_CASE("tensor-core attention is bitwise deterministic, also across more emulator threads") {
    const Sizes s{2, 70, 128, 2, 2.0f};
    std::mt19937 rng(99);
    const std::vector<floatX> qkv = random_floatX(size_t(s.B) * s.T * 3 * s.C, 2.0f, rng);
    const std::vector<floatX> dout = random_floatX(size_t(s.B) * s.T * s.C, 1.0f, rng);
    for (const Kernels which : kTensorCoreKernels) {
        CAPTURE(kernels_name(which));
        const Results first = run_attention(which, qkv, dout, s);
#ifndef __CUDACC__
        const int threads = cuemu::threads();
        cuemu::set_threads(threads == 1 ? 2 : 1);  // blocks now finish in a different order
#endif
        const Results second = run_attention(which, qkv, dout, s);
#ifndef __CUDACC__
        cuemu::set_threads(threads);
#endif
        CHECK(bitwise_equal(first.out, second.out));
        CHECK(bitwise_equal(first.lse, second.lse));
        CHECK(bitwise_equal(first.dqkv, second.dqkv));
    }
}

#ifndef __CUDACC__
// The emulator runs each warp tile product (kernels/tensor_core.cuh) as one collective unless
// CUEMU_TENSOR_CORE=instructions; both ways must give the same bits: every head size, partial tiles,
// documents (the fused dQ product's skipped key blocks), both backward paths.
TEST_CASE("emulator: the tensor-core kernels give the same bits with tile collectives as with instructions") {
    const SizesAndDocuments cases[] = {
        {{1, 37, 32, 2, 3.0f}, {}},                    // hs 16
        {{1, 100, 64, 2, 2.0f}, {{30, 60}}},           // hs 32, documents
        {{2, 150, 128, 2, 2.0f}, {{20, 140}, {70}}},   // hs 64, documents across 128-key blocks
        {{1, 70, 256, 2, 1.5f}, {}},                   // hs 128
    };
    const cuemu::TensorCoreMode mode = cuemu::tensor_core_mode();
    for (const SizesAndDocuments& c : cases) {
        const Sizes& s = c.s;
        CAPTURE(s.B, s.T, s.C, s.NH, c.eots.size());
        const CaseInputs in = inputs_of(c, 777);
        const std::vector<floatX>&qkv = in.qkv, &dout = in.dout;
        const std::vector<int>* doc_start = in.doc_start();
        for (const Kernels which : kTensorCoreKernels) {
            CAPTURE(kernels_name(which));
            cuemu::set_tensor_core_mode(cuemu::TensorCoreMode::tiles);
            const Results tiles = run_attention(which, qkv, dout, s, doc_start);
            cuemu::set_tensor_core_mode(cuemu::TensorCoreMode::instructions);
            const Results instructions = run_attention(which, qkv, dout, s, doc_start);
            CHECK(bitwise_equal(tiles.out, instructions.out));
            CHECK(bitwise_equal(tiles.lse, instructions.lse));
            CHECK(bitwise_equal(tiles.dqkv, instructions.dqkv));
        }
    }
    cuemu::set_tensor_core_mode(mode);
}

// The FLOPs the tensor-core kernels record for the roofline (KernelCost: the tiles a warp computes and,
// on the tiles the causal mask cuts, the live 16-blocks it passes its products) are the MMAs the
// emulator runs (tile collectives and instructions count alike), exactly: the forward, the split
// backward and the fused one (whole heads, and split with its combining kernel, which runs none).
// T = 1024 at hs 64 (every diagonal tile of the GPT-2 shape), T past a multiple of the tiles, every
// head size. A count that charged whole diagonal tiles would be 3-6% over at T = 1024; at hs 64 over T =
// 1024 each kernel's count is also held to its closed form.
TEST_CASE("tensor-core attention records the FLOPs of the MMAs it runs") {
    const Sizes cases[] = {{1, 1024, 64, 1, 2.0f}, {1, 300, 128, 1, 2.0f}, {2, 200, 64, 2, 2.0f}, {1, 100, 32, 2, 3.0f}};
    for (const Sizes& s : cases) {
        CAPTURE(s.B, s.T, s.C, s.NH);
        std::mt19937 rng(91 + s.T);
        const std::vector<floatX> qkv = random_qkv(s, rng), dout = random_floatX(size_t(s.B) * s.T * s.C, 1.0f, rng);
        // (kind, wave slots): a wave one block larger than the heads splits them all where a head has
        // 2 or more pairs of key blocks (T > 256).
        const int split_slots = s.B * s.NH + 1;
        const bool splits = s.T > 256;
        CHECK(attention_tc_detail::fused_grid_plan(s.B, s.NH, s.T, false, split_slots).split_rows == (splits ? s.B : 0));
        const std::pair<Kernels, int> runs[] = {{Kernels::tensor_core, attention_tc_detail::kFusedWaveSlots},
                                                {Kernels::tensor_core_fused, attention_tc_detail::kFusedWaveSlots},
                                                {Kernels::tensor_core_fused, split_slots}};
        for (const auto& [which, slots] : runs) {
            CAPTURE(kernels_name(which), slots);
            launch_record::start(false);
            const uint64_t before = cuemu::mma_count();
            const Results r = run_attention(which, qkv, dout, s, nullptr, 0, slots);
            const uint64_t mmas = cuemu::mma_count() - before;
            double recorded = 0;
            int tensor_launches = 0;
            const std::vector<LaunchRecord> records = launch_record::stop();
            for (const LaunchRecord& record : records)
                if (record.kind == WorkKind::tensor_cores) recorded += record.flops, ++tensor_launches;
            CHECK(tensor_launches == (which == Kernels::tensor_core ? 3 : 2));  // forward, then dK/dV and dQ, or fused
            CHECK(mmas > 0);
            CHECK(recorded == 2.0 * 16 * 8 * 16 * double(mmas));
            if (s.T == 1024) {
                // hs 64, by hand: a product over the causal half is 2 T^2 hs / 2 FLOPs (FlashAttention's
                // count), and the live 16-blocks of the diagonal add 32 keys a row for the forward's 32-row
                // warps, (1 + 32 / T), and one 16 x 16 block a block row for the backward's, (1 + 16 / T).
                const double product = double(s.T) * s.T * 64, forward = 1 + 32.0 / s.T, backward = 1 + 16.0 / s.T;
                for (const LaunchRecord& record : records) {
                    CAPTURE(record.name);
                    const auto is = [&](const char* name) { return record.name.rfind(name, 0) == 0; };
                    if (is("attention_tc_forward_kernel")) CHECK(record.flops == Approx(2 * product * forward).epsilon(1e-12));
                    if (is("attention_tc_backward_dkdv_kernel")) CHECK(record.flops == Approx(4 * product * backward).epsilon(1e-12));
                    if (is("attention_tc_backward_dq_kernel")) CHECK(record.flops == Approx(3 * product * backward).epsilon(1e-12));
                    if (is("attention_tc_backward_fused_kernel")) CHECK(record.flops == Approx(5 * product * backward).epsilon(1e-12));
                }
            }
            CHECK(std::all_of(r.dqkv.begin(), r.dqkv.end(), [](floatX x) { return std::isfinite(to_float(x)); }));
        }
    }
}
#endif

// The fused backward computes each tile pair's S^T, P, dP^T and dS^T as the dK/dV kernel does and adds
// them to dK and dV in the same query-tile order (a warp skips the tiles its keys do not reach, which
// the split kernels either skip too or add as exact zeros), so dK and dV are the split kernels' values
// exactly. dQ is summed in another order (per 128-key block, then across blocks in float), so a few
// elements may round to a neighbouring bf16: measured 5.8e-7 of max |dq| at most (documents; 1.5e-7
// at T = 300 without; 0 for the other cases), under every schedule order. A missing or repeated key
// block's share is of the order of dq itself. T past 2 and 3 key blocks of 128, partial last blocks,
// every head size, documents across key-block edges.
TEST_CASE("the fused tensor-core backward gives the split kernels' dK and dV exactly and their dQ to rounding") {
    const SizesAndDocuments cases[] = {
        {{1, 300, 128, 2, 2.0f}, {}},                  // hs 64: 3 key blocks, the last partial
        {{2, 256, 64, 2, 2.0f}, {}},                   // hs 32: 2 whole key blocks
        {{1, 150, 32, 2, 3.0f}, {}},                   // hs 16
        {{1, 200, 256, 2, 1.5f}, {}},                  // hs 128: 32-query tiles, dQ in two column parts
        {{2, 300, 128, 2, 2.0f}, {{127, 128, 200}, {5, 250}}},  // documents across the 128-key edges
        {{1, 1024, 128, 1, 2.0f}, {}},                 // GPT-2's T: 8 key blocks, the K/V buffers alternating
        {{1, 600, 256, 2, 1.5f}, {}},                  // hs 128 over 5 key blocks (one K/V buffer)
    };
    for (const SizesAndDocuments& c : cases) {
        const Sizes& s = c.s;
        CAPTURE(s.B, s.T, s.C, s.NH, c.eots.size());
        const CaseInputs in = inputs_of(c, 2024);
        const std::vector<floatX>&qkv = in.qkv, &dout = in.dout;
        const std::vector<int>* doc_start = in.doc_start();
        const Results split = run_attention(Kernels::tensor_core, qkv, dout, s, doc_start);
        const Results fused = run_attention(Kernels::tensor_core_fused, qkv, dout, s, doc_start);
        const auto grad_split = split_qkv(split.dqkv, s.C), grad_fused = split_qkv(fused.dqkv, s.C);
        CHECK(tensor_error(grad_fused[1], grad_split[1], ErrorScale::absolute).value == 0.0);
        CHECK(tensor_error(grad_fused[2], grad_split[2], ErrorScale::absolute).value == 0.0);
        // Up to 300 keys, 1e-5 (measured above). Past them the longer sums in another order can round an
        // element to its bf16 neighbour: one bf16 unit of the element, at most 2^-8 of max |dq|; measured
        // 8.2e-4 at T = 1024 and 1.5e-4 at T = 600 (hs 128).
        CHECK(tensor_error(grad_fused[0], grad_split[0]) <= (s.T <= 300 ? 1e-5 : 0x1p-8));
        const Reference ref = reference_attention(qkv, dout, s, doc_start);
        CHECK(tensor_error(grad_fused[0], split_qkv(ref.dqkv, s.C)[0]) <= kGradTolerance);
    }
}

// The fused backward's grid plan (attention_tc_detail::fused_grid_plan): the rows of the batch holding
// the heads past the last whole wave of 132 are split, a group per pair of key blocks, when the groups'
// rounds end the grid sooner; never with documents, below 2 pairs or above kFusedMaxGroups.
TEST_CASE("the fused backward splits the heads of its last wave where that ends its grid sooner") {
    const auto plan = [](int B, int NH, int T, bool documents = false) {
        const attention_tc_detail::FusedGrid g = attention_tc_detail::fused_grid_plan(B, NH, T, documents);
        return std::array<int, 3>{g.whole_rows, g.split_rows, g.groups};
    };
    using Plan = std::array<int, 3>;
    CHECK(attention_tc_detail::kFusedWaveSlots == 132);  // an H100's SMs, one block each
    // d48, B=16: 400 heads, 4 past 3 waves: the last row's 25 heads as 100 quarter blocks, 3.25 waves for
    // the work of 3.03 (4 before).
    CHECK(plan(16, 25, 1024) == Plan{15, 1, 4});
    // d48, B=8: 200 heads, 68 past one wave: 3 rows as 300 quarter blocks in 3 rounds, 1.75 waves (2).
    CHECK(plan(8, 25, 1024) == Plan{5, 3, 4});
    // d12, B=64: 768 heads, 108 past 5 waves: their 9 rows' 432 quarter blocks take 4 rounds, a whole
    // wave, so the heads stay whole.
    CHECK(plan(64, 12, 1024) == Plan{64, 0, 1});
    // d12, B=4: 48 heads, under a wave: all split, 192 quarter blocks in 2 rounds.
    CHECK(plan(4, 12, 1024) == Plan{0, 4, 4});
    // T = 600: 5 key blocks, 3 groups (the middle block alone); T = 256: one pair, nothing to split.
    CHECK(plan(4, 12, 600) == Plan{0, 4, 3});
    CHECK(plan(4, 12, 256) == Plan{4, 0, 1});
    // Documents, 8 pairs at T = 2048 (over kFusedMaxGroups), and 132 heads (one whole wave): whole.
    CHECK(plan(4, 12, 1024, true) == Plan{4, 0, 1});
    CHECK(plan(4, 12, 2048) == Plan{4, 0, 1});
    CHECK(plan(11, 12, 1024) == Plan{11, 0, 1});
}

// A split head's groups compute each key block's tile pairs as the whole head does, in the same order,
// so dK and dV are the whole heads' bit for bit; dQ's float sums are added per group and then over the
// groups (the combining kernel), another order, so an element may round to a neighbouring bf16: measured
// 2.2e-9 of max |dq| at T = 1024, 1.7e-9 at T = 600 and 0 at T = 300 (the same under every schedule
// order); bound: one bf16 unit of the largest element (2^-8), as for the fused against the split
// kernels. A missing group, or one added twice, is of the order of dq itself. The whole heads of a grid
// with split ones are the all-whole grid's bit for bit. Fewer blocks a wave (wave_slots) make these small
// grids split their last row as a large grid splits its last wave's: 8 key blocks (4 groups), 5 (3, the
// middle block alone, one K/V buffer at hs 128), 3 (2).
TEST_CASE("the fused backward's split heads give the whole heads' dK and dV exactly and their dQ to rounding") {
    struct Case {
        Sizes s;
        int wave_slots;
        std::array<int, 3> plan;
    };
    const Case cases[] = {
        {{2, 1024, 128, 2, 2.0f}, 3, {1, 1, 4}},  // hs 64 at GPT-2's T
        {{2, 600, 256, 2, 1.5f}, 3, {1, 1, 3}},   // hs 128
        {{3, 300, 64, 2, 2.0f}, 4, {2, 1, 2}},    // hs 32
        {{3, 300, 32, 2, 3.0f}, 4, {2, 1, 2}},    // hs 16
    };
    for (const Case& c : cases) {
        const Sizes& s = c.s;
        CAPTURE(s.B, s.T, s.C, s.NH, c.wave_slots);
        const attention_tc_detail::FusedGrid g = attention_tc_detail::fused_grid_plan(s.B, s.NH, s.T, false, c.wave_slots);
        REQUIRE(std::array<int, 3>{g.whole_rows, g.split_rows, g.groups} == c.plan);
        REQUIRE(attention_tc_detail::fused_grid_plan(s.B, s.NH, s.T, false, 1).split_rows == 0);  // all whole
        const CaseInputs in = inputs_of({s, {}}, 4096);
        const Results whole = run_attention(Kernels::tensor_core_fused, in.qkv, in.dout, s, nullptr, 0, 1);
        const Results mixed = run_attention(Kernels::tensor_core_fused, in.qkv, in.dout, s, nullptr, 0, c.wave_slots);
        CHECK(bitwise_equal(mixed.out, whole.out));
        const auto grad_whole = split_qkv(whole.dqkv, s.C), grad_mixed = split_qkv(mixed.dqkv, s.C);
        CHECK(tensor_error(grad_mixed[1], grad_whole[1], ErrorScale::absolute).value == 0.0);
        CHECK(tensor_error(grad_mixed[2], grad_whole[2], ErrorScale::absolute).value == 0.0);
        const size_t whole_elements = size_t(g.whole_rows) * s.T * 3 * s.C;  // the rows of whole heads
        const auto whole_rows_of = [&](const Results& r) {
            return std::vector<floatX>(r.dqkv.begin(), r.dqkv.begin() + long(whole_elements));
        };
        CHECK(bitwise_equal(whole_rows_of(mixed), whole_rows_of(whole)));
        const TensorError dq_error = tensor_error(grad_mixed[0], grad_whole[0]);
        INFO("split heads' dq against the whole heads': " << dq_error << " of max |dq|");
        CHECK(dq_error <= 0x1p-8);  // the whole heads' dQ: against the double reference in the test above
    }
}

// Spans (context parallelism's ring steps) against the windowed reference, as for the SIMT kernels
// (attention_reference.h, check_spans): bf16 results written and accumulated, and the FP32 ones the ring
// sums; the causal test's tolerances.
TEST_CASE("tensor-core attention over a span: one range's queries against another's keys, written or accumulated") {
    const SpanTolerances tolerances{kOutTolerance, kLseTolerance, kGradTolerance};
    check_spans<floatX>(Kernels::tensor_core, tolerances);
    check_spans<float>(Kernels::tensor_core, tolerances);
}

// The qkv bias sums (qkv_bias_sums) of both backward paths: each block's column sums of the dqkv rows it
// writes (split: 64-row blocks; fused: 128-key blocks, dQ's rows summed by the warps that write them),
// added by bias_grad_add_partials onto a bias gradient that is not zero, against double sums of the dqkv
// the same call wrote; that dqkv equal bit for bit to a call without the sums; the partial rows written
// whole (the scratch starts as NaN). Head sizes 16-128 (one and two tiles a thread group's column sums
// cover; the fused kernel's dQ column parts of 8 to 32), T not a multiple of either block, documents.
TEST_CASE("the tensor-core backward, split and fused, sums qkv's bias gradient from the rows it writes") {
    const SizesAndDocuments cases[] = {
        {{2, 37, 32, 2, 3.0f}, {}},     // hs 16, one partial block
        {{1, 100, 64, 2, 2.0f}, {}},    // hs 32, the second block partial
        {{3, 128, 128, 2, 2.0f}, {}},   // hs 64 (GPT-2), whole blocks
        {{1, 150, 256, 2, 1.5f}, {}},   // hs 128
        {{2, 100, 128, 2, 2.0f}, {{30, 61}, {99}}},  // documents
        {{1, 300, 128, 2, 2.0f}, {{70, 200}}},       // three fused chunks, the last partial, documents across them
        {{2, 300, 128, 2, 2.0f}, {}},                // the fused kernel's heads all split (4 heads: under a wave)
    };
    // The fused kernel also with 4 blocks a wave (attention_tc_detail::fused_grid_plan): at B = 3, T = 300
    // one row of split heads after two whole ones, the combining kernel's sums beside the whole heads'.
    const SizesAndDocuments mixed{{3, 300, 128, 2, 2.0f}, {}};
    struct Run {
        AttentionTcBackward how;
        const SizesAndDocuments* c;
        int wave_slots;
    };
    std::vector<Run> runs;
    for (const AttentionTcBackward how : {AttentionTcBackward::split, AttentionTcBackward::fused})
        for (const SizesAndDocuments& c : cases) runs.push_back({how, &c, attention_tc_detail::kFusedWaveSlots});
    runs.push_back({AttentionTcBackward::fused, &mixed, 4});
    REQUIRE(attention_tc_detail::fused_grid_plan(3, 2, 300, false, 4).split_rows == 1);
    REQUIRE(attention_tc_detail::fused_grid_plan(2, 2, 300, false).whole_rows == 0);
    for (const Run& run : runs) {
        const AttentionTcBackward how = run.how;
        const SizesAndDocuments& c = *run.c;
        const Sizes& s = c.s;
        const bool fused_kernel = how == AttentionTcBackward::fused;
        CAPTURE(fused_kernel, s.B, s.T, s.C, s.NH, c.eots.size(), run.wave_slots);
        const CaseInputs in = inputs_of(c, 77);
        const size_t BT = size_t(s.B) * s.T, OC = 3 * size_t(s.C);
        const int chunks = attention_tc_qkv_bias_chunks(s.B, s.T, how), block_rows = fused_kernel ? 128 : 64;
        CHECK(chunks == s.B * ((s.T + block_rows - 1) / block_rows));
        std::mt19937 rng(s.T);
        const std::vector<floatX> dbias_start = random_floatX(OC, 1.0f, rng);
        DeviceBuffer<floatX> qkv(in.qkv), dout(in.dout), out(BT * s.C), dqkv(BT * OC), dqkv_plain(BT * OC), dbias(dbias_start);
        DeviceBuffer<float> lse(BT * s.NH), scratch(attention_tc_backward_scratch_floats(s.B, s.T, s.C, s.NH, how, true, run.wave_slots)),
            sum_scratch(bias_grad_add_partials_scratch_floats(chunks, int(OC)));
        DeviceBuffer<int> doc_start(in.docs.empty() ? std::vector<int>(1) : in.docs);
        const int* docs = in.docs.empty() ? nullptr : doc_start.ptr;
        attention_tc_forward(out.ptr, lse.ptr, qkv.ptr, s.B, s.T, s.C, s.NH, 0, docs);
        scratch.fill_bytes(0xFF);
        attention_tc_backward(dqkv_plain.ptr, scratch.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, s.B, s.T, s.C, s.NH, 0, docs,
                              how, false, run.wave_slots);
        scratch.fill_bytes(0xFF);
        const float* partials = attention_tc_backward(dqkv.ptr, scratch.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, s.B, s.T,
                                                      s.C, s.NH, 0, docs, how, true, run.wave_slots);
        REQUIRE(partials == scratch.ptr + attention_tc_qkv_bias_offset(s.B, s.T, s.C, s.NH, how));
        sum_scratch.fill_bytes(0xFF);
        bias_grad_add_partials(dbias.ptr, partials, chunks, int(OC), sum_scratch.ptr, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<floatX> grads = dqkv.download(), got = dbias.download();
        CHECK(bitwise_equal(grads, dqkv_plain.download()));
        // Float sums of a block's rows in groups (split: 64 rows; fused: 128 keys in groups of 8, dQ's
        // 16-row warp sums over at most 4 query tiles and 4 warps), the groups, the chunks in rows of up
        // to 256 and those rows, each a chain of float adds (at most 64 + chunks + 3 roundings of 2^-24
        // of the sum of magnitudes), then one bf16 rounding.
        int worst = -1;
        double worst_ratio = 0;
        for (size_t o = 0; o < OC; ++o) {
            double sum = to_float(dbias_start[o]), magnitude = std::fabs(sum);
            for (size_t r = 0; r < BT; ++r) {
                const double v = to_float(grads[r * OC + o]);
                sum += v;
                magnitude += std::fabs(v);
            }
            const double bound = (64 + chunks + 3) * 0x1p-24 * magnitude + 0x1p-8 * std::fabs(sum) + 1e-30;
            const double ratio = std::fabs(to_float(got[o]) - sum) / bound;
            if (new_worst(ratio, worst_ratio)) worst_ratio = ratio, worst = int(o);  // NaN counts as worst
        }
        INFO("worst column " << worst << ": " << worst_ratio << " of its bound");
        CHECK(worst_ratio <= 1.0);
    }
    // Where the sums cannot come from the staged rows: refused, naming why.
    const Sizes s{1, 64, 128, 2, 2.0f};
    DeviceBuffer<floatX> buffer(size_t(64) * 3 * 128);
    DeviceBuffer<float> scratch(attention_tc_backward_scratch_floats(1, 64, 128, 2, AttentionTcBackward::split, true));
    const std::string accumulated = error_of([&] {
        attention_tc_backward<floatX>(buffer.ptr, 3 * s.C, buffer.ptr + s.C, 3 * s.C, buffer.ptr, buffer.ptr, buffer.ptr + s.C,
                                      scratch.ptr, scratch.ptr, causal_span(s.T, s.C), s.B, s.C, s.NH, 0, nullptr, true, nullptr,
                                      scratch.ptr);
    });
    CHECK(accumulated.find("the qkv bias sums need bf16 gradients written, not accumulated") != std::string::npos);
    const std::string other_layout = error_of([&] {  // k and v apart from q (a ring step's layout)
        attention_tc_backward<floatX>(buffer.ptr, 3 * s.C, buffer.ptr + s.C, 2 * s.C, buffer.ptr, buffer.ptr, buffer.ptr + s.C,
                                      scratch.ptr, scratch.ptr, causal_span(s.T, s.C), s.B, s.C, s.NH, 0, nullptr, false, nullptr,
                                      scratch.ptr);
    });
    CHECK(other_layout.find("the qkv bias sums need dqkv's rows (B, T, 3C)") != std::string::npos);
}

TEST_CASE("attention_tc_requirements accepts GPT-2 shapes and names what it cannot do") {
    CHECK(attention_tc_requirements(4, 1024, 768, 12) == "");   // 124M: hs 64
    CHECK(attention_tc_requirements(1, 1024, 1600, 25) == "");  // 1.5B: hs 64, 25 heads
    CHECK(attention_tc_requirements(1, 100, 2048, 16) == "");   // hs 128
    CHECK(attention_tc_requirements(2, 37, 32, 2) == "");       // hs 16
    CHECK(attention_tc_requirements(1, 1, 96, 3) == "");        // hs 32
    CHECK(attention_tc_requirements(1, 64, 80, 2) ==
          "attention tc: head size C/NH = 40 is not supported (16, 32, 64 or 128)");
    CHECK(attention_tc_requirements(1, 64, 512, 2) ==
          "attention tc: head size C/NH = 256 is not supported (16, 32, 64 or 128)");
    CHECK(attention_tc_requirements(1, 64, 100, 3) == "attention tc: C = 100 is not divisible by NH = 3");
    CHECK(attention_tc_requirements(1, 0, 768, 12) ==
          "attention tc: B = 1, T = 0, C = 768 and NH = 12 must be positive");
}
