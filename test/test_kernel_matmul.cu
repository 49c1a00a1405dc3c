// matmul (kernels/matmul.cuh) against plain double loops on the same floatX-rounded inputs:
// forward with and without bias, with the fused GELU (pre_gelu and out), backward dinp (plain and
// through DGELU, overwritten), dweight and dbias accumulated onto non-zero gradients twice,
// determinism, and the size requirements. Sizes hit partial column blocks and row chunks of the
// bias-gradient kernel (OC = 288, 96: not multiples of its 256/128 columns; N = 111, 7).
#include "test_util.h"

#include "kernels/matmul.cuh"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr double kFp32Unit = 0x1p-24;  // unit roundoff of FP32 (24-bit significand)
// Results are rounded once to floatX (nearest even): relative error up to BF16's unit roundoff
// 2^-8 (8-bit significand); none in the FP32 build.
double output_unit() {
    if constexpr (std::is_same_v<floatX, float>) return 0.0;
    else return 0x1p-8;
}
// cuBLASLt's GELU and GELU' in FP32: the emulator (std::tanh) stays within 16 FP32 units of |x|
// of the double formulas (measured in test_cublaslt); a GPU may use tanh.approx (~2^-11 relative).
#ifdef __CUDACC__
constexpr double kActivationTolerance = std::is_same_v<floatX, float> ? 0x1p-11 : kBf16EpilogueGeluTolerance;
#else
constexpr double kActivationTolerance = 16 * kFp32Unit;
#endif
// A BF16 output on a GPU: cuBLAS's GELU epilogues and its beta C addition are less exact than in FP32
// (test_util.h, with the measurements; here the dweight accumulated onto a BF16 dweight was 0 for
// -0.0015 at N 7, and 0.0117 for 0.0098 at N 111).
constexpr double kHardwareTermUnits = std::is_same_v<floatX, float> ? 0.0 : kBf16EpilogueTermUnits;

double gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
double gelu_derivative(double x) {
    const double s = std::sqrt(2 / M_PI), t = std::tanh(s * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * s * (1 + 3 * 0.044715 * x * x);
}

std::vector<floatX> random_values(size_t n, float scale, std::mt19937& rng) {
    std::uniform_real_distribution<float> uniform(-scale, scale);
    std::vector<floatX> v(n);
    for (auto& x : v) x = from_float<floatX>(uniform(rng));
    return v;
}
double at(const std::vector<floatX>& v, size_t i) { return to_float(v[i]); }

// Counts elements off by more than their bound; reports the worst one.
struct Comparison {
    explicit Comparison(std::string name) : what(std::move(name)) {}
    std::string what;
    size_t failures = 0;
    double worst_ratio = 0;
    std::string worst;
    void check(size_t i, double got, double want, double bound) {
        const double error = std::fabs(got - want);
        const double ratio = error / bound;
        if (!(error <= bound)) ++failures;
        if (new_worst(ratio, worst_ratio)) {  // NaN counts as worst
            worst_ratio = ratio;
            worst = what + "[" + std::to_string(i) + "] = " + std::to_string(got) + ", want " + std::to_string(want) +
                    " (bound " + std::to_string(bound) + ")";
        }
    }
    void require() const {
        INFO(what << ": " << failures << " elements out of bounds; worst error/bound " << worst_ratio << ": " << worst);
        CHECK(failures == 0);
    }
};

// The error of a computed FP32 value within `fp32_bound` of `want`, after rounding to floatX.
// Measured worst error/bound: BF16 0.99 (the output rounding dominates); FP32 0.02-0.34.
double rounded_bound(double want, double fp32_bound) {
    return fp32_bound * (1 + output_unit()) + output_unit() * std::fabs(want);
}

struct MatmulLibrary {
    cudaStream_t stream;
    void* workspace = nullptr;
    Matmul mm;
    MatmulLibrary() {
        CUDA_CHECK(cudaMalloc(&workspace, kMatmulWorkspaceBytes));
        mm = matmul_create(workspace);
        CUDA_CHECK(cudaStreamCreate(&stream));
    }
    ~MatmulLibrary() {
        cudaStreamDestroy(stream);
        matmul_destroy(mm);
        cudaFree(workspace);
    }
};

struct Size {
    int N, C, OC;
};
// N = 555 spans three chunks of the bias-gradient column sums (at least 256 rows a chunk).
const Size kSizes[] = {{111, 96, 288}, {7, 96, 384}, {111, 384, 96}, {555, 96, 288}};

// A case's generator seed from its shape, in unsigned arithmetic: a large row count wraps instead of
// overflowing an int (UBSan stopped CI at 33000 * 104729), and wherever the int product fits it is the
// same seed.
uint32_t shape_seed(int rows, uint32_t multiplier, int columns) {
    return uint32_t(rows) * multiplier + uint32_t(columns);
}

void check_forward(const Size s, bool with_bias, bool with_gelu) {
    INFO("N " << s.N << ", C " << s.C << ", OC " << s.OC << (with_bias ? ", bias" : "") << (with_gelu ? ", GELU" : ""));
    MatmulLibrary library;
    std::mt19937 rng(shape_seed(s.N, 7919, s.OC));
    // Unit inputs over C = 96..384 terms: pre-activations of a few units, GELU's curved part.
    const auto inp = random_values(size_t(s.N) * s.C, 1.0f, rng), weight = random_values(size_t(s.OC) * s.C, 1.0f, rng),
               bias = random_values(s.OC, 1.0f, rng);
    DeviceBuffer<floatX> d_inp(inp), d_weight(weight), d_bias(bias), d_out(size_t(s.N) * s.OC),
        d_pre_gelu(size_t(s.N) * s.OC);
    d_out.fill_bytes(0xFF);  // NaN: every element must be written
    d_pre_gelu.fill_bytes(0xFF);
    matmul_forward(library.mm, d_out.ptr, d_inp.ptr, d_weight.ptr, with_bias ? d_bias.ptr : nullptr, s.N, s.C, s.OC,
                   library.stream, with_gelu ? d_pre_gelu.ptr : nullptr);
    const auto out = d_out.download(), pre_gelu = d_pre_gelu.download();

    Comparison out_check{"out"}, pre_gelu_check{"pre_gelu"};
    for (int n = 0; n < s.N; ++n)
        for (int o = 0; o < s.OC; ++o) {
            double x = with_bias ? at(bias, o) : 0.0, magnitude = std::fabs(x);
            for (int c = 0; c < s.C; ++c) {
                const double product = at(inp, size_t(n) * s.C + c) * at(weight, size_t(o) * s.C + c);
                x += product;
                magnitude += std::fabs(product);
            }
            // FP32 accumulation of C products and the bias: at most C + 2 roundings of the
            // magnitudes involved (Higham's gamma_n bound for a recursive sum).
            const double x_bound = (s.C + 2) * kFp32Unit * magnitude;
            const size_t i = size_t(n) * s.OC + o;
            if (with_gelu) {
                pre_gelu_check.check(i, at(pre_gelu, i), x, rounded_bound(x, x_bound));
                // |GELU'| <= 1.13 carries x's error; the activation adds its own.
                const double y = gelu(x);
                out_check.check(i, at(out, i), y, rounded_bound(y, 1.2 * x_bound + kActivationTolerance * std::fabs(x)));
            } else {
                out_check.check(i, at(out, i), x, rounded_bound(x, x_bound));
            }
        }
    out_check.require();
    if (with_gelu) pre_gelu_check.require();
}

struct BackwardResult {
    std::vector<floatX> dinp, dweight, dbias;
};

// How the Matmul runs: the bias gradient fused into the weight gradient's GEMM (BGRADB; in the BF16
// build, where FP32 sums are refused, with sums in D's type when asked: --bias-grad epilogue) or by our
// column-sum kernels; the heuristic's first algorithm or the fastest of its candidates (autotune).
struct Mode {
    bool fuse_bias_grad = true;
    bool autotune = false;
    bool bias_grad_in_output_type = false;
};

// The plans of the Matmul's cache with this epilogue that found an algorithm.
int supported_plans(const Matmul& mm, cublasLtEpilogue_t epilogue) {
    int count = 0;
    for (const auto& [key, plan] : mm.plans->plans) count += key.epilogue == uint32_t(epilogue) && plan.supported;
    return count;
}

void check_backward(const Size s, bool with_gelu, bool with_bias, Mode mode = {}) {
    INFO("N " << s.N << ", C " << s.C << ", OC " << s.OC << (with_gelu ? ", DGELU" : "") << (with_bias ? ", bias" : "")
              << (mode.fuse_bias_grad ? ", fused bias gradient" : ", bias-gradient kernels")
              << (mode.autotune ? ", autotune" : "") << (mode.bias_grad_in_output_type ? ", BGRADB in D's type" : ""));
    MatmulLibrary library;
    library.mm.fuse_bias_grad = mode.fuse_bias_grad;
    library.mm.autotune = mode.autotune;
    library.mm.bias_grad_in_output_type = mode.bias_grad_in_output_type;
    // The emulated cuBLASLt has BGRADB for these layouts into FP32 sums when D is FP32, refuses FP32 sums
    // beside a BF16 D (INVALID_VALUE) as an H100's cuBLAS 13 does, and takes sums in D's type: so the
    // fused path runs in the FP32 build, and in the BF16 one when sums in D's type are asked for.
    const bool fusable =
        with_bias && mode.fuse_bias_grad && (std::is_same_v<floatX, float> || mode.bias_grad_in_output_type);
    // BF16 sums are rounded to BF16 before the finishing kernel adds them: one more rounding of the part
    // (without this term the emulator's fused BF16 path put 68 of 288 dbias elements out of bounds, the
    // worst at 6.2x the bound).
    const double part_rounding = fusable && !std::is_same_v<floatX, float> ? output_unit() : 0.0;
    std::mt19937 rng(shape_seed(s.N, 104729, s.C));
    const auto dout = random_values(size_t(s.N) * s.OC, 1.0f, rng), inp = random_values(size_t(s.N) * s.C, 1.0f, rng),
               weight = random_values(size_t(s.OC) * s.C, 1.0f, rng),
               pre_gelu = random_values(size_t(s.N) * s.C, 3.0f, rng),  // GELU's curved part
        dweight_start = random_values(size_t(s.OC) * s.C, 1.0f, rng), dbias_start = random_values(s.OC, 1.0f, rng);
    DeviceBuffer<floatX> d_dout(dout), d_inp(inp), d_weight(weight), d_pre_gelu(pre_gelu), d_dinp(size_t(s.N) * s.C),
        d_dweight(dweight_start), d_dbias(dbias_start);
    DeviceBuffer<float> d_scratch(matmul_backward_scratch_floats(s.N, s.OC));  // exact size: ASan sees overruns
    d_scratch.fill_bytes(0xFF);

    auto backward = [&] {
        d_dinp.fill_bytes(0xFF);  // NaN: dinp is overwritten, never read
        matmul_backward(library.mm, d_dinp.ptr, d_dweight.ptr, with_bias ? d_dbias.ptr : nullptr,
                        with_bias ? d_scratch.ptr : nullptr, d_dout.ptr, d_inp.ptr, d_weight.ptr, s.N, s.C, s.OC,
                        library.stream, with_gelu ? d_pre_gelu.ptr : nullptr);
        return BackwardResult{d_dinp.download(), d_dweight.download(), d_dbias.download()};
    };

    // Products in double: the gradient parts each call adds, with their magnitudes.
    std::vector<double> dinp_want(size_t(s.N) * s.C), dinp_bound(dinp_want.size());
    for (int n = 0; n < s.N; ++n)
        for (int c = 0; c < s.C; ++c) {
            double g = 0, magnitude = 0;
            for (int o = 0; o < s.OC; ++o) {
                const double product = at(dout, size_t(n) * s.OC + o) * at(weight, size_t(o) * s.C + c);
                g += product;
                magnitude += std::fabs(product);
            }
            const size_t i = size_t(n) * s.C + c;
            double bound = (s.OC + 1) * kFp32Unit * magnitude;  // gamma bound, as in the forward
            if (with_gelu) {
                const double slope = gelu_derivative(at(pre_gelu, i));
                bound = std::fabs(slope) * bound + kActivationTolerance * std::fabs(g);
                g *= slope;
            }
            dinp_want[i] = g;
            dinp_bound[i] = rounded_bound(g, bound);
        }
    std::vector<double> dweight_part(size_t(s.OC) * s.C), dweight_magnitude(dweight_part.size());
    for (int o = 0; o < s.OC; ++o)
        for (int c = 0; c < s.C; ++c)
            for (int n = 0; n < s.N; ++n) {
                const double product = at(dout, size_t(n) * s.OC + o) * at(inp, size_t(n) * s.C + c);
                dweight_part[size_t(o) * s.C + c] += product;
                dweight_magnitude[size_t(o) * s.C + c] += std::fabs(product);
            }
    std::vector<double> dbias_part(s.OC), dbias_magnitude(s.OC);
    for (int n = 0; n < s.N; ++n)
        for (int o = 0; o < s.OC; ++o) {
            dbias_part[o] += at(dout, size_t(n) * s.OC + o);
            dbias_magnitude[o] += std::fabs(at(dout, size_t(n) * s.OC + o));
        }

    // Two calls: each adds its part onto what the previous one left (accumulation across
    // micro-steps), and each rewrites dinp identically. N + 2 FP32 roundings per sum (gamma bound).
    std::vector<floatX> dweight_before = dweight_start, dbias_before = dbias_start;
    BackwardResult first;
    for (int call = 0; call < 2; ++call) {
        INFO("call " << call + 1);
        const BackwardResult r = backward();
        Comparison dinp_check{"dinp"}, dweight_check{"dweight"}, dbias_check{"dbias"};
        for (size_t i = 0; i < r.dinp.size(); ++i) dinp_check.check(i, at(r.dinp, i), dinp_want[i], dinp_bound[i]);
        for (size_t i = 0; i < r.dweight.size(); ++i) {
            const double want = at(dweight_before, i) + dweight_part[i];
            const double bound = (s.N + 2) * kFp32Unit * (std::fabs(at(dweight_before, i)) + dweight_magnitude[i]) +
                                 kHardwareTermUnits * (std::fabs(at(dweight_before, i)) + std::fabs(dweight_part[i]));
            dweight_check.check(i, at(r.dweight, i), want, rounded_bound(want, bound));
        }
        for (int o = 0; o < s.OC; ++o) {
            const double want = at(dbias_before, o) + dbias_part[o];
            const double sum_bound = (s.N + 2) * kFp32Unit * (std::fabs(at(dbias_before, o)) + dbias_magnitude[o]);
            const double bound = sum_bound + part_rounding * (std::fabs(dbias_part[o]) + sum_bound);
            if (with_bias) dbias_check.check(o, at(r.dbias, o), want, rounded_bound(want, bound));
        }
        dinp_check.require();
        dweight_check.require();
        dbias_check.require();
        if (!with_bias) CHECK(bitwise_equal(r.dbias, dbias_start));  // no bias: nothing written there
        if (call == 0) first = r;
        else CHECK(bitwise_equal(r.dinp, first.dinp));  // overwritten, not accumulated
        dweight_before = r.dweight;
        dbias_before = r.dbias;
    }

    // Deterministic: the same start gives bitwise the same gradients.
    d_dweight.upload(dweight_start);
    d_dbias.upload(dbias_start);
    d_scratch.fill_bytes(0x00);
    const BackwardResult again = backward();
    CHECK(bitwise_equal(again.dinp, first.dinp));
    CHECK(bitwise_equal(again.dweight, first.dweight));
    CHECK(bitwise_equal(again.dbias, first.dbias));
    // The path asked for is the path taken (`fusable` above); a GPU's library may refuse more, and then
    // our kernels ran (and met the same reference above).
    const int fused_plans = supported_plans(library.mm, CUBLASLT_EPILOGUE_BGRADB);
    if (kEmulatedDevice) CHECK(fused_plans == (fusable ? 1 : 0));
    else CHECK(fused_plans <= (fusable ? 1 : 0));
}

}  // namespace

