// LayerNorm forward, fused residual + LayerNorm, backward, and GELU forward/backward against plain
// double loops fed the same floatX-rounded inputs: partial warps and blocks, rows per backward
// block with leftovers, C up to the 8192 limit, += semantics of every LayerNorm gradient, GELU in
// place and with a tail shorter than a pack, bitwise determinism, size checks.
#include "test_util.h"

#include "kernels/gelu.cuh"
#include "kernels/layernorm.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

namespace {

constexpr bool kFp32 = std::is_same_v<floatX, float>;
constexpr double kFp32Unit = 0x1p-24;
// Rounding a result to floatX: at most half an ulp, 2^-8 relative for BF16 (8-bit significand).
constexpr double kStoreUnit = kFp32 ? kFp32Unit : 0x1p-8;
// FP32 arithmetic inside the kernels, in units of 2^-24 times each element's magnitude scale (the
// sum of the absolute values of the terms that form it, computed by the reference). Measured
// worst cases (FP32 build, REPORT_ERRORS=1): out 2.6 units, mean 2.5, rstd 2.1, dinp 2.5, dweight
// 2.0, dbias 1.7, GELU 2.0 (scale |x|), GELU' 1.5 (scale |dout| (1 + |x|)). The rigorous bounds
// grow with C or N (recursive summation: n units), so 16 leaves room for other summation
// orders' luck and for the GPU's tanhf (2 ulp, CUDA Math API) and rsqrtf (2 ulp).
constexpr double kComputeUnits = 16;

std::vector<floatX> random_floatX(size_t n, float lo, float hi, std::mt19937& rng) {
    std::uniform_real_distribution<float> uniform(lo, hi);
    std::vector<floatX> v(n);
    for (auto& x : v) x = from_float<floatX>(uniform(rng));
    return v;
}

double value(floatX x) { return double(to_float(x)); }

// |got - want| <= kStoreUnit |want| + kComputeUnits 2^-24 scale, everywhere; reports the worst.
template <typename T>
void check_close(const std::string& what, const std::vector<T>& got, const std::vector<double>& want,
                 const std::vector<double>& scale, double store_unit = kStoreUnit) {
    REQUIRE(got.size() == want.size());
    double worst_ratio = 0;
    size_t worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double error = std::abs(double(to_float(got[i])) - want[i]);
        const double allowed = store_unit * std::abs(want[i]) + kComputeUnits * kFp32Unit * scale[i] + 1e-30;
        if (new_worst(error / allowed, worst_ratio)) worst_ratio = error / allowed, worst = i;  // NaN counts as worst
    }
    if (std::getenv("REPORT_ERRORS")) {  // for re-measuring the tolerances (FP32 build)
        double units = 0;
        for (size_t i = 0; i < got.size(); ++i)
            units = std::max(units, std::abs(double(to_float(got[i])) - want[i]) / (kFp32Unit * scale[i] + 1e-30));
        std::printf("%-24s error / tolerance %.3f, %.2f units of 2^-24 scale\n", what.c_str(), worst_ratio, units);
    }
    INFO(what << ": worst element " << worst << " got " << to_float(got[worst]) << " want " << want[worst]
              << " (error / tolerance = " << worst_ratio << ")");
    CHECK(worst_ratio <= 1.0);
}


// ---- double references ----

struct ForwardReference {
    std::vector<double> out, out_scale, mean, mean_scale, rstd, rstd_scale;
};

ForwardReference layernorm_reference(const std::vector<double>& x, const std::vector<floatX>& weight,
                                     const std::vector<floatX>& bias, int N, int C) {
    ForwardReference r;
    r.out.resize(size_t(N) * C), r.out_scale.resize(r.out.size());
    for (int n = 0; n < N; ++n) {
        const double* row = &x[size_t(n) * C];
        double sum = 0, abs_sum = 0;
        for (int c = 0; c < C; ++c) sum += row[c], abs_sum += std::abs(row[c]);
        const double mean = sum / C;
        double var = 0;
        for (int c = 0; c < C; ++c) var += (row[c] - mean) * (row[c] - mean);
        var /= C;
        const double rstd = 1 / std::sqrt(var + 1e-5);
        // Scales: the mean's error is relative to mean(|x|); it moves every xhat by that error times
        // rstd, which (with the rstd error, relative) bounds the output error along with |xhat w| + |b|.
        r.mean.push_back(mean), r.mean_scale.push_back(abs_sum / C);
        r.rstd.push_back(rstd), r.rstd_scale.push_back(rstd);
        for (int c = 0; c < C; ++c) {
            const double xhat = (row[c] - mean) * rstd, w = value(weight[c]), b = value(bias[c]);
            r.out[size_t(n) * C + c] = xhat * w + b;
            r.out_scale[size_t(n) * C + c] = (std::abs(xhat) + abs_sum / C * rstd) * std::abs(w) + std::abs(b);
        }
    }
    return r;
}

