// The attention tests' shared reference (test_kernel_attention.cu, test_kernel_attention_tc.cu): random
// inputs, and causal attention forward and backward in double from the definitions, building the full
// T x T softmax that the flash kernels never materialize; optionally with a document mask given as
// each token's document start within its row (host/documents.h's convention), rows packed from
// documents by packed_rows().
#pragma once

#include <algorithm>
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
    // The inputs widened once (exactly): a conversion per read made this most of the kernel tests' time
    // under ASan.
    auto widened = [](const std::vector<floatX>& x) {
        std::vector<double> wide(x.size());
        for (size_t i = 0; i < x.size(); ++i) wide[i] = double(to_float(x[i]));
        return wide;
    };
    const std::vector<double> qkv_wide = widened(qkv), dout_wide = widened(dout);
    // Head h's hs values at position t of row b: of q, k, v (part 0, 1, 2), of dout, of their gradients.
    auto qkv_at = [&](int b, int t, int part, int h) { return &qkv_wide[(size_t(b) * T + t) * 3 * C + part * C + h * hs]; };
    auto g_at = [&](int b, int t, int h) { return &dout_wide[(size_t(b) * T + t) * C + h * hs]; };
    auto grad_at = [&](int b, int t, int part, int h) { return &ref.dqkv[(size_t(b) * T + t) * 3 * C + part * C + h * hs]; };
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
                const double* q = qkv_at(b, i, 0, h);
                double max_score = -INFINITY;
                for (int j = first(i); j <= last(i); ++j) {
                    const double* k = qkv_at(b, j, 1, h);
                    double dot = 0.0;
                    for (int d = 0; d < hs; ++d) dot += q[d] * k[d];
                    P[size_t(i) * T + j] = dot * scale;
                    max_score = std::max(max_score, dot * scale);
                }
                double sum = 0.0;
                for (int j = first(i); j <= last(i); ++j) sum += std::exp(P[size_t(i) * T + j] - max_score);
                for (int j = first(i); j <= last(i); ++j) P[size_t(i) * T + j] = std::exp(P[size_t(i) * T + j] - max_score) / sum;
                ref.lse[(size_t(b) * NH + h) * T + i] = max_score + std::log(sum);
                for (int d = 0; d < hs; ++d) {
                    double o = 0.0;
                    for (int j = first(i); j <= last(i); ++j) o += P[size_t(i) * T + j] * qkv_at(b, j, 2, h)[d];
                    ref.out[(size_t(b) * T + i) * C + h * hs + d] = o;
                }
            }
            for (int i = 0; i < T; ++i) {
                if (!in_window(i)) continue;
                const double *q = qkv_at(b, i, 0, h), *g = g_at(b, i, h);
                double* dq = grad_at(b, i, 0, h);
                double row_dot = 0.0;  // rowsum(dP * P) = G_i . out_i
                for (int d = 0; d < hs; ++d) row_dot += g[d] * ref.out[(size_t(b) * T + i) * C + h * hs + d];
                for (int j = first(i); j <= last(i); ++j) {
                    const double *k = qkv_at(b, j, 1, h), *v = qkv_at(b, j, 2, h);
                    double *dk = grad_at(b, j, 1, h), *dv = grad_at(b, j, 2, h);
                    const double p = P[size_t(i) * T + j];
                    double dp = 0.0;
                    for (int d = 0; d < hs; ++d) dp += g[d] * v[d];
                    const double ds = p * (dp - row_dot);
                    for (int d = 0; d < hs; ++d) {
                        dq[d] += ds * k[d] * scale;
                        dk[d] += ds * q[d] * scale;
                        dv[d] += p * g[d];
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
// element must be written (and the fused backward's dQ sums written before they are read); with
// doc_start, document-masked. tensor_core_fused: the tensor-core forward, then the fused backward.
// row_threads: the SIMT kernels' threads a row (1 or 4; 0: the launchers' choice for this build).
// fused_wave_slots: the blocks a wave of the fused kernel's grid holds (fewer than an H100's split the
// heads of small grids as the last of a large one's are: attention_tc_detail::fused_grid_plan).
enum class Kernels { tensor_core, simt, tensor_core_fused };
inline Results run_attention(Kernels which, const std::vector<floatX>& qkv_host, const std::vector<floatX>& dout_host,
                             const Sizes& s, const std::vector<int>* doc_start_host = nullptr, int row_threads = 0,
                             int fused_wave_slots = attention_tc_detail::kFusedWaveSlots) {
    const size_t BT = size_t(s.B) * s.T;
    const bool tc = which != Kernels::simt;
    const AttentionTcBackward how = which == Kernels::tensor_core_fused ? AttentionTcBackward::fused : AttentionTcBackward::split;
    const size_t scratch_floats = tc ? attention_tc_backward_scratch_floats(s.B, s.T, s.C, s.NH, how, false, fused_wave_slots)
                                     : attention_backward_scratch_floats(s.B, s.T, s.NH);
    DeviceBuffer<floatX> qkv(qkv_host), dout(dout_host), out(BT * s.C), dqkv(BT * 3 * s.C);
    DeviceBuffer<float> lse(BT * s.NH), scratch(scratch_floats);
    DeviceBuffer<int> doc_start(doc_start_host ? *doc_start_host : std::vector<int>(1));
    const int* docs = doc_start_host ? doc_start.ptr : nullptr;
    out.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
    dqkv.fill_bytes(0xFF);
    scratch.fill_bytes(0xFF);
    if (tc) {
        attention_tc_forward(out.ptr, lse.ptr, qkv.ptr, s.B, s.T, s.C, s.NH, 0, docs);
        attention_tc_backward(dqkv.ptr, scratch.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, s.B, s.T, s.C, s.NH, 0, docs, how,
                              false, fused_wave_slots);
    } else {
        attention_forward(out.ptr, lse.ptr, qkv.ptr, s.B, s.T, s.C, s.NH, 0, docs, row_threads);
        attention_backward(dqkv.ptr, scratch.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, s.B, s.T, s.C, s.NH, 0, docs, row_threads);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    return {out.download(), dqkv.download(), lse.download()};
}

// A span case's inputs as the kernels take them (check_spans, test_kernel_attention_wgmma), for the
// queries of w's range against its keys. Documents as context parallelism meets them: one starting
// inside the keys, one between the keys' end and the queries' last (its queries see none of the keys:
// out 0, lse -inf), row 0 also one just before the queries (doc_starts, (B, T)); each query's first
// visible key in key coordinates (first_keys); the span (key_lead = q_begin - k_begin puts both in the
// row's positions); and the keys in a compact k|v buffer (rows 2C apart) with 3 NaN padding rows
// after each sequence's.
struct SpanInputs {
    std::vector<int> doc_starts, first_keys;
    AttentionSpan span;
    std::vector<floatX> kv;
};
inline SpanInputs span_inputs(const std::vector<floatX>& qkv, const Sizes& s, const Window& w) {
    SpanInputs in;
    std::vector<std::vector<int>> eots(s.B);
    for (int b = 0; b < s.B; ++b) {
        eots[b] = {w.k_begin + (w.k_end - w.k_begin) / 3 + b, std::max(w.k_end, w.q_end - 4 - b)};
        if (b == 0 && w.q_begin > 0) eots[b].push_back(w.q_begin - 1);
    }
    in.doc_starts = packed_rows(s.T, eots);
    const int C = s.C, Tq = w.q_end - w.q_begin, Tk = w.k_end - w.k_begin, kv_seq = Tk + 3;
    in.first_keys.resize(in.doc_starts.size());
    for (size_t i = 0; i < in.first_keys.size(); ++i) in.first_keys[i] = std::clamp(in.doc_starts[i] - w.k_begin, 0, Tk);
    in.span = AttentionSpan{Tq, Tk, s.T, kv_seq, 2 * C, w.q_begin - w.k_begin};
    in.kv.assign(size_t(s.B) * kv_seq * 2 * C, from_float<floatX>(NAN));  // padding rows: NaN
    for (int b = 0; b < s.B; ++b)
        for (int k = 0; k < Tk; ++k)
            for (int c2 = 0; c2 < 2 * C; ++c2)
                in.kv[(size_t(b) * kv_seq + k) * 2 * C + c2] = qkv[(size_t(b) * s.T + w.k_begin + k) * 3 * C + C + c2];
    return in;
}

// Spans (AttentionSpan): the queries of one position range against the keys of another, as context
// parallelism's ring steps run them (parallel/context.h): key_lead = q_begin - k_begin puts both in the
// row's positions, so query t sees key k when k_begin + k <= q_begin + t. The queries come from a
// qkv buffer at an offset, the keys from a compact k|v buffer (rows 2C apart) with padding rows
// between sequences; the results are a window of the reference (the same softmax over fewer keys).
// The backward pass runs twice, the second time accumulating: every gradient doubles, bit for bit.
// R: the results' type (floatX, or float as the ring takes them). Head sizes 16-128, all of which the
// tensor-core kernels take. Tolerances relative to each tensor's max |ref|: out and dv, lse, dq and dk.
// row_threads as in run_attention (SIMT only; head sizes without the one-thread form take 4).
struct SpanTolerances {
    double out, lse, grad;
};
inline const char* kernels_name(Kernels which) {
    return which == Kernels::tensor_core ? "tensor cores" : which == Kernels::simt ? "simt" : "tensor cores, fused backward";
}
template <typename R> void check_spans(Kernels which, const SpanTolerances& tol, int row_threads = 0) {
    struct SpanCase {
        const char* what;
        Sizes s;
        Window w;
    };
    const SpanCase cases[] = {
        {"keys wholly before the queries: every key seen (key_lead = Tk)", {2, 100, 128, 2, 2.0f}, {40, 100, 0, 40}},
        {"overlapping ranges, key_lead 17: tiles partly masked", {2, 100, 128, 2, 2.0f}, {37, 90, 20, 70}},
        {"the same range (causal), hs 128, partial tiles", {1, 150, 256, 2, 1.5f}, {64, 150, 64, 150}},
        {"fewer keys than queries, key_lead 0", {1, 40, 96, 3, 3.0f}, {0, 33, 0, 5}},
        {"a chunk far before, sharp rows, hs 16", {3, 90, 32, 2, 4.0f}, {60, 90, 3, 29}},
        // Keys over several 64-key blocks, the first ones seen from the first query on: the dK/dV
        // kernels' query loops start at k0 - key_lead, not at the key block.
        {"keys in 4 blocks from before the queries, key_lead 90", {1, 260, 128, 2, 2.0f}, {100, 260, 10, 230}},
    };
    for (const bool documents : {false, true})
    for (const SpanCase& c : cases) {
        const Sizes& s = c.s;
        const Window& w = c.w;
        const int rows = row_threads == 1 && !attention_detail::one_thread_rows_exist(s.C / s.NH) ? 4 : row_threads;
        CAPTURE(kernels_name(which), sizeof(R), rows, documents, c.what, s.B, s.T, s.C, s.NH, w.q_begin, w.q_end, w.k_begin, w.k_end);
        std::mt19937 rng(4321 + s.T + s.C + w.q_begin);
        const std::vector<floatX> qkv = random_qkv(s, rng);
        const std::vector<floatX> dout = random_floatX(size_t(s.B) * s.T * s.C, 1.0f, rng);
        const SpanInputs in = span_inputs(qkv, s, w);
        const std::vector<int>& doc_starts = in.doc_starts;
        const Reference ref = reference_attention(qkv, dout, s, documents ? &doc_starts : nullptr, w);

        const int C = s.C, Tk = in.span.Tk, kv_seq = in.span.kv_seq;
        DeviceBuffer<int> first_keys_device(in.first_keys);
        const int* docs = documents ? first_keys_device.ptr + w.q_begin : nullptr;
        const AttentionSpan span = in.span;
        const std::vector<floatX>& kv_host = in.kv;
        const size_t BT = size_t(s.B) * s.T;
        DeviceBuffer<floatX> q(qkv), kv(kv_host), g(dout);
        DeviceBuffer<R> out(BT * C), dq(BT * 3 * C), dkv(kv_host.size());
        DeviceBuffer<float> lse(BT * s.NH), D(BT * s.NH);
        out.fill_bytes(0xFF);
        lse.fill_bytes(0xFF);
        dq.fill_bytes(0xFF);
        dkv.fill_bytes(0xFF);
        const size_t q_off = size_t(w.q_begin);
        const auto backward = [&](bool accumulate) {
            R* dq_at = dq.ptr + q_off * 3 * C;
            const floatX *g_at = g.ptr + q_off * C, *q_at = q.ptr + q_off * 3 * C;
            if (which == Kernels::tensor_core)
                attention_tc_backward(dq_at, 3 * C, dkv.ptr, 2 * C, g_at, q_at, kv.ptr, lse.ptr + q_off, D.ptr + q_off, span,
                                      s.B, C, s.NH, 0, docs, accumulate);
            else
                attention_backward(dq_at, 3 * C, dkv.ptr, 2 * C, g_at, q_at, kv.ptr, lse.ptr + q_off, D.ptr + q_off, span, s.B,
                                   C, s.NH, 0, docs, accumulate, nullptr, rows);
            CUDA_CHECK(cudaDeviceSynchronize());
        };
        if (which == Kernels::tensor_core)
            attention_tc_forward(out.ptr + q_off * C, lse.ptr + q_off, q.ptr + q_off * 3 * C, kv.ptr, span, s.B, C, s.NH, 0, docs);
        else
            attention_forward(out.ptr + q_off * C, lse.ptr + q_off, q.ptr + q_off * 3 * C, kv.ptr, span, s.B, C, s.NH, 0, docs, rows);
        // D = rowsum(dO * out) from the results as the kernels wrote them (the ring's are FP32 sums,
        // rounded to floatX for the backward pass as here); rows outside the window: NaN, unread.
        std::vector<floatX> out_rounded;
        for (const R& x : out.download()) out_rounded.push_back(from_float<floatX>(to_float(x)));
        DeviceBuffer<floatX> out_x(out_rounded);
        attention_backward_rowdot(D.ptr, g.ptr, out_x.ptr, s.B, s.T, C, s.NH, 0);
        backward(false);
        const std::vector<R> dq_once = dq.download(), dkv_once = dkv.download();
        backward(true);
        const std::vector<R> got_out = out.download(), dq_twice = dq.download(), dkv_twice = dkv.download();
        const std::vector<float> got_lse = lse.download();

        // The window's rows of every tensor, and its key rows of the compact buffer (k | v).
        std::vector<double> out_w, out_ref, lse_w, lse_ref, dq_w, dq_ref, dk_w, dk_ref, dv_w, dv_ref;
        bool outside_untouched = true, doubled = true, empty_rows_ok = true;
        for (int b = 0; b < s.B; ++b) {
            for (int t = 0; t < s.T; ++t) {
                const bool in = w.q_begin <= t && t < w.q_end;
                for (int c = 0; c < C; ++c) {
                    const size_t i = (size_t(b) * s.T + t) * C + c, iq = (size_t(b) * s.T + t) * 3 * C + c;
                    if (!in) {
                        outside_untouched &= std::isnan(to_float(got_out[i])) && std::isnan(to_float(dq_twice[iq]));
                        continue;
                    }
                    out_w.push_back(to_float(got_out[i]));
                    out_ref.push_back(ref.out[i]);
                    dq_w.push_back(to_float(dq_once[iq]));
                    dq_ref.push_back(ref.dqkv[iq]);
                    doubled &= to_float(dq_twice[iq]) == 2.0f * to_float(dq_once[iq]);
                }
                for (int h = 0; h < s.NH && in; ++h) {
                    const float got_l = got_lse[(size_t(b) * s.NH + h) * s.T + t];
                    const double ref_l = ref.lse[(size_t(b) * s.NH + h) * s.T + t];
                    if (ref_l == -INFINITY) {  // a row that sees none of the keys (documents)
                        empty_rows_ok &= got_l == -INFINITY;
                        continue;
                    }
                    lse_w.push_back(got_l);
                    lse_ref.push_back(ref_l);
                }
            }
            for (int k = 0; k < kv_seq; ++k)
                for (int c2 = 0; c2 < 2 * C; ++c2) {
                    const size_t i = (size_t(b) * kv_seq + k) * 2 * C + c2;
                    if (k >= Tk) {
                        outside_untouched &= std::isnan(to_float(dkv_twice[i]));
                        continue;
                    }
                    const double r = ref.dqkv[(size_t(b) * s.T + w.k_begin + k) * 3 * C + C + c2];
                    (c2 < C ? dk_w : dv_w).push_back(to_float(dkv_once[i]));
                    (c2 < C ? dk_ref : dv_ref).push_back(r);
                    doubled &= to_float(dkv_twice[i]) == 2.0f * to_float(dkv_once[i]);
                }
        }
        CHECK(tensor_error(out_w, out_ref) <= tol.out);
        CHECK(tensor_error(lse_w, lse_ref) <= tol.lse);
        CHECK(tensor_error(dq_w, dq_ref) <= tol.grad);
        CHECK(tensor_error(dk_w, dk_ref) <= tol.grad);
        CHECK(tensor_error(dv_w, dv_ref) <= tol.out);
        CHECK(outside_untouched);
        CHECK(doubled);
        CHECK(empty_rows_ok);
    }
}

}  // namespace attention_reference