TEST_CASE("matmul_forward matches the double reference, with and without bias and fused GELU") {
    for (const Size& s : kSizes)
        for (bool with_bias : {false, true})
            for (bool with_gelu : {false, true}) check_forward(s, with_bias, with_gelu);
}

// out = inp W^T + bias + residual: the residual stream's add, by the GEMM's epilogue (beta C), or with
// Matmul::residual_in_epilogue off (as where cuBLASLt refuses it) by the GEMM and then an elementwise
// add. Unit residuals: a residual left out is 1000 times any bound.
TEST_CASE("matmul_forward adds a residual, in the epilogue or after the GEMM") {
    for (const Size& s : kSizes)
        for (bool in_epilogue : {true, false}) {
            INFO("N " << s.N << ", C " << s.C << ", OC " << s.OC << (in_epilogue ? ", epilogue" : ", elementwise add"));
            MatmulLibrary library;
            library.mm.residual_in_epilogue = in_epilogue;
            std::mt19937 rng(shape_seed(s.N, 31, s.OC));
            const auto inp = random_values(size_t(s.N) * s.C, 1.0f, rng), weight = random_values(size_t(s.OC) * s.C, 1.0f, rng),
                       bias = random_values(s.OC, 1.0f, rng), residual = random_values(size_t(s.N) * s.OC, 1.0f, rng);
            DeviceBuffer<floatX> d_inp(inp), d_weight(weight), d_bias(bias), d_residual(residual), d_out(size_t(s.N) * s.OC);
            d_out.fill_bytes(0xFF);  // NaN: every element must be written
            launch_record::start(/*timing=*/false);
            matmul_forward(library.mm, d_out.ptr, d_inp.ptr, d_weight.ptr, d_bias.ptr, s.N, s.C, s.OC, library.stream, nullptr,
                           d_residual.ptr);
            const std::vector<LaunchRecord> records = launch_record::stop();
            const auto out = d_out.download();
            CHECK(d_residual.download() == residual);  // read, not written
            // Which path ran: one GEMM named for its residual, or the plain GEMM and the add.
            REQUIRE(records.size() == (in_epilogue ? 1u : 2u));
            CHECK(records[0].name == (in_epilogue ? "matmul_forward(C=" + std::to_string(s.C) + ", OC=" + std::to_string(s.OC) +
                                                         ", bias, residual)"
                                                   : "matmul_forward(C=" + std::to_string(s.C) + ", OC=" + std::to_string(s.OC) +
                                                         ", bias)"));
            if (!in_epilogue) CHECK(records[1].name == "accumulate_kernel");
            Comparison out_check{"out"};
            for (int n = 0; n < s.N; ++n)
                for (int o = 0; o < s.OC; ++o) {
                    const size_t i = size_t(n) * s.OC + o;
                    double x = at(bias, o), magnitude = std::fabs(x);
                    for (int c = 0; c < s.C; ++c) {
                        const double product = at(inp, size_t(n) * s.C + c) * at(weight, size_t(o) * s.C + c);
                        x += product;
                        magnitude += std::fabs(product);
                    }
                    const double r = at(residual, i), want = x + r, x_bound = (s.C + 3) * kFp32Unit * (magnitude + std::fabs(r));
                    // The epilogue adds in FP32 (a GPU's BF16 epilogue as if each term were rounded first); the
                    // elementwise add takes the GEMM's rounded output, then rounds the sum once more.
                    const double bound = in_epilogue
                                             ? x_bound + kHardwareTermUnits * (std::fabs(x) + std::fabs(r))
                                             : rounded_bound(x, x_bound) + kFp32Unit * (std::fabs(x) + std::fabs(r));
                    out_check.check(i, at(out, i), want, rounded_bound(want, bound));
                }
            out_check.require();
        }
    MatmulLibrary library;
    DeviceBuffer<floatX> buffer(size_t(7) * 384), other(size_t(7) * 384), weight(size_t(384) * 96), inp(size_t(7) * 96);
    CHECK_THROWS_WITH(matmul_forward(library.mm, buffer.ptr, inp.ptr, weight.ptr, nullptr, 7, 96, 384, library.stream, nullptr,
                                     buffer.ptr),
                      Catch::Contains("out must not alias residual"));
    CHECK_THROWS_WITH(matmul_forward(library.mm, buffer.ptr, inp.ptr, weight.ptr, nullptr, 7, 96, 384, library.stream, other.ptr,
                                     other.ptr),
                      Catch::Contains("not added after GELU"));
}

