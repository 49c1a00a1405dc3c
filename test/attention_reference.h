// The attention tests' shared reference (test_kernel_attention.cu, test_kernel_attention_tc.cu): random
// inputs, and causal attention forward and backward in double from the definitions, building the full
// T x T softmax that the flash kernels never materialize; optionally with a document mask given as
// each token's document start within its row (host/documents.h's convention), rows packed from
// documents by packed_rows().
#pragma once

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/attention_tc.cuh"
#include "kernels/common.cuh"
#include "test_util.h"  // Catch2

inline double to_float(double x) { return x; }  // beside common.cuh's float and bf16 overloads

namespace attention_reference {

struct Sizes {
    int B, T, C, NH;
    float qk_range;  // q and k uniform in [-qk_range, qk_range]: larger means sharper softmax rows
};

inline std::vector<floatX> random_floatX(size_t n, float range, std::mt19937& rng) {
    std::uniform_real_distribution<float> dist(-range, range);
    std::vector<floatX> v(n);
    for (auto& x : v) x = from_float<floatX>(dist(rng));
    return v;
}

// qkv for the sizes: v uniform in [-1, 1], q and k in [-qk_range, qk_range] (only their scale sets
// how sharp the softmax rows are, which is what the online max must handle).
inline std::vector<floatX> random_qkv(const Sizes& s, std::mt19937& rng) {
    std::vector<floatX> qkv = random_floatX(size_t(s.B) * s.T * 3 * s.C, 1.0f, rng);
    const std::vector<floatX> qk = random_floatX(qkv.size(), s.qk_range, rng);
    for (size_t i = 0; i < qkv.size(); ++i)
        if (i % (3 * size_t(s.C)) < 2 * size_t(s.C)) qkv[i] = qk[i];
    return qkv;
}

struct Reference {
    std::vector<double> out, lse, dqkv;
};

// Document starts (B, T) of rows whose documents begin at the given positions (an EOT token there;
// row b's list in eots[b], any order, possibly empty): by brute force from the definition, the last
// listed position at or before t, or 0.
inline std::vector<int> packed_rows(int T, const std::vector<std::vector<int>>& eots) {
    std::vector<int> starts;
    for (const std::vector<int>& row : eots)
        for (int t = 0; t < T; ++t) {
            int start = 0;
            for (int p : row)
                if (p <= t) start = std::max(start, p);
            starts.push_back(start);
        }
    return starts;
}

// Straight from the definitions: S = q k^T / sqrt(hs) masked to key <= query (and, with doc_start,
// to doc_start[query] <= key), P = softmax(S), out = P v, lse = log sum exp S; with dout = G:
// dv = P^T G, dP = G v^T, dS = P * (dP - rowsum(dP * P)), dq = dS k / sqrt(hs), dk = dS^T q / sqrt(hs).
// Masked pairs are never touched, so NaN inputs of keys a query cannot see stay out of its results.
// `window` limits the problem to the queries and keys of two position ranges (a span of the kernels,
// AttentionSpan: a chunk's queries against a chunk's keys); rows outside it stay 0 (lse: -inf).
struct Window {
    int q_begin = 0, q_end = 1 << 30, k_begin = 0, k_end = 1 << 30;
};
inline Reference reference_attention(const std::vector<floatX>& qkv, const std::vector<floatX>& dout, const Sizes& s,
                                     const std::vector<int>* doc_start = nullptr, Window window = {}) {
    const int B = s.B, T = s.T, C = s.C, NH = s.NH, hs = C / NH;
    const double scale = 1.0 / std::sqrt(double(hs));
    Reference ref{std::vector<double>(size_t(B) * T * C), std::vector<double>(size_t(B) * NH * T, -INFINITY),
                  std::vector<double>(size_t(B) * T * 3 * C, 0.0)};
    auto q = [&](int b, int t, int h, int d) { return double(to_float(qkv[(size_t(b) * T + t) * 3 * C + h * hs + d])); };
    auto k = [&](int b, int t, int h, int d) { return q(b, t, h, d + C); };
    auto v = [&](int b, int t, int h, int d) { return q(b, t, h, d + 2 * C); };
    auto g = [&](int b, int t, int h, int d) { return double(to_float(dout[(size_t(b) * T + t) * C + h * hs + d])); };
    auto grad = [&](int b, int t, int part, int h, int d) -> double& {
        return ref.dqkv[(size_t(b) * T + t) * 3 * C + part * C + h * hs + d];
    };
    std::vector<double> P(size_t(T) * T);
    for (int b = 0; b < B; ++b) {
        auto first = [&](int i) {  // i's first visible key
            return std::max(window.k_begin, doc_start ? (*doc_start)[size_t(b) * T + i] : 0);
        };
        auto last = [&](int i) { return std::min(i, window.k_end - 1); };
        auto in_window = [&](int i) { return window.q_begin <= i && i < window.q_end && first(i) <= last(i); };
        for (int h = 0; h < NH; ++h) {
            for (int i = 0; i < T; ++i) {
                if (!in_window(i)) continue;
                double max_score = -INFINITY;
                for (int j = first(i); j <= last(i); ++j) {
                    double dot = 0.0;
                    for (int d = 0; d < hs; ++d) dot += q(b, i, h, d) * k(b, j, h, d);
                    P[size_t(i) * T + j] = dot * scale;
                    max_score = std::max(max_score, dot * scale);
                }
                double sum = 0.0;
                for (int j = first(i); j <= last(i); ++j) sum += std::exp(P[size_t(i) * T + j] - max_score);
                for (int j = first(i); j <= last(i); ++j) P[size_t(i) * T + j] = std::exp(P[size_t(i) * T + j] - max_score) / sum;
                ref.lse[(size_t(b) * NH + h) * T + i] = max_score + std::log(sum);
                for (int d = 0; d < hs; ++d) {
                    double o = 0.0;
                    for (int j = first(i); j <= last(i); ++j) o += P[size_t(i) * T + j] * v(b, j, h, d);
                    ref.out[(size_t(b) * T + i) * C + h * hs + d] = o;
                }
            }
            for (int i = 0; i < T; ++i) {
                if (!in_window(i)) continue;
                double row_dot = 0.0;  // rowsum(dP * P) = G_i . out_i
                for (int d = 0; d < hs; ++d) row_dot += g(b, i, h, d) * ref.out[(size_t(b) * T + i) * C + h * hs + d];
                for (int j = first(i); j <= last(i); ++j) {
                    const double p = P[size_t(i) * T + j];
                    double dp = 0.0;
                    for (int d = 0; d < hs; ++d) dp += g(b, i, h, d) * v(b, j, h, d);
                    const double ds = p * (dp - row_dot);
                    for (int d = 0; d < hs; ++d) {
                        grad(b, i, 0, h, d) += ds * k(b, j, h, d) * scale;
                        grad(b, j, 1, h, d) += ds * q(b, i, h, d) * scale;
                        grad(b, j, 2, h, d) += p * g(b, i, h, d);
                    }
                }
            }
        }
    }
    return ref;
}

// Document-masked cases shared by the SIMT and tensor-core tests: rows packed from documents (the
// positions of their EOT tokens), with length-1 documents, consecutive ones, boundaries on the
// 32-row (SIMT) and 64-row (tensor-core block and streamed) tile edges and inside tiles, documents
// that start late enough for whole key tiles to be skipped, a row without EOT, and a row of EOTs
// alone (every query sees only itself).
struct DocumentCase {
    const char* what;
    Sizes s;
    std::vector<std::vector<int>> eots;  // per row
};

inline std::vector<DocumentCase> document_cases() {
    std::vector<int> every_token, every_seventh;
    for (int t = 0; t < 70; ++t) every_token.push_back(t);
    for (int t = 3; t < 200; t += 7) every_seventh.push_back(t);
    return {
        {"hs 64: length-1 documents, edges at 32 and 64, mid-tile; a row without EOT; a late start skipping tiles",
         {3, 150, 128, 2, 2.0f},
         {{0, 1, 2, 31, 32, 50, 64, 65, 100, 149}, {}, {96, 128}}},
        {"hs 16, T = 37: a partial tile", {2, 37, 32, 2, 3.0f}, {{5, 6, 36}, {20}}},
        {"hs 32, NH 3: documents of 7 tokens", {1, 200, 96, 3, 2.0f}, {every_seventh}},
        {"hs 128: boundaries at 33, 63, 64, 97 (32-row streamed tiles in tensor-core backward)",
         {1, 100, 256, 2, 1.5f},
         {{33, 63, 64, 97}}},
        {"hs 64: every token an EOT, each query sees only its own key", {1, 70, 128, 2, 2.0f}, {every_token}},
        {"hs 64, sharp rows: one document from 64 on, tiles 0-1 skipped by the last query blocks",
         {2, 192, 128, 2, 4.0f},
         {{64}, {0, 128, 129}}},
    };
}

// Sets every q, k, v and dout value of positions [from, to) of row b to NaN.
inline void poison_positions(std::vector<floatX>& qkv, std::vector<floatX>& dout, const Sizes& s, int b, int from, int to) {
    const floatX nan = from_float<floatX>(NAN);
    for (int t = from; t < to; ++t) {
        const size_t position = size_t(b) * s.T + t;
        for (int c = 0; c < 3 * s.C; ++c) qkv[position * 3 * s.C + c] = nan;
        for (int c = 0; c < s.C; ++c) dout[position * s.C + c] = nan;
    }
}

// The values of positions [from, to) of row b: of a (B, T, width) tensor, or of lse's (B, NH, T).
template <typename T>
std::vector<T> positions_of(const std::vector<T>& x, const Sizes& s, int width, int b, int from, int to) {
    std::vector<T> kept;
    for (int t = from; t < to; ++t)
        for (int c = 0; c < width; ++c) kept.push_back(x[(size_t(b) * s.T + t) * width + c]);
    return kept;
}
template <typename T> std::vector<T> lse_positions_of(const std::vector<T>& lse, const Sizes& s, int b, int from, int to) {
    std::vector<T> kept;
    for (int h = 0; h < s.NH; ++h)
        for (int t = from; t < to; ++t) kept.push_back(lse[(size_t(b) * s.NH + h) * s.T + t]);
    return kept;
}

// dqkv split into its q, k and v parts.
template <typename T> std::array<std::vector<T>, 3> split_qkv(const std::vector<T>& dqkv, int C) {
    std::array<std::vector<T>, 3> parts;
    for (size_t i = 0; i < dqkv.size(); ++i) parts[i % (3 * size_t(C)) / C].push_back(dqkv[i]);
    return parts;
}

struct Results {
    std::vector<floatX> out, dqkv;
    std::vector<float> lse;
};

// Forward then backward with the chosen kernels, on fresh NaN-filled outputs and scratch, so every
// element must be written; with doc_start, document-masked.
enum class Kernels { tensor_core, simt };
inline Results run_attention(Kernels which, const std::vector<floatX>& qkv_host, const std::vector<floatX>& dout_host,
                             const Sizes& s, const std::vector<int>* doc_start_host = nullptr) {
    const size_t BT = size_t(s.B) * s.T;
    const size_t scratch_floats = which == Kernels::tensor_core ? attention_tc_backward_scratch_floats(s.B, s.T, s.NH)
                                                                : attention_backward_scratch_floats(s.B, s.T, s.NH);
    DeviceBuffer<floatX> qkv(qkv_host), dout(dout_host), out(BT * s.C), dqkv(BT * 3 * s.C);
    DeviceBuffer<float> lse(BT * s.NH), scratch(scratch_floats);
    DeviceBuffer<int> doc_start(doc_start_host ? *doc_start_host : std::vector<int>(1));
    const int* docs = doc_start_host ? doc_start.ptr : nullptr;
    out.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
    dqkv.fill_bytes(0xFF);
    scratch.fill_bytes(0xFF);
    if (which == Kernels::tensor_core) {
        attention_tc_forward(out.ptr, lse.ptr, qkv.ptr, s.B, s.T, s.C, s.NH, 0, docs);
        attention_tc_backward(dqkv.ptr, scratch.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, s.B, s.T, s.C, s.NH, 0, docs);
    } else {
        attention_forward(out.ptr, lse.ptr, qkv.ptr, s.B, s.T, s.C, s.NH, 0, docs);
        attention_backward(dqkv.ptr, scratch.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, s.B, s.T, s.C, s.NH, 0, docs);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    return {out.download(), dqkv.download(), lse.download()};
}

}  // namespace attention_reference
