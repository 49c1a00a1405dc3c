// fused_classifier (kernels/classifier.cuh) against a plain double softmax cross-entropy on the same
// floatX-rounded logits: losses and in-place dlogits with ignored (-1) rows and a partial last
// 16-byte chunk (V = 301), padding columns that must never enter the softmax, write_dlogits off,
// logits of +-80, rows long enough for many chunks per thread (a thread's max in its first or its
// last chunk), GPT-2's row width, determinism, and the size requirements. And the vocabulary-parallel
// pair (tensor parallelism) on the same reference. Every case runs with the threads a row each build
// chooses (classifier_block_threads: 64 in the emulator, 1024 on a GPU for GPT-2's rows) and with 160
// (a vocabulary shard's choice on a GPU: one thread a chunk, whole warps).
#include "test_util.h"

#include "kernels/classifier.cuh"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr double kFp32Unit = 0x1p-24;  // unit roundoff of FP32 (24-bit significand)
// dlogits are rounded once to floatX (nearest even): BF16's unit roundoff 2^-8 (8-bit significand).
double output_unit() {
    if constexpr (std::is_same_v<floatX, float>) return 0.0;
    else return 0x1p-8;
}
// exp(x - M) underflows in FP32 once x - M < -87 (and leaves the normal range below 2^-126): an
// absolute error of at most 2^-126 per probability, which the relative bounds do not cover.
constexpr double kUnderflow = 0x1p-126;

// Threads a row: the emulator's, a shard's on a GPU, the GPU's for wide rows.
constexpr int kThreadChoices[] = {kClassifierEmulatorThreads, 160, kClassifierMaxThreads};

struct Problem {
    int N, V, Vp;
    std::vector<floatX> logits;  // N x Vp, padding poisoned
    std::vector<int> targets;
    float dloss;
};

// Logits uniform in [-scale, scale]; padding columns alternate NaN and 1000, so a softmax that
// read them would give NaN or a wrong max; every 7th row (from row 3) is ignored (target -1).
Problem make_problem(int N, int V, int Vp, float scale, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-scale, scale);
    Problem p{N, V, Vp, std::vector<floatX>(size_t(N) * Vp), std::vector<int>(N), 0.0f};
    for (int i = 0; i < N; ++i)
        for (int j = 0; j < Vp; ++j)
            p.logits[size_t(i) * Vp + j] = from_float<floatX>(
                j < V ? uniform(rng) : (j % 2 ? std::numeric_limits<float>::quiet_NaN() : 1000.0f));
    std::uniform_int_distribution<int> column(0, V - 1);
    int valid = 0;
    for (int i = 0; i < N; ++i) {
        p.targets[i] = i % 7 == 3 ? -1 : i == 0 ? 0 : i == 1 ? V - 1 : i == 2 ? V / 8 * 8 : column(rng);
        valid += p.targets[i] != -1;
    }
    p.dloss = 1.0f / float(3 * valid);  // as if the optimizer step had 3 such micro-steps
    return p;
}

struct Result {
    std::vector<float> losses;
    std::vector<floatX> logits;
};

Result run(const Problem& p, bool write_dlogits, int threads) {
    DeviceBuffer<floatX> logits(p.logits);
    DeviceBuffer<float> losses(p.N);
    DeviceBuffer<int> targets(p.targets);
    DeviceBuffer<float> dloss(std::vector<float>{p.dloss});
    losses.fill_bytes(0xFF);  // NaN: every loss must be written
    fused_classifier(logits.ptr, losses.ptr, targets.ptr, dloss.ptr, p.N, p.V, p.Vp, write_dlogits, 0, threads);
    return {losses.download(), logits.download()};
}