struct BackwardReference {
    std::vector<double> dinp, dinp_scale, dweight, dweight_scale, dbias, dbias_scale;
};

// The gradients added to dinp_init, dweight_init, dbias_init.
BackwardReference layernorm_backward_reference(const std::vector<floatX>& dinp_init, const std::vector<floatX>& dweight_init,
                                               const std::vector<floatX>& dbias_init, const std::vector<floatX>& dout,
                                               const std::vector<floatX>& inp, const std::vector<floatX>& weight,
                                               const std::vector<float>& mean, const std::vector<float>& rstd, int N, int C) {
    BackwardReference r;
    r.dinp.resize(size_t(N) * C), r.dinp_scale.resize(r.dinp.size());
    for (int c = 0; c < C; ++c) {
        r.dweight.push_back(value(dweight_init[c])), r.dweight_scale.push_back(std::abs(value(dweight_init[c])));
        r.dbias.push_back(value(dbias_init[c])), r.dbias_scale.push_back(std::abs(value(dbias_init[c])));
    }
    std::vector<double> xhat(C), dxhat(C);
    for (int n = 0; n < N; ++n) {
        const size_t row = size_t(n) * C;
        double dxhat_sum = 0, dxhat_xhat_sum = 0, dxhat_abs = 0, dxhat_xhat_abs = 0;
        for (int c = 0; c < C; ++c) {
            const double d = value(dout[row + c]);
            xhat[c] = (value(inp[row + c]) - mean[n]) * double(rstd[n]);
            dxhat[c] = d * value(weight[c]);
            dxhat_sum += dxhat[c], dxhat_xhat_sum += dxhat[c] * xhat[c];
            dxhat_abs += std::abs(dxhat[c]), dxhat_xhat_abs += std::abs(dxhat[c] * xhat[c]);
            r.dweight[c] += d * xhat[c], r.dweight_scale[c] += std::abs(d * xhat[c]);
            r.dbias[c] += d, r.dbias_scale[c] += std::abs(d);
        }
        for (int c = 0; c < C; ++c) {
            const double init = value(dinp_init[row + c]);
            r.dinp[row + c] = init + rstd[n] * (dxhat[c] - dxhat_sum / C - xhat[c] * dxhat_xhat_sum / C);
            r.dinp_scale[row + c] =
                std::abs(init) + rstd[n] * (std::abs(dxhat[c]) + dxhat_abs / C + std::abs(xhat[c]) * dxhat_xhat_abs / C);
        }
    }
    return r;
}

std::vector<double> as_double(const std::vector<floatX>& v) {
    std::vector<double> d(v.size());
    for (size_t i = 0; i < v.size(); ++i) d[i] = value(v[i]);
    return d;
}

struct Shape {
    int N, C;
    float offset;  // added to the inputs: a large mean relative to the spread tests the variance pass
};
// 111 = 3 * 37 rows: the last forward block has 7 of its 8 warps. C = 8: one pack per row;
// C = 200: 25 threads of the backward block's one warp (partial warp), lanes with no pack in the
// forward; C = 264: 33 packs, lane 0 has two; C = 768 and 1024: GPT-2 124M and 350M, rows in
// registers at 3 and 4 packs per lane (BF16; 8 in FP32); C = 1600: GPT-2 1.5B (8 packs per lane in
// BF16; FP32 streams it); C = 8192: the limit (streamed); 300 rows of 768: a backward of 5 blocks
// (64 rows and up a block) at GPT-2's width. Every forward form runs in each precision.
const Shape kShapes[] = {{111, 8, 0.0f},  {111, 200, 0.0f}, {111, 264, 6.0f}, {45, 768, 3.0f}, {300, 768, 3.0f},
                         {19, 1024, 0.0f}, {37, 1600, 0.0f}, {3, 8192, -2.0f}};
// More rows than kLayernormBackwardMaxBlocks * kLayernormBackwardMinRowsPerBlock: the backward's grid
// is capped, and its blocks take 64 or 65 rows each (65 rows more than the cap's).
const Shape kCappedBackwardGrid{kLayernormBackwardMaxBlocks * kLayernormBackwardMinRowsPerBlock + 65, 16, 1.0f};

