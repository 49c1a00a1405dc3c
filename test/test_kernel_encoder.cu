// Encoder (token + position embeddings) forward and backward against plain double loops fed the
// same floatX-rounded inputs: repeated tokens, every position one token, tokens that never occur,
// wpe rows past T, += semantics, the documented summation order (bitwise), determinism, size checks;
// each also with positions restarting at every document (--doc-positions).
#include "test_util.h"

#include "kernels/encoder.cuh"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

constexpr bool kFp32 = std::is_same_v<floatX, float>;
constexpr double kFp32Unit = 0x1p-24;
// Rounding a result to floatX: at most half an ulp, 2^-8 relative for BF16 (8-bit significand).
constexpr double kStoreUnit = kFp32 ? kFp32Unit : 0x1p-8;

std::vector<floatX> random_floatX(size_t n, float lo, float hi, std::mt19937& rng) {
    std::uniform_real_distribution<float> uniform(lo, hi);
    std::vector<floatX> v(n);
    for (auto& x : v) x = from_float<floatX>(uniform(rng));
    return v;
}

double value(floatX x) { return double(to_float(x)); }

// |got - want| <= kStoreUnit |want| + bound, everywhere; reports the worst element.
void check_close(const std::string& what, const std::vector<floatX>& got, const std::vector<double>& want,
                 const std::vector<double>& bound) {
    REQUIRE(got.size() == want.size());
    double worst_ratio = 0;
    size_t worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double allowed = kStoreUnit * std::abs(want[i]) + bound[i] + 1e-30;
        const double ratio = std::abs(value(got[i]) - want[i]) / allowed;
        if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;  // NaN counts as worst
    }
    INFO(what << ": worst element " << worst << " got " << value(got[worst]) << " want " << want[worst]
              << " (error / tolerance = " << worst_ratio << ")");
    CHECK(worst_ratio <= 1.0);
}


// Gradient accumulation in double: grad[row,:] += dout[position,:] for every (row, position) pair,
// with the rigorous FP32 bound of the kernel's float sum of k terms added to the initial value:
// gamma_(k+1) * (|init| + sum |terms|) <= 1.01 (k + 1) 2^-24 (|init| + sum |terms|) (Higham,
// "Accuracy and Stability of Numerical Algorithms", recursive summation; the 1.01 also covers the
// BF16 store applied to a sum that is already off by that much).
struct GradReference {
    std::vector<double> value, abs_sum, terms;
    GradReference(const std::vector<floatX>& init) : value(init.size()), abs_sum(init.size()), terms(init.size(), 0) {
        for (size_t i = 0; i < init.size(); ++i) value[i] = ::value(init[i]), abs_sum[i] = std::abs(value[i]);
    }
    void add_row(size_t row, const floatX* dout_row, int C) {
        for (int c = 0; c < C; ++c) {
            const size_t i = row * C + c;
            value[i] += ::value(dout_row[c]), abs_sum[i] += std::abs(::value(dout_row[c])), terms[i] += 1;
        }
    }
    std::vector<double> bound() const {
        std::vector<double> b(value.size());
        for (size_t i = 0; i < b.size(); ++i) b[i] = 1.01 * (terms[i] + 1) * kFp32Unit * abs_sum[i];
        return b;
    }
};

// The documented order, in float, exactly as the kernels must do it: the rows summed in increasing
// position (dwte) or increasing b (dwpe) from zero, then added to the old value and rounded once.
struct OrderedSums {
    std::vector<float> sum;
    explicit OrderedSums(size_t n) : sum(n, 0.0f) {}
    void add_row(size_t row, const floatX* dout_row, int C) {
        for (int c = 0; c < C; ++c) sum[row * C + c] += to_float(dout_row[c]);
    }
    std::vector<floatX> applied_to(const std::vector<floatX>& init) const {
        std::vector<floatX> r(init.size());
        for (size_t i = 0; i < r.size(); ++i) r[i] = from_float<floatX>(to_float(init[i]) + sum[i]);
        return r;
    }
};