TEST_CASE("matmul_forward is deterministic") {
    const Size s{111, 96, 288};
    MatmulLibrary library;
    std::mt19937 rng(5);
    DeviceBuffer<floatX> inp(random_values(size_t(s.N) * s.C, 1.0f, rng)),
        weight(random_values(size_t(s.OC) * s.C, 1.0f, rng)), bias(random_values(s.OC, 1.0f, rng)),
        out(size_t(s.N) * s.OC), pre_gelu(size_t(s.N) * s.OC);
    matmul_forward(library.mm, out.ptr, inp.ptr, weight.ptr, bias.ptr, s.N, s.C, s.OC, library.stream, pre_gelu.ptr);
    const auto out_first = out.download(), pre_gelu_first = pre_gelu.download();
    out.fill_bytes(0);
    pre_gelu.fill_bytes(0);
    matmul_forward(library.mm, out.ptr, inp.ptr, weight.ptr, bias.ptr, s.N, s.C, s.OC, library.stream, pre_gelu.ptr);
    CHECK(bitwise_equal(out.download(), out_first));
    CHECK(bitwise_equal(pre_gelu.download(), pre_gelu_first));
}

TEST_CASE("matmul_backward: dinp (plain and through DGELU), dweight and dbias accumulate, deterministic, bias optional") {
    for (const Size& s : kSizes)
        for (bool with_gelu : {false, true}) check_backward(s, with_gelu, /*with_bias=*/true);
    check_backward(kSizes[1], false, /*with_bias=*/false);
}