// A backward pass's random inputs for one shape: inp, dout and weight; mean and rstd as the forward pass
// would save them (floats; the reference uses the same floats); non-zero gradients already in place, so
// the kernels must add to them.
struct BackwardInputs {
    std::vector<floatX> inp, dout, weight, dinp_init, dweight_init, dbias_init;
    std::vector<float> mean, rstd;
};
BackwardInputs random_backward_inputs(const Shape& s, std::mt19937& rng) {
    BackwardInputs in;
    const size_t size = size_t(s.N) * s.C;
    in.inp = random_floatX(size, s.offset - 1.5f, s.offset + 1.5f, rng);
    in.dout = random_floatX(size, -1.0f, 1.0f, rng);
    in.weight = random_floatX(s.C, -1.5f, 1.5f, rng);
    const ForwardReference forward = layernorm_reference(as_double(in.inp), in.weight, in.weight, s.N, s.C);
    in.mean.assign(forward.mean.begin(), forward.mean.end());
    in.rstd.assign(forward.rstd.begin(), forward.rstd.end());
    in.dinp_init = random_floatX(size, -0.5f, 0.5f, rng);
    in.dweight_init = random_floatX(s.C, -2.0f, 2.0f, rng);
    in.dbias_init = random_floatX(s.C, -2.0f, 2.0f, rng);
    return in;
}

}  // namespace

TEST_CASE("layernorm_forward matches the double reference; mean and rstd are optional") {
    std::mt19937 rng(1);
    for (const Shape& s : kShapes) {
        INFO("N = " << s.N << ", C = " << s.C);
        const auto inp = random_floatX(size_t(s.N) * s.C, s.offset - 1.5f, s.offset + 1.5f, rng);
        const auto weight = random_floatX(s.C, -1.5f, 1.5f, rng), bias = random_floatX(s.C, -0.5f, 0.5f, rng);
        DeviceBuffer<floatX> d_inp(inp), d_weight(weight), d_bias(bias), d_out(inp.size());
        DeviceBuffer<float> d_mean(s.N), d_rstd(s.N);
        layernorm_forward(d_out.ptr, d_mean.ptr, d_rstd.ptr, d_inp.ptr, d_weight.ptr, d_bias.ptr, s.N, s.C, nullptr);
        const ForwardReference ref = layernorm_reference(as_double(inp), weight, bias, s.N, s.C);
        const auto out = d_out.download();
        check_close("out", out, ref.out, ref.out_scale);
        // mean and rstd are stored as float in both builds: one float rounding on top.
        check_close("mean", d_mean.download(), ref.mean, ref.mean_scale, kFp32Unit);
        check_close("rstd", d_rstd.download(), ref.rstd, ref.rstd_scale, kFp32Unit);

        DeviceBuffer<floatX> d_out2(inp.size());
        layernorm_forward(d_out2.ptr, nullptr, nullptr, d_inp.ptr, d_weight.ptr, d_bias.ptr, s.N, s.C, nullptr);
        CHECK(bitwise_equal(d_out2.download(), out));
    }
}

TEST_CASE("fused_residual_layernorm_forward normalizes the rounded residual") {
    std::mt19937 rng(2);
    for (const Shape& s : kShapes) {
        INFO("N = " << s.N << ", C = " << s.C);
        const auto inp1 = random_floatX(size_t(s.N) * s.C, s.offset - 1.0f, s.offset + 1.0f, rng);
        const auto inp2 = random_floatX(inp1.size(), -0.7f, 0.7f, rng);
        const auto weight = random_floatX(s.C, -1.5f, 1.5f, rng), bias = random_floatX(s.C, -0.5f, 0.5f, rng);
        DeviceBuffer<floatX> d_inp1(inp1), d_inp2(inp2), d_weight(weight), d_bias(bias);
        DeviceBuffer<floatX> d_residual(inp1.size()), d_out(inp1.size());
        DeviceBuffer<float> d_mean(s.N), d_rstd(s.N);
        fused_residual_layernorm_forward(d_residual.ptr, d_out.ptr, d_mean.ptr, d_rstd.ptr, d_inp1.ptr, d_inp2.ptr,
                                         d_weight.ptr, d_bias.ptr, s.N, s.C, nullptr);
        // residual: the exact sum (a double holds it) rounded once to floatX.
        std::vector<double> sum(inp1.size()), sum_scale(inp1.size());
        for (size_t i = 0; i < sum.size(); ++i)
            sum[i] = value(inp1[i]) + value(inp2[i]), sum_scale[i] = std::abs(value(inp1[i])) + std::abs(value(inp2[i]));
        check_close("residual", d_residual.download(), sum, sum_scale);

        // The LayerNorm must see the rounded residual: the reference normalizes exactly that. In
        // BF16 it differs from normalizing the unrounded sum by far more than the tolerance.
        const auto residual = d_residual.download();
        const ForwardReference ref = layernorm_reference(as_double(residual), weight, bias, s.N, s.C);
        check_close("out", d_out.download(), ref.out, ref.out_scale);
        check_close("mean", d_mean.download(), ref.mean, ref.mean_scale, kFp32Unit);
        check_close("rstd", d_rstd.download(), ref.rstd, ref.rstd_scale, kFp32Unit);

        // The plain forward on the residual gives the same bits.
        DeviceBuffer<floatX> d_out_plain(inp1.size());
        layernorm_forward(d_out_plain.ptr, nullptr, nullptr, d_residual.ptr, d_weight.ptr, d_bias.ptr, s.N, s.C, nullptr);
        CHECK(bitwise_equal(d_out_plain.download(), d_out.download()));
    }
}