struct Case {
    const char* name;
    int B, T, C, V;
    std::vector<int> tokens;
};

// V = 50 and maxT = T + 3 throughout, except the large case.
std::vector<Case> backward_cases() {
    std::mt19937 rng(7);
    std::vector<Case> cases;
    auto random_tokens = [&](int n, int lo, int hi) {
        std::uniform_int_distribution<int> pick(lo, hi);
        std::vector<int> t(n);
        for (auto& x : t) x = pick(rng);
        return t;
    };
    // Tokens 0..39 only (40..49 never occur), token 7 at every third position, V - 1 at the end.
    Case mixed{"repeats and unused tokens", 3, 37, 200, 50, random_tokens(3 * 37, 0, 39)};
    for (size_t i = 0; i < mixed.tokens.size(); i += 3) mixed.tokens[i] = 7;
    mixed.tokens.back() = 49;
    cases.push_back(mixed);
    cases.push_back({"every position one token", 3, 37, 264, 50, std::vector<int>(3 * 37, 3)});
    Case distinct{"all tokens distinct", 2, 19, 8, 50, {}};
    for (int i = 0; i < 38; ++i) distinct.tokens.push_back((i * 17) % 50);
    cases.push_back(distinct);
    cases.push_back({"GPT-2 1.5B width", 2, 5, 1600, 50, random_tokens(10, 0, 4)});
    // Many groups of very different sizes: a skewed (Zipf-like) token distribution.
    Case skewed{"4096 positions, skewed tokens", 4, 1024, 16, 300, {}};
    std::exponential_distribution<double> decay(0.02);
    for (int i = 0; i < 4096; ++i) skewed.tokens.push_back(std::min(299, int(decay(rng))));
    cases.push_back(skewed);
    // More distinct tokens (about 2,300) than the backward launches blocks (kEncoderGroupBlocks):
    // each block takes several groups.
    cases.push_back({"more groups than blocks", 3, 1000, 8, 5000, random_tokens(3000, 0, 4999)});
    return cases;
}

// Positions of the tokens (the token_positions array; `plain` passes none): t; with documents
// (--doc-positions) t minus the start of t's document, which starts at the last `eot` at or before t,
// or at the row's start (host/documents.h), by brute force (the cases' EOT is row 0's second token: in
// "every position one token" every position is 0); or two chunks of a sequence of 2T, as context
// parallelism's rank 0 of 2 holds it (parallel/context.h): the first T/2 positions and, after a gap,
// the last ones, up to 2T - 1 (beyond the row's T).
enum class Positions { plain, documents, two_chunks };
std::vector<int> positions_of(const Case& s, Positions mode) {
    const int eot = s.tokens[1];
    std::vector<int> positions;
    for (int b = 0; b < s.B; ++b)
        for (int t = 0; t < s.T; ++t) {
            int start = 0;
            for (int p = 0; p <= t && mode == Positions::documents; ++p)
                if (s.tokens[size_t(b) * s.T + p] == eot) start = p;
            positions.push_back(mode == Positions::two_chunks && t >= s.T / 2 ? t + s.T : t - start);
        }
    return positions;
}
constexpr Positions kPositionModes[] = {Positions::plain, Positions::documents, Positions::two_chunks};
int wpe_rows_of(const Case& s, Positions mode) { return (mode == Positions::two_chunks ? 2 * s.T : s.T) + 3; }

}  // namespace