// --bias-grad epilogue: where FP32 sums are refused beside a BF16 D, BGRADB writes its sums in D's type
// (the same as the default in the FP32 build, which takes FP32 sums first).
TEST_CASE("matmul_backward: the bias gradient from BGRADB in D's type matches the reference, one rounding more") {
    for (const Size& s : kSizes)
        for (bool with_gelu : {false, true})
            check_backward(s, with_gelu, /*with_bias=*/true, Mode{.bias_grad_in_output_type = true});
    check_backward(kSizes[0], true, true, Mode{.autotune = true, .bias_grad_in_output_type = true});
}

TEST_CASE("matmul_backward: the bias gradient by our kernels (cuBLASLt without BGRADB) matches the same reference") {
    for (const Size& s : kSizes) check_backward(s, /*with_gelu=*/true, /*with_bias=*/true, Mode{.fuse_bias_grad = false});
    // 2,600 rows: 11 chunks of 256, which the finishing kernel adds in one slice (the kSizes above make 1
    // to 3 chunks); 33,000 rows: the cap of 128 chunks, in 4 slices of 32.
    check_backward(Size{2600, 32, 64}, /*with_gelu=*/false, /*with_bias=*/true, Mode{.fuse_bias_grad = false});
    REQUIRE(matmul_detail::bias_grad_chunks(33000) == matmul_detail::kBiasMaxChunks);
    REQUIRE(partial_row_slices(matmul_detail::kBiasMaxChunks) == 4);
    check_backward(Size{33000, 32, 64}, /*with_gelu=*/false, /*with_bias=*/true, Mode{.fuse_bias_grad = false});
}