TEST_CASE("layernorm_backward accumulates dinp, dweight, dbias, deterministically, with poisoned scratch") {
    std::mt19937 rng(3);
    std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
    shapes.push_back(kCappedBackwardGrid);
    for (const Shape& s : shapes) {
        INFO("N = " << s.N << ", C = " << s.C);
        const auto [inp, dout, weight, dinp_init, dweight_init, dbias_init, mean, rstd] = random_backward_inputs(s, rng);

        DeviceBuffer<floatX> d_inp(inp), d_dout(dout), d_weight(weight);
        DeviceBuffer<float> d_mean(mean), d_rstd(rstd), d_scratch(layernorm_backward_scratch_floats(s.N, s.C));
        DeviceBuffer<floatX> d_dinp(dinp_init), d_dweight(dweight_init), d_dbias(dbias_init);
        auto run = [&] {
            layernorm_backward(d_dinp.ptr, d_dweight.ptr, d_dbias.ptr, d_scratch.ptr, d_dout.ptr, d_inp.ptr, d_weight.ptr,
                               d_mean.ptr, d_rstd.ptr, s.N, s.C, nullptr);
        };
        d_scratch.fill_bytes(0xFF);  // NaN: the kernels must not read scratch they did not write
        run();
        const auto dinp1 = d_dinp.download(), dweight1 = d_dweight.download(), dbias1 = d_dbias.download();
        BackwardReference ref = layernorm_backward_reference(dinp_init, dweight_init, dbias_init, dout, inp, weight, mean,
                                                             rstd, s.N, s.C);
        check_close("dinp", dinp1, ref.dinp, ref.dinp_scale);
        check_close("dweight", dweight1, ref.dweight, ref.dweight_scale);
        check_close("dbias", dbias1, ref.dbias, ref.dbias_scale);

        // A second call adds the same gradients onto the first call's results.
        run();
        ref = layernorm_backward_reference(dinp1, dweight1, dbias1, dout, inp, weight, mean, rstd, s.N, s.C);
        check_close("dinp (second call)", d_dinp.download(), ref.dinp, ref.dinp_scale);
        check_close("dweight (second call)", d_dweight.download(), ref.dweight, ref.dweight_scale);
        check_close("dbias (second call)", d_dbias.download(), ref.dbias, ref.dbias_scale);

        // Determinism: the first call again, from the same state, with different scratch garbage.
        d_dinp.upload(dinp_init), d_dweight.upload(dweight_init), d_dbias.upload(dbias_init);
        d_scratch.fill_bytes(0x3C);
        run();
        CHECK(bitwise_equal(d_dinp.download(), dinp1));
        CHECK(bitwise_equal(d_dweight.download(), dweight1));
        CHECK(bitwise_equal(d_dbias.download(), dbias1));
    }
}