TEST_CASE("encoder_forward adds the token's wte row and the position's wpe row, positions restarting per document") {
    std::mt19937 rng(1);
    for (const Positions mode : kPositionModes)
    for (const Case& s : backward_cases()) {
        INFO(s.name << ": B = " << s.B << ", T = " << s.T << ", C = " << s.C << ", positions mode " << int(mode));
        const int maxT = wpe_rows_of(s, mode);
        const auto wte = random_floatX(size_t(s.V) * s.C, -1.0f, 1.0f, rng);
        const auto wpe = random_floatX(size_t(maxT) * s.C, -0.3f, 0.3f, rng);
        const std::vector<int> positions = positions_of(s, mode);
        DeviceBuffer<int> d_inp(s.tokens), d_positions(positions);
        DeviceBuffer<floatX> d_wte(wte), d_wpe(wpe), d_out(s.tokens.size() * s.C);
        d_out.fill_bytes(0xFF);
        encoder_forward(d_out.ptr, d_inp.ptr, d_wte.ptr, d_wpe.ptr, s.B, s.T, s.C, nullptr,
                        mode != Positions::plain ? d_positions.ptr : nullptr);
        // One float addition of two floatX values, then one rounding: within the store unit.
        std::vector<double> want(d_out.count), bound(d_out.count);
        for (int b = 0; b < s.B; ++b)
            for (int t = 0; t < s.T; ++t)
                for (int c = 0; c < s.C; ++c) {
                    const size_t i = (size_t(b) * s.T + t) * s.C + c;
                    const double e = value(wte[size_t(s.tokens[b * s.T + t]) * s.C + c]),
                                 p = value(wpe[size_t(positions[size_t(b) * s.T + t]) * s.C + c]);
                    want[i] = e + p;
                    bound[i] = kFp32Unit * (std::abs(e) + std::abs(p));  // the float sum's rounding (BF16 build)
                }
        check_close("out", d_out.download(), want, bound);
    }
}

TEST_CASE("encoder_backward accumulates dwte per token and dwpe per position, deterministically") {
    std::mt19937 rng(2);
    for (const Positions mode : kPositionModes)
    for (const Case& s : backward_cases()) {
        INFO(s.name << ": B = " << s.B << ", T = " << s.T << ", C = " << s.C << ", V = " << s.V << ", positions mode "
                    << int(mode));
        const int maxT = wpe_rows_of(s, mode), N = s.B * s.T;
        const bool documents = mode != Positions::plain;  // a positions array is passed
        const std::vector<int> positions = positions_of(s, mode);
        const auto dout = random_floatX(size_t(N) * s.C, -1.0f, 1.0f, rng);
        // Non-zero gradients already in place: the kernels must add to them.
        const auto dwte_init = random_floatX(size_t(s.V) * s.C, -2.0f, 2.0f, rng);
        const auto dwpe_init = random_floatX(size_t(maxT) * s.C, -2.0f, 2.0f, rng);
        DeviceBuffer<floatX> d_dout(dout), d_dwte(dwte_init), d_dwpe(dwpe_init);
        DeviceBuffer<int> d_scratch(encoder_backward_scratch_ints(s.B, s.T, documents));  // exact size: ASan sees overruns
        d_scratch.fill_bytes(0xFF);
        auto run = [&] {
            encoder_backward(d_dwte.ptr, d_dwpe.ptr, d_scratch.ptr, d_dout.ptr, s.tokens.data(), s.B, s.T, s.C, nullptr,
                             documents ? positions.data() : nullptr);
        };
        auto references = [&](const std::vector<floatX>& dwte0, const std::vector<floatX>& dwpe0) {
            GradReference wte(dwte0), wpe(dwpe0);
            OrderedSums wte_order(dwte0.size()), wpe_order(dwpe0.size());
            for (int p = 0; p < N; ++p) {  // increasing position: b * T + t
                wte.add_row(s.tokens[p], &dout[size_t(p) * s.C], s.C);
                wte_order.add_row(s.tokens[p], &dout[size_t(p) * s.C], s.C);
            }
            // dwpe: increasing b for each t; with token positions grouped by position like dwte, so
            // increasing b * T + t within a position's sum (the same order for equal positions).
            for (int b = 0; b < s.B; ++b)
                for (int t = 0; t < s.T; ++t) {
                    const size_t p = size_t(b) * s.T + t;
                    wpe.add_row(positions[p], &dout[p * s.C], s.C);
                    wpe_order.add_row(positions[p], &dout[p * s.C], s.C);
                }
            return std::tuple(wte, wpe, wte_order.applied_to(dwte0), wpe_order.applied_to(dwpe0));
        };

        run();
        const auto dwte1 = d_dwte.download(), dwpe1 = d_dwpe.download();
        {
            const auto [wte, wpe, wte_exact, wpe_exact] = references(dwte_init, dwpe_init);
            check_close("dwte", dwte1, wte.value, wte.bound());
            check_close("dwpe", dwpe1, wpe.value, wpe.bound());
            // IEEE float additions in the documented order give these exact bits (on a GPU too:
            // there is no multiply to contract into an FMA).
            CHECK(bitwise_equal(dwte1, wte_exact));
            CHECK(bitwise_equal(dwpe1, wpe_exact));
        }
        // Rows of tokens that never occur, and wpe rows past T, keep their bits.
        std::vector<bool> occurs(s.V, false);
        for (int token : s.tokens) occurs[token] = true;
        for (int v = 0; v < s.V; ++v) {
            if (occurs[v]) continue;
            INFO("token " << v << " does not occur");
            CHECK(std::memcmp(&dwte1[size_t(v) * s.C], &dwte_init[size_t(v) * s.C], s.C * sizeof(floatX)) == 0);
        }
        for (int t = 0; t < maxT; ++t) {  // wpe rows no token's position reaches (past T; with documents, more)
            if (std::find(positions.begin(), positions.end(), t) != positions.end()) continue;
            INFO("position " << t << " does not occur");
            CHECK(std::memcmp(&dwpe1[size_t(t) * s.C], &dwpe_init[size_t(t) * s.C], s.C * sizeof(floatX)) == 0);
        }

        // A second call adds the same gradients onto the first call's results.
        run();
        {
            const auto [wte, wpe, wte_exact, wpe_exact] = references(dwte1, dwpe1);
            check_close("dwte (second call)", d_dwte.download(), wte.value, wte.bound());
            check_close("dwpe (second call)", d_dwpe.download(), wpe.value, wpe.bound());
        }

        // Determinism: the first call again from the same state (the scratch holds the last grouping).
        d_dwte.upload(dwte_init), d_dwpe.upload(dwpe_init);
        run();
        CHECK(bitwise_equal(d_dwte.download(), dwte1));
        CHECK(bitwise_equal(d_dwpe.download(), dwpe1));
    }
}

