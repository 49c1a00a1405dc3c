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
        if (new_worst(ratio, worst_ratio)) worst_ratio = ratio, worst = i;  // NaN counts as worst
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

// The documented order, in float, exactly as the kernels must do it: a key's rows in increasing
// position (dwte) or increasing b (dwpe) summed from zero; with more than kEncoderRowsPerPiece rows,
// each piece of that many rows summed from zero and the pieces' sums added in order from zero; then
// the sum added to the old value and rounded once.
struct OrderedSums {
    std::vector<float> sum;
    std::vector<std::vector<const floatX*>> rows;  // per key, its dout rows in order
    int C;
    bool pieces;  // false: dwpe by t without token positions (encoder_backward_wpe_kernel: B rows, no pieces)
    OrderedSums(size_t keys, int C, bool pieces = true) : sum(keys * size_t(C), 0.0f), rows(keys), C(C), pieces(pieces) {}
    void add_row(size_t key, const floatX* dout_row) { rows[key].push_back(dout_row); }
    std::vector<floatX> applied_to(const std::vector<floatX>& init) {
        for (size_t key = 0; key < rows.size(); ++key) {
            const std::vector<const floatX*>& r = rows[key];
            const bool split = pieces && r.size() > size_t(kEncoderRowsPerPiece);
            const size_t piece_rows = split ? size_t(kEncoderRowsPerPiece) : std::max<size_t>(r.size(), 1);
            for (size_t first = 0; first < r.size(); first += piece_rows)
                for (int c = 0; c < C; ++c) {
                    float piece = 0.0f;
                    for (size_t i = first; i < std::min(r.size(), first + piece_rows); ++i) piece += to_float(r[i][c]);
                    float& total = sum[key * C + c];
                    total = split ? total + piece : piece;  // a whole group's sum is the kernel's own
                }
        }
        std::vector<floatX> out(init.size());
        for (size_t i = 0; i < out.size(); ++i) out[i] = from_float<floatX>(to_float(init[i]) + sum[i]);
        return out;
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
    // Pieces (kEncoderRowsPerPiece = 64): token 5 at half the positions (2,048 rows: 32 pieces), token 6
    // at 64 (one whole item) and token 7 at 65 (64 + 1), scattered; the rest spread over 40 tokens. Its
    // second token, 5, is the documents' EOT: short documents, so position groups are split too.
    Case pieces{"pieces of frequent tokens", 4, 1024, 24, 60, random_tokens(4096, 20, 59)};
    std::vector<int> order;  // position 1 first (token 5), the others shuffled
    for (int i = 0; i < 4096; ++i)
        if (i != 1) order.push_back(i);
    std::shuffle(order.begin(), order.end(), rng);
    order.insert(order.begin(), 1);
    for (int i = 0; i < 2048 + 64 + 65; ++i) pieces.tokens[size_t(order[size_t(i)])] = i < 2048 ? 5 : i < 2048 + 64 ? 6 : 7;
    cases.push_back(pieces);
    // More split groups (1,040 tokens of 66 rows each: 2 pieces) than the combining kernel launches
    // blocks (kEncoderGroupBlocks; N = 69,632 allows 1,071 split groups): each block takes several.
    Case many_splits{"more split groups than blocks", 17, 4096, 8, 1100, random_tokens(17 * 4096, 1040, 1099)};
    for (int i = 0; i < 1040 * 66; ++i) many_splits.tokens[size_t(i)] = i / 66;
    cases.push_back(many_splits);
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
        // The pieces' slots, exact size too, NaN until written: a slot read before it is written shows.
        DeviceBuffer<float> d_partials(std::max<size_t>(encoder_backward_partial_floats(s.B, s.T, s.C), 1));
        d_partials.fill_bytes(0xFF);
        auto run = [&] {
            encoder_backward(d_dwte.ptr, d_dwpe.ptr, d_scratch.ptr, d_partials.ptr, d_dout.ptr, s.tokens.data(), s.B, s.T, s.C,
                             nullptr, documents ? positions.data() : nullptr);
        };
        auto references = [&](const std::vector<floatX>& dwte0, const std::vector<floatX>& dwpe0) {
            GradReference wte(dwte0), wpe(dwpe0);
            OrderedSums wte_order(dwte0.size() / s.C, s.C), wpe_order(dwpe0.size() / s.C, s.C, documents);
            for (int p = 0; p < N; ++p) {  // increasing position: b * T + t
                wte.add_row(s.tokens[p], &dout[size_t(p) * s.C], s.C);
                wte_order.add_row(s.tokens[p], &dout[size_t(p) * s.C]);
            }
            // dwpe: increasing b for each t; with token positions grouped by position like dwte, so
            // increasing b * T + t within a position's sum (the same order for equal positions).
            for (int b = 0; b < s.B; ++b)
                for (int t = 0; t < s.T; ++t) {
                    const size_t p = size_t(b) * s.T + t;
                    wpe.add_row(positions[p], &dout[p * s.C], s.C);
                    wpe_order.add_row(positions[p], &dout[p * s.C]);
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
        DeviceBuffer<float> d_partials(std::max<size_t>(encoder_backward_partial_floats(s.B, s.T, s.C), 1));
        encoder_forward(d_out.ptr, d_inp.ptr, d_wte.ptr, d_wpe.ptr, s.B, s.T, s.C, nullptr);
        const std::vector<floatX> whole = d_out.download();
        DeviceBuffer<floatX> d_dwte(wte.size());
        d_dwte.fill_bytes(0), d_dwpe.fill_bytes(0);
        encoder_backward(d_dwte.ptr, d_dwpe.ptr, d_scratch.ptr, d_partials.ptr, d_dout.ptr, s.tokens.data(), s.B, s.T, s.C,
                         nullptr);
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
            encoder_backward(d_shard_dwte.ptr, d_dwpe.ptr, d_scratch.ptr, d_partials.ptr, d_dout.ptr, s.tokens.data(), s.B, s.T,
                             s.C, nullptr, nullptr, int(first), rows);
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

// The host's grouping, read back as the kernels read it: every position once, each key's rows in
// increasing position order across its items (a split group's pieces in slot order), pieces of exactly
// kEncoderRowsPerPiece rows but the last, the longest items first, slots numbered in order.
TEST_CASE("encoder grouping: frequent tokens in pieces of 64 rows, the rest whole, the longest items first") {
    const Case s = backward_cases()[backward_cases().size() - 2];  // "pieces of frequent tokens"
    REQUIRE(std::string(s.name) == "pieces of frequent tokens");
    const int N = s.B * s.T;
    std::vector<int> ints(encoder_backward_scratch_ints(s.B, s.T));
    const EncoderGrouping g = encoder_backward_grouping(ints.data(), s.tokens.data(), s.B, s.T);
    const auto parts = encoder_detail::grouping_parts(ints.data(), N);
    std::vector<int> count(size_t(s.V), 0);
    for (int token : s.tokens) ++count[size_t(token)];
    const int distinct = int(std::count_if(count.begin(), count.end(), [](int c) { return c > 0; }));
    CHECK(g.by_token.groups == distinct);
    CHECK(g.by_token.splits == 2);   // tokens 5 (2,048 rows) and 7 (65); 6 (64 rows) stays whole
    CHECK(g.by_token.slots == 34);   // 32 + 2
    CHECK(g.by_token.items == distinct - 2 + 34);
    CHECK(*parts.items == g.by_token.items);
    CHECK(*parts.splits == 2);
    CHECK(parts.split_key[0] == 5);
    CHECK(parts.split_key[1] == 7);
    CHECK(parts.split_slot_start[0] == 0);
    CHECK(parts.split_slot_start[1] == 32);
    CHECK(parts.split_slot_start[2] == 34);
    // Per key, its rows as the items list them; per slot, the item that writes it.
    std::vector<std::vector<std::pair<int, int>>> rows_of(size_t(s.V));  // (slot or -1, position)
    std::vector<int> writer(34, -1);
    int previous_rows = N + 1;
    for (int i = 0; i < *parts.items; ++i) {
        const int first = parts.item_start[i], end = parts.item_start[i + 1], key = parts.item_key[i], slot = parts.item_slot[i];
        CHECK(end - first <= previous_rows);  // the longest first
        previous_rows = end - first;
        CHECK(end - first <= kEncoderRowsPerPiece);
        if (slot >= 0) {
            REQUIRE(slot < 34);
            CHECK(writer[size_t(slot)] == -1);
            writer[size_t(slot)] = i;
        }
        for (int k = first; k < end; ++k) {
            CHECK(s.tokens[size_t(parts.positions[k])] == key);
            rows_of[size_t(key)].push_back({slot, parts.positions[k]});
        }
    }
    CHECK(parts.item_start[*parts.items] == N);
    for (int key = 0; key < s.V; ++key) {
        auto rows = rows_of[size_t(key)];
        REQUIRE(int(rows.size()) == count[size_t(key)]);
        std::stable_sort(rows.begin(), rows.end(), [](auto a, auto b) { return a.first < b.first; });  // slot order
        for (size_t k = 1; k < rows.size(); ++k) CHECK(rows[k - 1].second < rows[k].second);
        if (key == 5 || key == 7)  // its pieces: full but the last
            for (size_t k = 0; k < rows.size(); ++k) CHECK(rows[k].first == (key == 5 ? 0 : 32) + int(k) / kEncoderRowsPerPiece);
        else
            for (const auto& r : rows) CHECK(r.first == -1);
    }
}

// The grouping as its layout comment defines it, built the plain way: (key, position) pairs sorted,
// runs of one key cut into pieces of kEncoderRowsPerPiece, the items stably sorted longest first.
std::vector<int> reference_grouping(const std::vector<int>& keys) {
    const int N = int(keys.size());
    std::vector<int> out(encoder_detail::grouping_ints(N), 0);
    const auto g = encoder_detail::grouping_parts(out.data(), N);
    std::vector<std::pair<int, int>> pairs(static_cast<size_t>(N));
    for (int i = 0; i < N; ++i) pairs[size_t(i)] = {keys[size_t(i)], i};
    std::sort(pairs.begin(), pairs.end());
    struct Item {
        int first, rows, key, slot;
    };
    std::vector<Item> items;
    int splits = 0, slots = 0;
    for (int first = 0; first < N;) {
        int end = first;
        while (end < N && pairs[size_t(end)].first == pairs[size_t(first)].first) ++end;
        const int key = pairs[size_t(first)].first;
        if (end - first <= kEncoderRowsPerPiece) {
            items.push_back({first, end - first, key, -1});
        } else {
            g.split_slot_start[splits] = slots;
            g.split_key[splits++] = key;
            for (int p = first; p < end; p += kEncoderRowsPerPiece)
                items.push_back({p, std::min(kEncoderRowsPerPiece, end - p), key, slots++});
        }
        first = end;
    }
    g.split_slot_start[splits] = slots;
    *g.splits = splits;
    std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.rows > b.rows; });
    int filled = 0;
    for (size_t i = 0; i < items.size(); ++i) {
        g.item_start[i] = filled;
        g.item_key[i] = items[i].key;
        g.item_slot[i] = items[i].slot;
        for (int k = items[i].first; k < items[i].first + items[i].rows; ++k) g.positions[filled++] = pairs[size_t(k)].second;
    }
    g.item_start[items.size()] = filled;
    *g.items = int(items.size());
    return out;
}

// The host's radix-sorted grouping (one 16-bit pass, or two when a key reaches 2^16) equals the plain
// sorted one int for int, by token and by position: GPT-2-like skew, keys across the whole int range
// (the second pass), keys just below and at 2^16, a single key, a single position.
TEST_CASE("encoder grouping: the radix-sorted layout equals the sorted one, one digit pass or two") {
    std::mt19937 rng(42);
    struct Input {
        const char* name;
        int B, T;
        std::vector<int> tokens, positions;
    };
    std::vector<Input> inputs;
    const auto add = [&](const char* name, int B, int T, auto token_of, auto position_of) {
        Input in{name, B, T, {}, {}};
        for (int i = 0; i < B * T; ++i) in.tokens.push_back(token_of(i)), in.positions.push_back(position_of(i));
        inputs.push_back(in);
    };
    // One token at an eighth of the positions (the newline's share), the rest spread over 50,257.
    add("skewed vocabulary", 8, 1024, [&](int) { return rng() % 8 == 0 ? 198 : int(rng() % 50257); }, [](int i) { return i % 1024; });
    add("keys across the int range", 4, 512,
        [&](int) { return rng() % 4 == 0 ? int(rng() % 3) : int(rng() & 0x7fffffff); },
        [&](int) { return int(rng() % 700); });
    add("keys about 2^16", 3, 777, [&](int) { return 65534 + int(rng() % 4); }, [&](int) { return 65535 + int(rng() % 2); });
    add("one key", 2, 300, [](int) { return 7; }, [](int i) { return i % 300; });
    add("one position", 1, 1, [](int) { return 50256; }, [](int) { return 0; });
    for (const Input& in : inputs) {
        INFO(in.name);
        const int N = in.B * in.T;
        std::vector<int> ints(encoder_backward_scratch_ints(in.B, in.T, true), -7);
        const EncoderGrouping g = encoder_backward_grouping(ints.data(), in.tokens.data(), in.B, in.T, in.positions.data());
        const std::vector<int> by_token = reference_grouping(in.tokens), by_position = reference_grouping(in.positions);
        const size_t one = encoder_detail::grouping_ints(N);
        REQUIRE(ints.size() == 2 * one);
        // The unused tails of item_start, item_key, ... are not part of the layout: compare what is used.
        const auto used_equal = [&](const int* got, const std::vector<int>& want, const EncoderGroupingCounts& counts) {
            const auto a = encoder_detail::grouping_parts(got, N);
            const auto b = encoder_detail::grouping_parts(want.data(), N);
            CHECK(*a.items == *b.items);
            CHECK(*a.splits == *b.splits);
            CHECK(counts.items == *b.items);
            CHECK(counts.splits == *b.splits);
            REQUIRE(*a.items == *b.items);
            REQUIRE(*a.splits == *b.splits);
            const int I = *b.items, S = *b.splits;
            CHECK(std::equal(a.positions, a.positions + N, b.positions));
            CHECK(std::equal(a.item_start, a.item_start + I + 1, b.item_start));
            CHECK(std::equal(a.item_key, a.item_key + I, b.item_key));
            CHECK(std::equal(a.item_slot, a.item_slot + I, b.item_slot));
            CHECK(std::equal(a.split_slot_start, a.split_slot_start + S + 1, b.split_slot_start));
            CHECK(std::equal(a.split_key, a.split_key + S, b.split_key));
        };
        used_equal(ints.data(), by_token, g.by_token);
        used_equal(ints.data() + one, by_position, g.by_position);
        CHECK(g.has_positions);
    }
    // The skewed batch splits its frequent token, so the pieces' part of the layout was compared too.
    std::vector<int> ints(encoder_backward_scratch_ints(inputs[0].B, inputs[0].T));
    CHECK(encoder_backward_grouping(ints.data(), inputs[0].tokens.data(), inputs[0].B, inputs[0].T).by_token.splits >= 1);
}

TEST_CASE("encoder_requirements accepts positive multiples of 8 and names a bad C") {
    for (int C : {8, 768, 1600, 12288}) CHECK(encoder_requirements(C).empty());
    CHECK(encoder_requirements(100) == "encoder: C = 100 is not a positive multiple of 8");
    CHECK(encoder_requirements(0).find("C = 0") != std::string::npos);
    // 4N + 2 S_max + 4 ints a grouping, S_max = N / 65 split groups (a split group has 65+ rows).
    CHECK(encoder_backward_scratch_ints(4, 1024) == 4 * 4096 + 2 * 63 + 4);
    CHECK(encoder_backward_scratch_ints(4, 1024, true) == 2 * (4 * 4096 + 2 * 63 + 4));
    CHECK(encoder_backward_partial_floats(4, 1024, 768) == size_t(2 * 4096 / 65) * 768);
}