// Checks losses (and dlogits) against the double reference; bounds explained inline. Measured
// worst error/bound: losses 0.001-0.11; dlogits BF16 0.99 (output rounding), FP32 0.07-0.49.
void check(const Problem& p, const Result& r, bool write_dlogits) {
    size_t loss_failures = 0, grad_failures = 0;
    double worst_loss = 0, worst_grad = 0;
    for (int i = 0; i < p.N; ++i) {
        const floatX* x = &p.logits[size_t(i) * p.Vp];
        const floatX* got = &r.logits[size_t(i) * p.Vp];
        const int t = p.targets[i];
        INFO("row " << i << ", target " << t);
        if (t == -1) {
            REQUIRE(r.losses[i] == 0.0f);
            if (write_dlogits)
                for (int j = 0; j < p.Vp; ++j) REQUIRE(to_float(got[j]) == 0.0f);
            continue;
        }
        double max = -INFINITY, sum = 0;
        for (int j = 0; j < p.V; ++j) max = std::max(max, double(to_float(x[j])));
        for (int j = 0; j < p.V; ++j) sum += std::exp(to_float(x[j]) - max);
        const double x_t = to_float(x[t]), loss = max + std::log(sum) - x_t;
        // FP32 arithmetic on the same inputs in both builds: the sum of V exponentials (each within
        // a few units) is within (V + 8) units relative, which log turns into absolute error; the
        // two additions round at most |M| + |x_t| + |loss|.
        const double loss_bound = kFp32Unit * ((p.V + 8) + 4 * (std::fabs(max) + std::fabs(x_t) + std::fabs(loss)));
        const double loss_error = std::fabs(r.losses[i] - loss);
        loss_failures += !(loss_error <= loss_bound);
        if (new_worst(loss_error / loss_bound, worst_loss)) worst_loss = loss_error / loss_bound;  // NaN counts as worst
        if (!write_dlogits) continue;
        for (int j = 0; j < p.Vp; ++j) {
            const double g = to_float(got[j]);
            if (j >= p.V) {
                REQUIRE(g == 0.0);  // padding: exactly zero
                continue;
            }
            const double prob = std::exp(to_float(x[j]) - max) / sum, indicator = j == t;
            const double want = p.dloss * (prob - indicator);
            // p in FP32: exp of a rounded x - M (|x - M| units), exp itself, the sum (V + 8 units),
            // the reciprocal and product: relative (|x - M| + V + 12) units; then p - [j == t] and
            // the dloss product round once each. Underflow is absolute. BF16 rounds the result.
            const double fp32_bound =
                p.dloss * (prob * (std::fabs(to_float(x[j]) - max) + p.V + 12) * kFp32Unit +
                           2 * kFp32Unit * std::fabs(prob - indicator) + kUnderflow);
            const double bound = fp32_bound * (1 + output_unit()) + output_unit() * std::fabs(want);
            grad_failures += !(std::fabs(g - want) <= bound);
            if (new_worst(std::fabs(g - want) / bound, worst_grad)) worst_grad = std::fabs(g - want) / bound;  // NaN: worst
        }
    }
    INFO("worst loss error/bound " << worst_loss << ", worst dlogits error/bound " << worst_grad);
    CHECK(loss_failures == 0);
    CHECK(grad_failures == 0);
}


}  // namespace

TEST_CASE("fused_classifier: losses and dlogits match the double reference, ignored rows and padding") {
    const Problem p = make_problem(111, 301, 384, 6.0f, 1);
    for (const int threads : kThreadChoices) {
        INFO(threads << " threads a row");
        check(p, run(p, true, threads), true);
    }
}

TEST_CASE("fused_classifier: write_dlogits false gives the losses and leaves the logits untouched") {
    const Problem p = make_problem(111, 301, 384, 6.0f, 2);
    for (const int threads : kThreadChoices) {
        INFO(threads << " threads a row");
        const Result r = run(p, false, threads);
        check(p, r, false);
        CHECK(bitwise_equal(r.logits, p.logits));
    }
}

TEST_CASE("fused_classifier: logits of +-80 stay finite and accurate") {
    for (const int threads : kThreadChoices) {
    INFO(threads << " threads a row");
    Problem p = make_problem(37, 301, 384, 80.0f, 3);
    auto row = [&](int i) { return &p.logits[size_t(i) * p.Vp]; };
    for (int j = 0; j < p.V; ++j) row(4)[j] = from_float<floatX>(80.0f);  // all tied: loss = log V
    for (int j = 0; j < p.V; ++j) row(5)[j] = from_float<floatX>(j == p.targets[5] ? 80.0f : -80.0f);  // loss ~ 0
    for (int j = 0; j < p.V; ++j) row(6)[j] = from_float<floatX>(j == p.targets[6] ? -80.0f : 80.0f);  // loss ~ 160 + log(V-1)
    const Result r = run(p, true, threads);
    check(p, r, true);
    for (float loss : r.losses) CHECK(std::isfinite(loss));
    CHECK(std::fabs(r.losses[4] - std::log(double(p.V))) < 1e-5);
    }
}