// The residual stream's LayerNorm summing the bias gradients of the linears around it
// (ResidualBiasGrads): `incoming` += the column sums of dinp as it was on entry, `outgoing` += those of
// dinp as written (the rounded values a matmul reads next), against double sums of the same values;
// dinp, dweight and dbias keep the plain backward's bits (the same arithmetic in the same order).
TEST_CASE("layernorm_backward sums the residual's bias gradients from dinp as read and as written") {
    std::mt19937 rng(17);
    std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
    shapes.push_back(kCappedBackwardGrid);
    shapes.push_back({21, 2048, 1.0f});  // the widest row the batched form takes
    int fused_shapes = 0;
    for (const Shape& s : shapes) {
        INFO("N = " << s.N << ", C = " << s.C);
        if (!layernorm_sums_residual_bias(s.C)) continue;  // wider rows: refused, below
        ++fused_shapes;
        const auto [inp, dout, weight, dinp_init, dweight_init, dbias_init, mean, rstd] = random_backward_inputs(s, rng);
        const auto incoming_init = random_floatX(s.C, -2.0f, 2.0f, rng), outgoing_init = random_floatX(s.C, -2.0f, 2.0f, rng);

        DeviceBuffer<floatX> d_inp(inp), d_dout(dout), d_weight(weight);
        DeviceBuffer<float> d_mean(mean), d_rstd(rstd);
        struct Result {
            std::vector<floatX> dinp, dweight, dbias, incoming, outgoing;
        };
        auto run = [&](bool residual_bias, unsigned char poison) {
            DeviceBuffer<float> scratch(layernorm_backward_scratch_floats(s.N, s.C, residual_bias));  // exact: ASan sees overruns
            scratch.fill_bytes(poison);  // 0xFF: NaN, so scratch the kernels did not write cannot pass
            DeviceBuffer<floatX> dinp(dinp_init), dweight(dweight_init), dbias(dbias_init), incoming(incoming_init),
                outgoing(outgoing_init);
            const ResidualBiasGrads bias = residual_bias ? ResidualBiasGrads{incoming.ptr, outgoing.ptr} : ResidualBiasGrads{};
            layernorm_backward(dinp.ptr, dweight.ptr, dbias.ptr, scratch.ptr, d_dout.ptr, d_inp.ptr, d_weight.ptr, d_mean.ptr,
                               d_rstd.ptr, s.N, s.C, nullptr, bias);
            return Result{dinp.download(), dweight.download(), dbias.download(), incoming.download(), outgoing.download()};
        };
        const Result plain = run(false, 0xFF), fused = run(true, 0xFF);
        CHECK(bitwise_equal(fused.dinp, plain.dinp));
        CHECK(bitwise_equal(fused.dweight, plain.dweight));
        CHECK(bitwise_equal(fused.dbias, plain.dbias));
        CHECK(bitwise_equal(plain.incoming, incoming_init));  // without them nothing is written there
        CHECK(bitwise_equal(plain.outgoing, outgoing_init));

        // Column sums in double of what dinp held before and after: FP32 sums of N terms, rounded once.
        std::vector<double> incoming_want(s.C), incoming_scale(s.C), outgoing_want(s.C), outgoing_scale(s.C);
        for (int c = 0; c < s.C; ++c) {
            incoming_want[c] = value(incoming_init[c]), incoming_scale[c] = std::abs(incoming_want[c]);
            outgoing_want[c] = value(outgoing_init[c]), outgoing_scale[c] = std::abs(outgoing_want[c]);
        }
        for (int n = 0; n < s.N; ++n)
            for (int c = 0; c < s.C; ++c) {
                const double before = value(dinp_init[size_t(n) * s.C + c]), after = value(fused.dinp[size_t(n) * s.C + c]);
                incoming_want[c] += before, incoming_scale[c] += std::abs(before);
                outgoing_want[c] += after, outgoing_scale[c] += std::abs(after);
            }
        check_close("incoming", fused.incoming, incoming_want, incoming_scale);
        check_close("outgoing", fused.outgoing, outgoing_want, outgoing_scale);
        CHECK(!bitwise_equal(fused.incoming, incoming_init));  // the sums did add something
        CHECK(!bitwise_equal(fused.outgoing, outgoing_init));

        // Deterministic, whatever the scratch held.
        const Result again = run(true, 0x3C);
        CHECK(bitwise_equal(again.incoming, fused.incoming));
        CHECK(bitwise_equal(again.outgoing, fused.outgoing));
        CHECK(bitwise_equal(again.dinp, fused.dinp));
    }
    CHECK(fused_shapes == int(shapes.size()) - 1);  // every shape but C = 8192
    CHECK(layernorm_sums_residual_bias(2048));
    CHECK(!layernorm_sums_residual_bias(2056));
    // One of the two alone is refused, and so are rows wider than the batched form takes, naming the
    // launcher and what is wrong.
    DeviceBuffer<floatX> x(size_t(8) * 4096), w(4096), b(4096), t(4096), u(4096);
    DeviceBuffer<float> stats(8), scratch(layernorm_backward_scratch_floats(8, 4096, true));
    CHECK_THROWS_WITH(layernorm_backward(x.ptr, w.ptr, b.ptr, scratch.ptr, x.ptr, x.ptr, w.ptr, stats.ptr, stats.ptr, 8, 8,
                                         nullptr, ResidualBiasGrads{t.ptr, nullptr}),
                      Catch::Contains("layernorm_backward") && Catch::Contains("both incoming and outgoing"));
    CHECK_THROWS_WITH(layernorm_backward(x.ptr, w.ptr, b.ptr, scratch.ptr, x.ptr, x.ptr, w.ptr, stats.ptr, stats.ptr, 8, 4096,
                                         nullptr, ResidualBiasGrads{t.ptr, u.ptr}),
                      Catch::Contains("layernorm_backward") && Catch::Contains("C <= 2048 (C = 4096"));
}