// Vocabulary-parallel (parallel/tensor.h): ranks holding wte rows [r rows, (r+1) rows) of a vocabulary
// padded past V, rank 0 alone adding positions. Their outputs summed (as the tensor group's all-reduce
// sums them: one non-zero token part per position, so the sum is exact) are the whole embedding, bit
// for bit; each rank's dwte rows are the whole dwte's, bit for bit, and the rest of its rows untouched.
TEST_CASE("encoder: vocabulary shards sum to the whole embedding and take their rows of dwte") {
    std::mt19937 rng(3);
    const Case s = backward_cases()[0];  // repeats and unused tokens
    const int maxT = s.T, N = s.B * s.T;
    for (const int tp : {2, 3}) {
        const int rows = (s.V + tp - 1) / tp / 8 * 8 + 8;  // padded: rows * tp > V
        INFO("tp " << tp << ", " << rows << " rows each");
        auto wte = random_floatX(size_t(rows) * tp * s.C, -1.0f, 1.0f, rng);
        std::fill(wte.begin() + ptrdiff_t(size_t(s.V) * s.C), wte.end(), from_float<floatX>(0.0f));  // padding rows
        const auto wpe = random_floatX(size_t(maxT) * s.C, -0.3f, 0.3f, rng);
        const auto dout = random_floatX(size_t(N) * s.C, -1.0f, 1.0f, rng);
        DeviceBuffer<int> d_inp(s.tokens);
        DeviceBuffer<floatX> d_wte(wte), d_wpe(wpe), d_out(size_t(N) * s.C), d_dout(dout), d_dwpe(size_t(maxT) * s.C);
        DeviceBuffer<int> d_scratch(encoder_backward_scratch_ints(s.B, s.T));
        encoder_forward(d_out.ptr, d_inp.ptr, d_wte.ptr, d_wpe.ptr, s.B, s.T, s.C, nullptr);
        const std::vector<floatX> whole = d_out.download();
        DeviceBuffer<floatX> d_dwte(wte.size());
        d_dwte.fill_bytes(0), d_dwpe.fill_bytes(0);
        encoder_backward(d_dwte.ptr, d_dwpe.ptr, d_scratch.ptr, d_dout.ptr, s.tokens.data(), s.B, s.T, s.C, nullptr);
        const std::vector<floatX> whole_dwte = d_dwte.download(), whole_dwpe = d_dwpe.download();

        std::vector<float> sum(size_t(N) * s.C, 0.0f);
        for (int r = 0; r < tp; ++r) {
            const size_t first = size_t(r) * rows;
            DeviceBuffer<floatX> d_shard(std::vector<floatX>(wte.begin() + ptrdiff_t(first * s.C),
                                                             wte.begin() + ptrdiff_t((first + rows) * s.C)));
            d_out.fill_bytes(0xFF);
            encoder_forward(d_out.ptr, d_inp.ptr, d_shard.ptr, r == 0 ? d_wpe.ptr : nullptr, s.B, s.T, s.C, nullptr, nullptr,
                            int(first), rows);
            const std::vector<floatX> part = d_out.download();
            for (size_t i = 0; i < sum.size(); ++i) sum[i] += to_float(part[i]);
            // The shard's dwte: its rows of the whole one (both from zeros); rows of tokens that do not
            // occur keep their (random) values.
            std::vector<bool> occurs(size_t(rows), false);
            for (int token : s.tokens)
                if (token >= int(first) && token < int(first) + rows) occurs[size_t(token) - first] = true;
            auto init = random_floatX(size_t(rows) * s.C, -2.0f, 2.0f, rng);
            for (size_t row = 0; row < size_t(rows); ++row)
                if (occurs[row]) std::fill_n(init.begin() + ptrdiff_t(row * s.C), s.C, from_float<floatX>(0.0f));
            DeviceBuffer<floatX> d_shard_dwte(init);
            d_dwpe.fill_bytes(0);
            encoder_backward(d_shard_dwte.ptr, d_dwpe.ptr, d_scratch.ptr, d_dout.ptr, s.tokens.data(), s.B, s.T, s.C, nullptr,
                             nullptr, int(first), rows);
            const std::vector<floatX> got = d_shard_dwte.download();
            size_t wrong = 0;
            for (size_t row = 0; row < size_t(rows); ++row) {
                const floatX* want = occurs[row] ? &whole_dwte[(first + row) * s.C] : &init[row * s.C];
                wrong += std::memcmp(&got[row * s.C], want, s.C * sizeof(floatX)) != 0;
            }
            CHECK(wrong == 0);
            CHECK(bitwise_equal(d_dwpe.download(), whole_dwpe));  // wpe: replicated, every rank the same
        }
        std::vector<floatX> rounded(sum.size());
        for (size_t i = 0; i < sum.size(); ++i) rounded[i] = from_float<floatX>(sum[i]);
        CHECK(bitwise_equal(rounded, whole));
    }
}

TEST_CASE("encoder_requirements accepts positive multiples of 8 and names a bad C") {
    for (int C : {8, 768, 1600, 12288}) CHECK(encoder_requirements(C).empty());
    CHECK(encoder_requirements(100) == "encoder: C = 100 is not a positive multiple of 8");
    CHECK(encoder_requirements(0).find("C = 0") != std::string::npos);
    CHECK(encoder_backward_scratch_ints(4, 1024) == 3 * 4096 + 2);
    CHECK(encoder_backward_scratch_ints(4, 1024, true) == 2 * (3 * 4096 + 2));
}