TEST_CASE("fused_classifier: rows of many chunks per thread, and GPT-2's rows") {
    // threads x 8 columns a sweep: V = 20001 gives each thread about 39 chunks at 64 threads, 2.4 at
    // 1024; in rising rows a thread's max is in its last chunk, in falling rows its first.
    Problem p = make_problem(5, 20001, 20008, 4.0f, 4);
    for (int j = 0; j < p.V; ++j) {
        p.logits[size_t(1) * p.Vp + j] = from_float<floatX>(-10.0f + 20.0f * j / p.V);
        p.logits[size_t(2) * p.Vp + j] = from_float<floatX>(10.0f - 20.0f * j / p.V);
    }
    // GPT-2's vocabulary, padded as the model pads it: 6.1 chunks a thread at 1024 (in BF16).
    const Problem gpt2 = make_problem(4, 50257, 50304, 4.0f, 8);
    for (const int threads : kThreadChoices) {
        INFO(threads << " threads a row");
        check(p, run(p, true, threads), true);
        check(gpt2, run(gpt2, true, threads), true);
    }
}

TEST_CASE("fused_classifier: threads whose logits are all -inf add nothing") {
    for (const int threads : kThreadChoices) {
    INFO(threads << " threads a row");
    // Rows of 1.5 sweeps (a sweep: one 16-byte chunk a thread), the first sweep all -inf:
    // the threads whose second chunk would lie past V see only -inf (a max of -inf, and exp(-inf -
    // -inf) would be NaN). exp(x - M) of -1e4 is 0 in FP32 as exp(-inf) is, so the same rows with
    // -1e4 there must give the same bits, and those the double reference's values.
    const int sweep = threads * Packed128<floatX>::size, V = sweep * 3 / 2 - 4;
    Problem with_inf = make_problem(4, V, V + 4, 4.0f, 6), with_large = with_inf;
    for (int i = 0; i < with_inf.N; ++i) {
        with_inf.targets[i] = with_large.targets[i] = sweep + i;  // a finite column
        for (int j = 0; j < sweep; ++j) {
            with_inf.logits[size_t(i) * with_inf.Vp + j] = from_float<floatX>(-INFINITY);
            with_large.logits[size_t(i) * with_large.Vp + j] = from_float<floatX>(-1e4f);
        }
    }
    const Result a = run(with_inf, true, threads), b = run(with_large, true, threads);
    for (float loss : a.losses) CHECK(std::isfinite(loss));
    CHECK(bitwise_equal(a.losses, b.losses));
    CHECK(bitwise_equal(a.logits, b.logits));
    check(with_large, b, true);
    }
}

TEST_CASE("fused_classifier is deterministic") {
    const Problem p = make_problem(111, 301, 384, 6.0f, 5);
    for (const int threads : kThreadChoices) {
        INFO(threads << " threads a row");
        const Result a = run(p, true, threads), b = run(p, true, threads);
        CHECK(bitwise_equal(a.losses, b.losses));
        CHECK(bitwise_equal(a.logits, b.logits));
    }
}