// Autotune runs every candidate on the call's own operands: the weight gradient's GEMM accumulates
// (beta = 1), so without saving and restoring dweight each candidate's run would add to it again;
// the reference check fails then. The emulated candidates compute alike, so there the result must
// also equal the untuned one bit for bit.
TEST_CASE("matmul autotune: candidates timed on live operands leave the results as one run leaves them") {
    for (const Size& s : kSizes) check_backward(s, /*with_gelu=*/true, /*with_bias=*/true, Mode{.autotune = true});
    const Size s = kSizes[0];
    std::mt19937 rng(11);
    const auto dout = random_values(size_t(s.N) * s.OC, 1.0f, rng), inp = random_values(size_t(s.N) * s.C, 1.0f, rng),
               weight = random_values(size_t(s.OC) * s.C, 1.0f, rng), start = random_values(size_t(s.OC) * s.C, 1.0f, rng);
    std::vector<std::vector<floatX>> dweights;
    for (bool autotune : {false, true}) {
        MatmulLibrary library;
        library.mm.autotune = autotune;
        DeviceBuffer<floatX> d_dout(dout), d_inp(inp), d_weight(weight), d_dinp(size_t(s.N) * s.C), d_dweight(start);
        matmul_backward(library.mm, d_dinp.ptr, d_dweight.ptr, nullptr, nullptr, d_dout.ptr, d_inp.ptr, d_weight.ptr, s.N,
                        s.C, s.OC, library.stream);
        dweights.push_back(d_dweight.download());
        for (const auto& [key, plan] : library.mm.plans->plans) {
            if (kEmulatedDevice) CHECK(plan.candidates == (autotune ? 2 : 1));  // the emulated heuristic offers two
            CHECK(plan.candidates >= 1);
            CHECK(plan.candidates <= (autotune ? matmul_detail::kAutotuneCandidates : 1));
        }
    }
    // A GPU's candidates may sum in other orders: there each result met the reference (above) instead.
    if (kEmulatedDevice) CHECK(bitwise_equal(dweights[0], dweights[1]));
}

// Autotune's picks kept across runs (host/matmul_algos.h). One forward with bias and GELU and one
// backward with DGELU and the bias gradient, at each of kSizes: the results, in order.
std::vector<std::vector<floatX>> forward_and_backward(Matmul& mm, cudaStream_t stream) {
    std::vector<std::vector<floatX>> results;
    for (const Size& s : kSizes) {
        std::mt19937 rng(shape_seed(s.N, 31, s.OC));
        DeviceBuffer<floatX> inp(random_values(size_t(s.N) * s.C, 1.0f, rng)), weight(random_values(size_t(s.OC) * s.C, 1.0f, rng)),
            bias(random_values(s.OC, 1.0f, rng)), dout(random_values(size_t(s.N) * s.OC, 1.0f, rng)),
            pre_gelu(random_values(size_t(s.N) * s.C, 3.0f, rng)), out(size_t(s.N) * s.OC), pre_out(size_t(s.N) * s.OC),
            dinp(size_t(s.N) * s.C), dweight(random_values(size_t(s.OC) * s.C, 1.0f, rng)), dbias(random_values(s.OC, 1.0f, rng));
        DeviceBuffer<float> scratch(matmul_backward_scratch_floats(s.N, s.OC));
        matmul_forward(mm, out.ptr, inp.ptr, weight.ptr, bias.ptr, s.N, s.C, s.OC, stream, pre_out.ptr);
        matmul_backward(mm, dinp.ptr, dweight.ptr, dbias.ptr, scratch.ptr, dout.ptr, inp.ptr, weight.ptr, s.N, s.C, s.OC,
                        stream, pre_gelu.ptr);
        for (const auto* b : {&out, &pre_out, &dinp, &dweight, &dbias}) results.push_back(b->download());
    }
    return results;
}

// The candidate the emulated heuristic numbers i (emu/cublaslt.cpp: the first word of algo.data).
std::array<uint64_t, 8> emulated_candidate(uint64_t i) { return {i, 0, 0, 0, 0, 0, 0, 0}; }