TEST_CASE("layernorm_requirements accepts multiples of 8 up to 8192 and names a bad C") {
    for (int C : {8, 768, 1600, 8192}) CHECK(layernorm_requirements(C).empty());
    CHECK(layernorm_requirements(100) == "layernorm: C = 100 is not a positive multiple of 8");
    CHECK(layernorm_requirements(0).find("C = 0") != std::string::npos);
    CHECK(layernorm_requirements(-8).find("C = -8") != std::string::npos);
    CHECK(layernorm_requirements(8200).find("C = 8200 exceeds 8192") != std::string::npos);
    // Scratch stays bounded however many rows there are.
    CHECK(layernorm_backward_scratch_floats(65536, 1600) == size_t(kLayernormBackwardMaxBlocks) * 2 * 1600);
    CHECK(layernorm_backward_scratch_floats(111, 200) == size_t(2) * 2 * 200);
    CHECK(layernorm_backward_scratch_floats(111, 200, /*residual_bias=*/true) == size_t(2) * 4 * 200);
}

// ---------------------------------------------------------------------------------------------
// GELU

namespace {

double gelu_reference(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
double gelu_derivative_reference(double x) {
    const double s = std::sqrt(2 / M_PI), t = std::tanh(s * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * s * (1 + 3 * 0.044715 * x * x);
}

// Sizes: one pack; only a tail (3 < pack size); 37 packs plus a tail of 5 (BF16) or 1 (FP32);
// three blocks of 256 threads, the last one partial.
const size_t kGeluSizes[] = {8, 3, 301, 5003};

std::vector<floatX> gelu_inputs(size_t n, std::mt19937& rng) {
    auto x = random_floatX(n, -6.0f, 6.0f, rng);
    x[0] = from_float<floatX>(0.0f);  // and the saturated ends, where tanh is +-1
    if (n > 2) x[1] = from_float<floatX>(-12.0f), x[2] = from_float<floatX>(12.0f);
    return x;
}

}  // namespace

TEST_CASE("gelu_forward matches the tanh formula, out of place and in place") {
    std::mt19937 rng(4);
    for (size_t n : kGeluSizes) {
        INFO("N = " << n);
        const auto inp = gelu_inputs(n, rng);
        DeviceBuffer<floatX> d_inp(inp), d_out(n);
        d_out.fill_bytes(0xFF);
        gelu_forward(d_out.ptr, d_inp.ptr, n, nullptr);
        std::vector<double> want(n), scale(n);
        for (size_t i = 0; i < n; ++i) want[i] = gelu_reference(value(inp[i])), scale[i] = std::abs(value(inp[i]));
        const auto out = d_out.download();
        check_close("gelu", out, want, scale);
        gelu_forward(d_inp.ptr, d_inp.ptr, n, nullptr);  // out aliases inp
        CHECK(bitwise_equal(d_inp.download(), out));
    }
}

TEST_CASE("gelu_backward overwrites dinp with dout * gelu'(inp), also in place over dout") {
    std::mt19937 rng(5);
    for (size_t n : kGeluSizes) {
        INFO("N = " << n);
        const auto inp = gelu_inputs(n, rng), dout = random_floatX(n, -2.0f, 2.0f, rng);
        DeviceBuffer<floatX> d_inp(inp), d_dout(dout), d_dinp(n);
        d_dinp.fill_bytes(0xFF);  // NaN: overwritten, not accumulated
        gelu_backward(d_dinp.ptr, d_inp.ptr, d_dout.ptr, n, nullptr);
        // gelu'(x) reaches 1.13 near |x| = 2.4 and its error grows with |x|: scale |dout| (1 + |x|).
        std::vector<double> want(n), scale(n);
        for (size_t i = 0; i < n; ++i) {
            want[i] = value(dout[i]) * gelu_derivative_reference(value(inp[i]));
            scale[i] = std::abs(value(dout[i])) * (1 + std::abs(value(inp[i])));
        }
        const auto dinp = d_dinp.download();
        check_close("gelu'", dinp, want, scale);
        gelu_backward(d_dout.ptr, d_inp.ptr, d_dout.ptr, n, nullptr);  // dinp aliases dout
        CHECK(bitwise_equal(d_dout.download(), dinp));
    }
}

// The register form (rows of up to kLayernormMaxRegisterPacks packs per lane, or a part of a warp per
// row where one pack a lane holds it) and the streaming form do the same arithmetic in the same order:
// the same bits, so a model's results do not depend on which form its width takes. Returns the form the
// launchers pick for C (packs 0: streamed).
LayernormForm check_forms_agree(int N, int C, std::mt19937& rng) {
    const auto inp1 = random_floatX(size_t(N) * C, -1.5f, 1.5f, rng), inp2 = random_floatX(size_t(N) * C, 2.0f, 3.0f, rng);
    const auto weight = random_floatX(C, -1.5f, 1.5f, rng), bias = random_floatX(C, -0.5f, 0.5f, rng);
    DeviceBuffer<floatX> d_inp1(inp1), d_inp2(inp2), d_weight(weight), d_bias(bias);
    struct Out {
        std::vector<floatX> out, residual;
        std::vector<float> mean, rstd;
    };
    auto run = [&](auto packs, auto lanes, bool fused) {
        constexpr int P = decltype(packs)::value, L = decltype(lanes)::value;
        const dim3 grid = layernorm_forward_grid(N, P, L), block(kLayernormForwardBlock);
        DeviceBuffer<floatX> out(inp1.size()), residual(inp1.size());
        DeviceBuffer<float> mean(N), rstd(N);
        if (fused)
            launch<fused_residual_layernorm_forward_kernel<P, L>>(grid, block, 0, nullptr, residual.ptr, out.ptr, mean.ptr,
                                                                  rstd.ptr, d_inp1.ptr, d_inp2.ptr, d_weight.ptr,
                                                                  d_bias.ptr, N, C);
        else
            launch<layernorm_forward_kernel<P, L>>(grid, block, 0, nullptr, out.ptr, mean.ptr, rstd.ptr, d_inp1.ptr,
                                                   d_weight.ptr, d_bias.ptr, N, C);
        return Out{out.download(), fused ? residual.download() : std::vector<floatX>{}, mean.download(), rstd.download()};
    };
    LayernormForm picked{-1, -1};
    with_layernorm_form(C, [&](auto packs, auto lanes) {
        picked = {decltype(packs)::value, decltype(lanes)::value};
        INFO("N = " << N << ", C = " << C << ", " << picked.packs << " packs per lane, " << picked.lanes << " lanes a row");
        if constexpr (decltype(packs)::value > 0) {
            for (const bool fused : {false, true}) {
                INFO((fused ? "fused residual" : "plain"));
                const Out streamed = run(std::integral_constant<int, 0>{}, std::integral_constant<int, 32>{}, fused);
                const Out in_registers = run(packs, lanes, fused);
                CHECK(bitwise_equal(in_registers.out, streamed.out));
                CHECK(bitwise_equal(in_registers.residual, streamed.residual));
                CHECK(in_registers.mean == streamed.mean);
                CHECK(in_registers.rstd == streamed.rstd);
            }
        }
    });
    return picked;
}

TEST_CASE("layernorm forward: the row in registers gives the streaming form's bits") {
    std::mt19937 rng(4);
    std::set<std::pair<int, int>> forms;
    // N = 13 leaves the sub-warp forms' last warp with rows past N, which must compute and store nothing.
    for (int C : {8, 64, 128, 264, 512, 768, 1024, 1600, 2048}) {
        const LayernormForm form = check_forms_agree(13, C, rng);
        forms.insert({form.packs, form.lanes});
    }
    // Every form is met: one pack a lane on 8 or 16 lanes a row (BF16 packs hold 8 values, FP32 4), and
    // 2, 3, 4, 8 packs on 32 lanes.
    const std::set<std::pair<int, int>> want =
        std::is_same_v<floatX, float> ? std::set<std::pair<int, int>>{{1, 8}, {1, 16}, {0, 32}, {2, 32}, {3, 32}, {4, 32}, {8, 32}}
                                      : std::set<std::pair<int, int>>{{1, 8}, {1, 16}, {2, 32}, {3, 32}, {4, 32}, {8, 32}};
    CHECK(forms == want);
}

// The backward pass's batched form (kLayernormRowsPerRound rows a round; blocks of up to
// kLayernormBatchedThreads) and its one-row form (for wider rows) compute the same values in the same
// order: the same dinp and partial sums, bit for bit, including grids whose blocks take several rounds
// and a last round with fewer rows than a round holds.
TEST_CASE("layernorm backward: the batched form gives the one-row form's bits") {
    std::mt19937 rng(5);
    for (const Shape& s : {kCappedBackwardGrid, Shape{37, 768, 2.0f}, Shape{13, 2048, 0.0f}}) {
        INFO("N = " << s.N << ", C = " << s.C);
        const size_t size = size_t(s.N) * s.C;
        const auto inp = random_floatX(size, s.offset - 1.5f, s.offset + 1.5f, rng);
        const auto dout = random_floatX(size, -1.0f, 1.0f, rng), weight = random_floatX(s.C, -1.5f, 1.5f, rng);
        const auto dinp_init = random_floatX(size, -0.5f, 0.5f, rng);
        std::vector<float> mean(s.N), rstd(s.N);
        for (int i = 0; i < s.N; ++i) mean[i] = s.offset + 0.01f * float(i % 7), rstd[i] = 1.1f + 0.001f * float(i % 5);
        DeviceBuffer<floatX> d_inp(inp), d_dout(dout), d_weight(weight);
        DeviceBuffer<float> d_mean(mean), d_rstd(rstd);
        const int blocks = layernorm_backward_blocks(s.N);
        const unsigned threads = layernorm_backward_threads(s.C);
        REQUIRE(threads <= unsigned(kLayernormBatchedThreads));
        // rows a round; with or without the residual's bias sums (their partials after the LayerNorm's).
        auto run = [&](auto rows, auto residual_bias) {
            constexpr bool kResidualBias = decltype(residual_bias)::value;
            DeviceBuffer<floatX> dinp(dinp_init);
            DeviceBuffer<float> partials(layernorm_backward_scratch_floats(s.N, s.C, kResidualBias));
            launch<layernorm_backward_kernel<decltype(rows)::value, kResidualBias>>(dim3(blocks), dim3(threads), 0, nullptr,
                                                                                    dinp.ptr, partials.ptr, d_dout.ptr,
                                                                                    d_inp.ptr, d_weight.ptr, d_mean.ptr,
                                                                                    d_rstd.ptr, s.N, s.C);
            return std::pair(dinp.download(), partials.download());
        };
        using std::integral_constant;
        const auto [dinp_batched, partials_batched] = run(integral_constant<int, kLayernormRowsPerRound>{}, std::false_type{});
        const auto [dinp_plain, partials_plain] = run(integral_constant<int, 1>{}, std::false_type{});
        CHECK(bitwise_equal(dinp_batched, dinp_plain));
        CHECK(partials_batched == partials_plain);
        CHECK(!bitwise_equal(dinp_plain, dinp_init));  // the kernels did add something
        // With the residual's bias sums (kLayernormResidualBiasRowsPerRound rows a round): the same dinp
        // and LayerNorm partials, and the bias partials the same at 4 rows a round.
        static_assert(kLayernormResidualBiasRowsPerRound != kLayernormRowsPerRound, "two round sizes compared");
        const auto [dinp_bias, partials_bias] = run(integral_constant<int, kLayernormResidualBiasRowsPerRound>{}, std::true_type{});
        const auto [dinp_bias4, partials_bias4] = run(integral_constant<int, kLayernormRowsPerRound>{}, std::true_type{});
        CHECK(bitwise_equal(dinp_bias, dinp_plain));
        CHECK(bitwise_equal(dinp_bias4, dinp_plain));
        CHECK(partials_bias == partials_bias4);
        for (int b = 0; b < blocks; ++b)  // a block's row: the LayerNorm's 2C sums, then the two bias sets
            CHECK(std::vector<float>(partials_bias.begin() + size_t(b) * 4 * s.C, partials_bias.begin() + size_t(b) * 4 * s.C + 2 * s.C) ==
                  std::vector<float>(partials_plain.begin() + size_t(b) * 2 * s.C, partials_plain.begin() + size_t(b + 1) * 2 * s.C));
    }
}