// The vocabulary-parallel pair (classifier_shard_stats, classifier_shard_finish): the problem's columns
// split into tp shards of Vr (a multiple of 8; the last shards padded past V, one of them entirely
// padding at tp 4), each shard's statistics gathered in rank order as the all-gather leaves them, then
// every shard finished: the losses alike on every shard (bitwise) and, with the shards' dlogits put
// together, within the same bounds of the same double reference as the fused kernel.
TEST_CASE("vocabulary-parallel classifier: shards give the reference's losses and dlogits") {
    for (const int threads : kThreadChoices)
    for (const auto& [tp, Vr] : {std::pair{2, 152}, std::pair{3, 104}, std::pair{4, 104}}) {
        const Problem p = make_problem(29, 301, 304, 12.0f, uint32_t(40 + tp));
        INFO("tp " << tp << ", Vr " << Vr << ", " << threads << " threads a row");
        DeviceBuffer<int> targets(p.targets);
        DeviceBuffer<float> dloss(std::vector<float>{p.dloss});
        DeviceBuffer<float> gathered(size_t(tp) * p.N * kClassifierStats);
        gathered.fill_bytes(0xFF);  // NaN: every statistic must be written
        std::vector<std::unique_ptr<DeviceBuffer<floatX>>> shards;
        for (int r = 0; r < tp; ++r) {
            std::vector<floatX> shard(size_t(p.N) * Vr);
            for (int i = 0; i < p.N; ++i)
                for (int j = 0; j < Vr; ++j) {
                    const int column = r * Vr + j;  // past Vp: poisoned like the padding
                    shard[size_t(i) * Vr + j] = column < p.Vp ? p.logits[size_t(i) * p.Vp + column]
                                                              : from_float<floatX>(std::numeric_limits<float>::quiet_NaN());
                }
            shards.push_back(std::make_unique<DeviceBuffer<floatX>>(shard));
            classifier_shard_stats(gathered.ptr + size_t(r) * p.N * kClassifierStats, shards.back()->ptr, targets.ptr, p.N,
                                   r * Vr, p.V, Vr, 0, threads);
        }
        Result whole{{}, std::vector<floatX>(size_t(p.N) * p.Vp)};
        for (int r = 0; r < tp; ++r) {
            DeviceBuffer<float> losses(p.N);
            losses.fill_bytes(0xFF);
            classifier_shard_finish(shards[r]->ptr, losses.ptr, gathered.ptr, targets.ptr, dloss.ptr, p.N, tp, r * Vr, p.V, Vr,
                                    true, 0, threads);
            const std::vector<float> got = losses.download();
            if (r == 0) whole.losses = got;
            CHECK(bitwise_equal(got, whole.losses));
            const std::vector<floatX> grad = shards[r]->download();
            for (int i = 0; i < p.N; ++i)
                for (int j = 0; j < Vr; ++j) {
                    const int column = r * Vr + j;
                    if (column < p.Vp) whole.logits[size_t(i) * p.Vp + column] = grad[size_t(i) * Vr + j];
                    else if (to_float(grad[size_t(i) * Vr + j]) != 0.0f) FAIL("padding past Vp got a gradient");
                }
        }
        check(p, whole, true);
    }
}

TEST_CASE("classifier_requirements rejects unsupported sizes") {
    CHECK(classifier_requirements(301, 384).empty());
    CHECK(classifier_requirements(50257, 50304).empty());
    CHECK(classifier_requirements(301, 300).find("V must not exceed Vp") != std::string::npos);
    CHECK(classifier_requirements(301, 303).find("Vp is not a multiple of 8") != std::string::npos);
    CHECK(classifier_requirements(0, 8).find("V must be at least 1") != std::string::npos);
}

TEST_CASE("classifier threads a row: 64 where the emulator runs the kernels, a GPU's L2-sized choice, others refused") {
    constexpr int kPack = Packed128<floatX>::size;
    // On a GPU (and in launches recorded for a GPU's roofline): one thread a 16-byte chunk in whole
    // warps, at least 64 and at most 1024. GPT-2's padded vocabulary: 1024 in both precisions.
    const auto gpu_choice = [](int columns) {
        return std::clamp((columns / kPack + 31) / 32 * 32, kClassifierEmulatorThreads, kClassifierMaxThreads);
    };
    CHECK(gpu_choice(50304) == 1024);
    CHECK(gpu_choice(6288) == (kPack == 8 ? 800 : 1024));  // a shard of 8 (tensor parallelism)
#ifdef __CUDACC__
    for (int columns : {8, 6288, 50304}) CHECK(classifier_block_threads(columns) == gpu_choice(columns));
#else
    for (int columns : {8, 6288, 50304}) CHECK(classifier_block_threads(columns) == kClassifierEmulatorThreads);
    cuemu::set_record_only(true);
    const int recorded[] = {classifier_block_threads(8), classifier_block_threads(6288), classifier_block_threads(50304)};
    cuemu::set_record_only(false);
    CHECK(recorded[0] == 64);
    CHECK(recorded[1] == gpu_choice(6288));
    CHECK(recorded[2] == 1024);
#endif
    const Problem p = make_problem(2, 301, 384, 6.0f, 9);
    DeviceBuffer<floatX> logits(p.logits);
    DeviceBuffer<float> losses(p.N), dloss(1);
    DeviceBuffer<int> targets(p.targets);
    for (const int threads : {48, 16, 2048})
        CHECK_THROWS_WITH(fused_classifier(logits.ptr, losses.ptr, targets.ptr, dloss.ptr, p.N, p.V, p.Vp, true, 0, threads),
                          Catch::Matchers::Contains("fused_classifier") &&
                              Catch::Matchers::Contains(std::to_string(threads) + " threads a row: not a multiple of 32 in [32, 1024]"));
}