TEST_CASE("matmul autotune picks: taken by another Matmul without timing, with the same results") {
    MatmulLibrary first;
    first.mm.autotune = true;
    const auto first_results = forward_and_backward(first.mm, first.stream);
    MatmulAlgos algos = matmul_algos(first.mm);
    const int timed = first.mm.plans->timed;
    CHECK(timed > 0);
    CHECK(first.mm.plans->from_record == 0);
    CHECK(int(algos.picks.size()) == timed);  // one pick per shape timed (no plan here has one candidate)
    CHECK(algos.origin == matmul_algo_origin());
    // In the emulator the two candidates compute alike and timing picks either: ask for the second
    // everywhere, so that a Matmul that ignored the picks (and timed) would choose differently somewhere.
    if (kEmulatedDevice)
        for (MatmulAlgoPick& pick : algos.picks) pick.algo = emulated_candidate(1);

    MatmulLibrary second;
    second.mm.autotune = true;
    CHECK(matmul_take_algos(second.mm, algos).empty());
    const auto second_results = forward_and_backward(second.mm, second.stream);
    CHECK(second.mm.plans->timed == 0);
    CHECK(second.mm.plans->from_record == timed);
    for (const auto& [key, plan] : second.mm.plans->plans) {
        if (plan.candidates < 2) continue;
        if (kEmulatedDevice) CHECK(plan.chosen == 1);
        const auto field = matmul_detail::plan_key_fields(key);
        const auto recorded = std::find_if(algos.picks.begin(), algos.picks.end(), [&](const MatmulAlgoPick& p) { return p.key == field; });
        REQUIRE(recorded != algos.picks.end());
        CHECK(std::memcmp(plan.algo.data, recorded->algo.data(), sizeof plan.algo.data) == 0);
    }
    // The same algorithms, the same bits (on a GPU too: there the first run's picks were taken as they were).
    REQUIRE(first_results.size() == second_results.size());
    for (size_t i = 0; i < first_results.size(); ++i) CHECK(bitwise_equal(first_results[i], second_results[i]));
    // What the second writes: the same picks, keys through plan_key_of and back.
    const MatmulAlgos again = matmul_algos(second.mm);
    REQUIRE(again.picks.size() == algos.picks.size());
    for (size_t i = 0; i < again.picks.size(); ++i) {
        CHECK(again.picks[i].key == algos.picks[i].key);
        CHECK(again.picks[i].algo == algos.picks[i].algo);
    }
}

TEST_CASE("matmul autotune picks: a pick the heuristic does not offer is timed again; another origin's are not taken") {
    MatmulLibrary first;
    first.mm.autotune = true;
    forward_and_backward(first.mm, first.stream);
    MatmulAlgos algos = matmul_algos(first.mm);
    REQUIRE(!algos.picks.empty());
    const int timed = first.mm.plans->timed;
    {
        MatmulAlgos stale = algos;
        stale.picks[0].algo = emulated_candidate(7);  // no heuristic offers this (emulated: 2 candidates; a GPU's are not 7, 0...)
        stale.picks[0].algo[7] = 0x5eed5eed5eed5eedull;
        MatmulLibrary second;
        second.mm.autotune = true;
        CHECK(matmul_take_algos(second.mm, stale).empty());
        forward_and_backward(second.mm, second.stream);
        CHECK(second.mm.plans->timed == 1);
        CHECK(second.mm.plans->from_record == timed - 1);
    }
    {
        MatmulAlgos elsewhere = algos;
        elsewhere.origin.device = "another GPU";
        MatmulLibrary second;
        second.mm.autotune = true;
        const std::string why = matmul_take_algos(second.mm, elsewhere);
        CHECK(why.find("written for " + algos.origin.library + " on another GPU") != std::string::npos);
        CHECK(why.find("this is " + algos.origin.library + " on " + algos.origin.device) != std::string::npos);
        CHECK(second.mm.plans->recorded.empty());
        forward_and_backward(second.mm, second.stream);
        CHECK(second.mm.plans->timed == timed);
        CHECK(second.mm.plans->from_record == 0);
    }
}

TEST_CASE("matmul algorithms file: written and read back; a file that is not one named with its field") {
    TempDir dir;
    MatmulAlgos algos{{"cuBLASLt 130100", "NVIDIA H100 80GB HBM3", "BF16"}, {}};
    MatmulAlgoPick pick;
    for (size_t f = 0; f < kMatmulPlanKeyFieldCount; ++f) pick.key[f] = int64_t(f) * 37 - 1;
    pick.key[9] = int64_t(UINT32_MAX);  // a uint32 field at its largest
    pick.algo = {0x0123456789abcdefull, 0, ~0ull, 7, 0, 0, 0, 1ull << 63};
    algos.picks = {pick, pick};
    algos.picks[1].key[2] = 50304;
    const std::string path = dir.file("algos.json");
    write_matmul_algos(path, algos);
    CHECK(!std::filesystem::exists(path + ".tmp"));
    const MatmulAlgos read = read_matmul_algos(path);
    CHECK(read.origin == algos.origin);
    REQUIRE(read.picks.size() == 2);
    for (size_t i = 0; i < 2; ++i) {
        CHECK(read.picks[i].key == algos.picks[i].key);
        CHECK(read.picks[i].algo == algos.picks[i].algo);
    }
    const std::string text = [&] {
        std::ifstream in(path);
        return std::string(std::istreambuf_iterator<char>(in), {});
    }();
    const auto broken = [&](const std::string& from, const std::string& to) {
        std::string t = text;
        const size_t at = t.find(from);
        REQUIRE(at != std::string::npos);
        t.replace(at, from.size(), to);
        const std::string p = dir.write("broken.json", t);
        return error_of([&] { read_matmul_algos(p); });
    };
    CHECK(error_of([&] { read_matmul_algos(dir.file("none.json")); }) == "matmul algorithms '" + dir.file("none.json") + "': cannot open the file");
    CHECK(broken("{", "[").find("broken.json': not valid JSON") != std::string::npos);
    CHECK(broken("algorithms 1", "algorithms 2").find("broken.json': format: 'train_gpt matmul algorithms 2', expected") != std::string::npos);
    CHECK(broken("\"device\"", "\"dev\"").find("broken.json': device: missing or not a string") != std::string::npos);
    CHECK(broken("\"m\": 73", "\"m\": \"73\"").find("broken.json': picks[0].m: missing or not a 32-bit integer") != std::string::npos);
    CHECK(broken("\"m\": 73", "\"m\": 4294967296").find("picks[0].m: missing or not a 32-bit integer") != std::string::npos);
    CHECK(broken("\"m\": 73", "\"m\": 18446744073709551615").find("picks[0].m: missing or not a 32-bit integer") !=
          std::string::npos);  // 2^64 - 1: not -1
    CHECK(broken("\"m\": 73", "\"m\": -2147483649").find("picks[0].m: missing or not a 32-bit integer") != std::string::npos);
    CHECK(broken("0123456789abcdef", "0123456789abcdeg").find("picks[0].algo: expects 128 lower-case hex digits") != std::string::npos);
    CHECK(broken("\"picks\"", "\"pick\"").find("picks: missing or not an array") != std::string::npos);
    // A folder that cannot be written in: the error names the file, and no temp file is left.
    const std::string nowhere = dir.file("no/such/dir/a.json");
    CHECK(error_of([&] { write_matmul_algos(nowhere, algos); }).find("matmul algorithms '" + nowhere + "': cannot open '" +
                                                                     nowhere + ".tmp'") != std::string::npos);
}

TEST_CASE("matmul algorithms file: one per rank past one rank") {
    CHECK(matmul_algos_path_of_rank("out/matmul_algos.json", 0, 1) == "out/matmul_algos.json");
    CHECK(matmul_algos_path_of_rank("out/matmul_algos.json", 3, 8) == "out/matmul_algos.rank3.json");
    CHECK(matmul_algos_path_of_rank("run.v2/algos", 1, 2) == "run.v2/algos.rank1");
    CHECK(matmul_algos_path_of_rank(".algos", 1, 2) == ".algos.rank1");
}

TEST_CASE("matmul plans: made once per shape and reused") {
    const Size s = kSizes[0];
    MatmulLibrary library;
    std::mt19937 rng(3);
    DeviceBuffer<floatX> inp(random_values(size_t(s.N) * s.C, 1.0f, rng)), weight(random_values(size_t(s.OC) * s.C, 1.0f, rng)),
        bias(random_values(s.OC, 1.0f, rng)), out(size_t(s.N) * s.OC), out2(size_t(s.N) * s.OC);
    for (int i = 0; i < 3; ++i) matmul_forward(library.mm, out.ptr, inp.ptr, weight.ptr, bias.ptr, s.N, s.C, s.OC, library.stream);
    CHECK(library.mm.plans->misses == 1);
    const auto first = out.download();
    // Other pointers with the same alignment: the same plan, with the call's pointers.
    matmul_forward(library.mm, out2.ptr, inp.ptr, weight.ptr, bias.ptr, s.N, s.C, s.OC, library.stream);
    CHECK(library.mm.plans->misses == 1);
    CHECK(bitwise_equal(out2.download(), first));
    // Another shape, another epilogue: new plans.
    matmul_forward(library.mm, out.ptr, inp.ptr, weight.ptr, bias.ptr, s.N - 1, s.C, s.OC, library.stream);
    matmul_forward(library.mm, out.ptr, inp.ptr, weight.ptr, nullptr, s.N, s.C, s.OC, library.stream);
    CHECK(library.mm.plans->misses == 3);
    CHECK(library.mm.plans->plans.size() == 3);
}

TEST_CASE("matmul_requirements rejects sizes that are not multiples of 8") {
    CHECK(matmul_requirements(96, 288).empty());
    CHECK(matmul_requirements(768, 50304).empty());
    const std::string bad_c = matmul_requirements(100, 288), bad_oc = matmul_requirements(96, 290),
                      zero = matmul_requirements(0, 8);
    CHECK(bad_c.find("C = 100 is not a multiple of 8") != std::string::npos);
    CHECK(bad_oc.find("OC = 290 is not a multiple of 8") != std::string::npos);
    CHECK(zero.find("C = 0 is not positive") != std::string::npos);
    // The bias-gradient scratch: one row of OC floats per chunk of rows, for any N.
    CHECK(matmul_backward_scratch_floats(111, 288) >= 288);
    CHECK(matmul_backward_scratch_floats(1 << 20, 768) <= size_t(128) * 768);
}
