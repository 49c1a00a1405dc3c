// Context parallelism: the sequence split over the ranks of a context group, keys and values passed
// around a ring (Liu et al. 2023, "Ring Attention with Blockwise Transformers"), each rank's queries
// attending to every chunk in turn with our flash attention (kernels/attention.cuh's SIMT kernels, or
// kernels/attention_tc.cuh's tensor-core ones: both take an AttentionSpan) and the partial results
// merged by their log-sum-exp (attention_merge). Everything outside attention is per token and needs
// no communication.
//
// Load balance (zigzag): causal attention makes later positions attend to more keys, so a plain split
// would leave the last rank most of the work. The sequence is cut into 2 cp chunks and rank r holds
// chunks r and 2 cp - 1 - r, in that order (Brandon et al. 2023, "Striped Attention", and Megatron-LM's
// context parallelism balance the same way). With that layout each ring step is one kernel call:
//  - its own chunks: plain causal attention over its local rows (chunk r's positions precede chunk
//    2cp-1-r's, so "local row <= local row" is the causal mask);
//  - the keys of rank j < r: every local query sees chunk j (before both of r's) and none of chunk
//    2cp-1-j (after both): all local queries against the visitor's first chunk;
//  - the keys of rank j > r: chunk r sees neither of j's; chunk 2cp-1-r sees both: the second local
//    chunk's queries against all of the visitor's keys.
// Every non-own step covers the same number of pairs (a chunk times two chunks), on every rank.
//
// Backward (FlashAttention-2's backward over each block pair, with the merged lse and D = rowsum(dO * O)
// of the whole attention): the keys and values go around the ring again, now with their gradient
// accumulator dk|dv; each rank adds its queries' share and passes both on, and after cp - 1 steps the
// accumulator comes home to its keys' rank (one more hop). dq accumulates locally. Sums run in ring
// order, the same on every run (no float atomics).
//
// Documents (--doc-mask): each query sees the keys of its own document only, which may start in
// another rank's chunk. Its first visible key in each step's key buffer (context_first_keys, from the
// document starts found on the whole rows) is that step's span's document start; a query that sees
// none of a block's keys gets out 0 and lse -inf from that step, so the merge gives it weight 0.
//
// Transfers run on a stream of their own, double-buffered: while a step computes on one buffer, the
// next visitor arrives in the other (forward and, for the keys and values, backward). The gradient
// accumulator can move only after the step that adds to it: each step computes dK/dV first and sends
// the sum on while its dQ kernel runs.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/attention.cuh"
#include "kernels/attention_tc.cuh"
#include "kernels/elementwise.cuh"
#include "parallel/process_groups.h"

// ---------------------------------------------------------------------------------------------
// The zigzag layout of a sequence of T positions over cp ranks. Chunk i of the 2 cp covers positions
// [i T / (2cp), (i+1) T / (2cp)): lengths differ by at most one when 2 cp does not divide T (training
// requires that it does, context_parallel_problem; the attention layer takes any split).
struct ZigzagLayout {
    int T = 1, cp = 1;
    int chunk_begin(int i) const { return int(int64_t(i) * T / (2 * cp)); }
    int chunk_length(int i) const { return chunk_begin(i + 1) - chunk_begin(i); }
    int first_chunk(int rank) const { return rank; }
    int second_chunk(int rank) const { return 2 * cp - 1 - rank; }
    int first_length(int rank) const { return chunk_length(first_chunk(rank)); }
    int local_length(int rank) const { return first_length(rank) + chunk_length(second_chunk(rank)); }
    int max_local_length() const {
        int most = 0;
        for (int r = 0; r < cp; ++r) most = std::max(most, local_length(r));
        return most;
    }
    // The sequence position of rank's local row t.
    int position(int rank, int t) const {
        const int a = first_length(rank);
        return t < a ? chunk_begin(first_chunk(rank)) + t : chunk_begin(second_chunk(rank)) + (t - a);
    }
    // Where sequence position p (0 <= p < T) lies: its rank and local row there (position's inverse).
    struct Row {
        int rank, row;
    };
    Row row_of(int p) const {
        int chunk = 0;
        while (chunk_begin(chunk + 1) <= p) ++chunk;
        const int rank = chunk < cp ? chunk : 2 * cp - 1 - chunk;
        return {rank, p - chunk_begin(chunk) + (chunk == first_chunk(rank) ? 0 : first_length(rank))};
    }
};

// "" when training with --cp cp can split sequences of T tokens (-t), else why not.
inline std::string context_parallel_problem(int T, int cp) {
    if (cp < 1) return "--cp " + std::to_string(cp) + " must be at least 1";
    if (T % (2 * cp) != 0)
        return "--cp " + std::to_string(cp) + " splits each sequence into 2 x cp = " + std::to_string(2 * cp) +
               " chunks (zigzag), which must divide -t " + std::to_string(T);
    return "";
}

// Rows of rank's local sequences from B whole ones: local (B, local_length) from whole (B, T).
template <typename V> inline void zigzag_rows(V* local, const V* whole, int B, const ZigzagLayout& z, int rank) {
    const int L = z.local_length(rank);
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < L; ++t) local[size_t(b) * L + t] = whole[size_t(b) * z.T + z.position(rank, t)];
}
// The inverse: rank's local rows (B, local_length) into their places in whole (B, T).
template <typename V> inline void unzigzag_rows(V* whole, const V* local, int B, const ZigzagLayout& z, int rank) {
    const int L = z.local_length(rank);
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < L; ++t) whole[size_t(b) * z.T + z.position(rank, t)] = local[size_t(b) * L + t];
}

// ---------------------------------------------------------------------------------------------
// The ring: the context group's communicator, a stream for the transfers and their buffers. Partial
// results and gradient sums are FP32 (as in FlashAttention's own split-KV merges): each is rounded to
// floatX once, when the ring is done, however many ranks added to it.
struct ContextRing {
    ncclComm_t nccl = nullptr;
    MPI_Comm mpi = MPI_COMM_NULL;
    int rank = 0, size = 1;
    bool tensor_cores = false;  // each step's kernels: attention_tc.cuh's (BF16 build), or attention.cuh's SIMT ones
    cudaStream_t stream = nullptr;  // the transfers
    // Device buffers for B x max_local_length rows (context_ring_sizes): keys|values of the visitor and
    // their gradient sum, two of each (one computed on, one arriving); this rank's queries' running
    // out (forward) or dq (backward) sum; one step's out and lse.
    floatX* kv[2] = {nullptr, nullptr};
    float* dkv[2] = {nullptr, nullptr};
    float* sum = nullptr;
    float* part_out = nullptr;
    float* part_lse = nullptr;
    // computed[i]: the compute stream's last use of kv[i] (and of dkv[i]); grad_computed[i]: its last
    // write of dkv[i] (dK/dV done, dQ may still run); arrived[i], grad_arrived[i]: the transfers into
    // kv[i], dkv[i]; drained: the ring stream's last transfer of a pass.
    cudaEvent_t computed[2] = {nullptr, nullptr}, grad_computed[2] = {nullptr, nullptr};
    cudaEvent_t arrived[2] = {nullptr, nullptr}, grad_arrived[2] = {nullptr, nullptr};
    cudaEvent_t drained = nullptr;
};

// Elements of each buffer for micro-batches of B sequences of T positions (C channels, NH heads):
// kv (floatX) and dkv (float) each, sum and part_out (float) each, part_lse (float). None without cp.
struct ContextRingSizes {
    size_t kv = 0, out = 0, lse = 0;
    size_t bytes() const { return 2 * kv * (sizeof(floatX) + sizeof(float)) + 2 * out * sizeof(float) + lse * sizeof(float); }
};
inline ContextRingSizes context_ring_sizes(int B, int T, int C, int NH, int cp) {
    if (cp == 1) return {};
    const size_t rows = size_t(B) * ZigzagLayout{T, cp}.max_local_length();
    return {rows * 2 * C, rows * C, rows * NH};
}

// Streams and events (the buffers are the caller's: gpt2_build plans them with the model's memory).
inline void context_ring_start(ContextRing& ring) {
    if (ring.size == 1) return;
    CUDA_CHECK(cudaStreamCreateWithFlags(&ring.stream, cudaStreamNonBlocking));
    for (int i = 0; i < 2; ++i) {
        CUDA_CHECK(cudaEventCreateWithFlags(&ring.computed[i], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&ring.grad_computed[i], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&ring.arrived[i], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&ring.grad_arrived[i], cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaEventCreateWithFlags(&ring.drained, cudaEventDisableTiming));
}
inline void context_ring_stop(ContextRing& ring) {
    if (ring.stream) CUDA_CHECK(cudaStreamDestroy(ring.stream));
    for (cudaEvent_t* events : {ring.computed, ring.grad_computed, ring.arrived, ring.grad_arrived})
        for (int i = 0; i < 2; ++i)
            if (events[i]) CUDA_CHECK(cudaEventDestroy(events[i]));
    if (ring.drained) CUDA_CHECK(cudaEventDestroy(ring.drained));
    ring.stream = nullptr;
    ring.drained = nullptr;
    for (int i = 0; i < 2; ++i) ring.computed[i] = ring.grad_computed[i] = ring.arrived[i] = ring.grad_arrived[i] = nullptr;
}

namespace context_detail {

template <typename V> constexpr ncclDataType_t nccl_type() {
    return std::is_same_v<V, float> ? ncclFloat32 : ncclBfloat16;
}

// One span's attention forward and backward by the kernels the ring runs (ContextRing::tensor_cores);
// arguments as attention.cuh's span forms.
template <typename Out>
inline void span_forward(const ContextRing& ring, Out* out, float* lse, const floatX* q, const floatX* kv, AttentionSpan span,
                         int B, int C, int NH, cudaStream_t stream, const int* doc_start) {
    if (ring.tensor_cores) attention_tc_forward(out, lse, q, kv, span, B, C, NH, stream, doc_start);
    else attention_forward(out, lse, q, kv, span, B, C, NH, stream, doc_start);
}
template <typename Grad>
inline void span_backward(const ContextRing& ring, Grad* dq, int dq_stride, Grad* dkv, int dkv_stride, const floatX* dout,
                          const floatX* q, const floatX* kv, const float* lse, const float* D, AttentionSpan span, int B, int C,
                          int NH, cudaStream_t stream, const int* doc_start, bool accumulate,
                          cudaEvent_t key_gradients_done = nullptr) {
    if (ring.tensor_cores)
        attention_tc_backward(dq, dq_stride, dkv, dkv_stride, dout, q, kv, lse, D, span, B, C, NH, stream, doc_start, accumulate,
                              key_gradients_done);
    else
        attention_backward(dq, dq_stride, dkv, dkv_stride, dout, q, kv, lse, D, span, B, C, NH, stream, doc_start, accumulate,
                           key_gradients_done);
}

// The ring step's keys: rank r's step s holds the keys of rank (r - s) mod cp.
inline int visitor(const ContextRing& ring, int step) { return (ring.rank - step + ring.size) % ring.size; }

// One hop on the ring stream, after `after` (an event of the compute stream): `send` (the rows of the
// keys this rank held) to the next rank, `receive` (the previous rank's) from the previous one.
template <typename V>
inline void hop(ContextRing& ring, cudaEvent_t after, const V* send, size_t send_count, V* receive, size_t receive_count,
                cudaEvent_t done) {
    CUDA_CHECK(cudaStreamWaitEvent(ring.stream, after, 0));
    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK(ncclSend(send, send_count, nccl_type<V>(), (ring.rank + 1) % ring.size, ring.nccl, ring.stream));
    NCCL_CHECK(ncclRecv(receive, receive_count, nccl_type<V>(), (ring.rank + ring.size - 1) % ring.size, ring.nccl, ring.stream));
    NCCL_CHECK(ncclGroupEnd());
    CUDA_CHECK(cudaEventRecord(done, ring.stream));
}

// The span of step s's pairs (see the top of the file) and the first of the rank's local rows it
// queries. The visitor's keys start at row 0 of its compact k|v buffer: its first chunk, or all.
struct RingStep {
    AttentionSpan span;
    int first_query = 0;
};
// The keys rank's step s attends to, from the start of their buffer: its own rows (s = 0), an earlier
// rank's first chunk, or all of a later rank's rows.
inline int ring_keys(const ZigzagLayout& z, int rank, int step) {
    const int j = (rank - step + z.cp) % z.cp;
    return step == 0 ? z.local_length(rank) : j < rank ? z.first_length(j) : z.local_length(j);
}
inline RingStep ring_step(const ContextRing& ring, const ZigzagLayout& z, int step, int C) {
    const int r = ring.rank, j = visitor(ring, step);
    const int L = z.local_length(r), Lj = z.local_length(j), keys = ring_keys(z, r, step);
    RingStep s;
    if (j < r) s = {{L, keys, L, Lj, 2 * C, 0}, 0};                              // all queries, the visitor's first chunk
    else s = {{L - z.first_length(r), keys, L, Lj, 2 * C, 0}, z.first_length(r)};  // the second chunk's queries, all keys
    s.span.key_lead = s.span.Tk;  // every key
    return s;
}

}  // namespace context_detail

// Document masking under context parallelism: for each ring step s (0: the rank's own keys) and each
// of rank's local queries, the first key of that step's key buffer the query sees, the number of the
// buffer's keys before the query's document start (positions increase along a buffer, so the keys a
// query sees are a suffix of it; all of them: 0, none: the count). doc_start: (B, L) document starts of
// rank's local rows as positions in the whole sequence (host/documents.h's, of the whole rows).
// out: (cp, B, L), what the ring's kernels take as their spans' document starts.
inline void context_first_keys(int* out, const int* doc_start, int B, const ZigzagLayout& z, int rank) {
    const int L = z.local_length(rank);
    for (int s = 0; s < z.cp; ++s) {
        const int j = (rank - s + z.cp) % z.cp;
        std::vector<int> positions(size_t(context_detail::ring_keys(z, rank, s)));
        for (size_t k = 0; k < positions.size(); ++k) positions[k] = z.position(j, int(k));
        for (int i = 0; i < B * L; ++i)
            out[size_t(s) * B * L + i] = int(std::lower_bound(positions.begin(), positions.end(), doc_start[i]) - positions.begin());
    }
}

// Forward: out (B, L, C) and lse (B, NH, L) of rank's local rows (L = z.local_length(rank), positions
// as ZigzagLayout says) from its qkv (B, L, 3C), attending to the keys of every rank at positions up to
// each query's. first_keys: context_first_keys' (cp, B, L) on the device for document masking, or null.
// On `stream`; returns with `stream` ordered after the ring's transfers.
inline void ring_attention_forward(ContextRing& ring, floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                                   cudaStream_t stream, const int* first_keys = nullptr) {
    using namespace context_detail;
    const ZigzagLayout z{T, ring.size};
    const int r = ring.rank, n = ring.size, L = z.local_length(r);
    // Step s's document starts, from its first query (null without documents).
    const auto docs = [&](int s, size_t q0) { return first_keys ? first_keys + size_t(s) * B * L + q0 : nullptr; };
    if (n == 1) {
        span_forward(ring, out, lse, qkv, qkv + C, causal_span(L, C), B, C, NH, stream, docs(0, 0));
        return;
    }
    const auto kv_count = [&](int rank) { return size_t(B) * z.local_length(rank) * 2 * C; };
    // Its own chunks first: causal over the local rows (into the FP32 sum), while its keys go out.
    copy_rows(ring.kv[0], 2 * size_t(C), qkv + C, 3 * size_t(C), size_t(B) * L, 2 * C, stream);
    CUDA_CHECK(cudaEventRecord(ring.computed[0], stream));
    hop(ring, ring.computed[0], ring.kv[0], kv_count(r), ring.kv[1], kv_count(visitor(ring, 1)), ring.arrived[1]);
    span_forward(ring, ring.sum, lse, qkv, qkv + C, causal_span(L, C), B, C, NH, stream, docs(0, 0));
    for (int s = 1; s < n; ++s) {
        const int now = s % 2, next = (s + 1) % 2;
        if (s + 1 < n)  // the next visitor arrives while this step computes, into step s-1's buffer
            hop(ring, ring.computed[next], ring.kv[now], kv_count(visitor(ring, s)), ring.kv[next],
                kv_count(visitor(ring, s + 1)), ring.arrived[next]);
        const RingStep step = ring_step(ring, z, s, C);
        const size_t q0 = size_t(step.first_query);
        CUDA_CHECK(cudaStreamWaitEvent(stream, ring.arrived[now], 0));
        span_forward(ring, ring.part_out + q0 * C, ring.part_lse + q0, qkv + q0 * 3 * C, ring.kv[now], step.span, B, C, NH,
                     stream, docs(s, q0));
        attention_merge(ring.sum + q0 * C, lse + q0, ring.part_out + q0 * C, ring.part_lse + q0, B, step.span.Tq, L, C, NH,
                        stream);
        CUDA_CHECK(cudaEventRecord(ring.computed[now], stream));
    }
    copy_rows(out, size_t(C), ring.sum, size_t(C), size_t(B) * L, C, stream);
    CUDA_CHECK(cudaEventRecord(ring.drained, ring.stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream, ring.drained, 0));  // the next pass reuses the buffers
}

// Backward: dqkv (B, L, 3C) of rank's local rows, written, from dout (B, L, C), the forward pass's qkv,
// out and lse (merged over every rank's keys), and D (B, NH, L) floats of scratch; first_keys as the
// forward pass's.
inline void ring_attention_backward(ContextRing& ring, floatX* dqkv, float* D, const floatX* dout, const floatX* qkv,
                                    const floatX* out, const float* lse, int B, int T, int C, int NH, cudaStream_t stream,
                                    const int* first_keys = nullptr) {
    using namespace context_detail;
    const ZigzagLayout z{T, ring.size};
    const int r = ring.rank, n = ring.size, L = z.local_length(r);
    const auto docs = [&](int s, size_t q0) { return first_keys ? first_keys + size_t(s) * B * L + q0 : nullptr; };
    attention_backward_rowdot(D, dout, out, B, L, C, NH, stream);
    if (n == 1) {
        span_backward(ring, dqkv, 3 * C, dqkv + C, 3 * C, dout, qkv, qkv + C, lse, D, causal_span(L, C), B, C, NH, stream,
                      docs(0, 0), false);
        return;
    }
    const auto kv_count = [&](int rank) { return size_t(B) * z.local_length(rank) * 2 * C; };
    // Its own keys: dq into the FP32 sum, dk|dv into the accumulator that starts around the ring.
    copy_rows(ring.kv[0], 2 * size_t(C), qkv + C, 3 * size_t(C), size_t(B) * L, 2 * C, stream);
    span_backward(ring, ring.sum, C, ring.dkv[0], 2 * C, dout, qkv, qkv + C, lse, D, causal_span(L, C), B, C, NH, stream,
                  docs(0, 0), false, ring.grad_computed[0]);
    CUDA_CHECK(cudaEventRecord(ring.computed[0], stream));
    hop(ring, ring.grad_computed[0], ring.dkv[0], kv_count(r), ring.dkv[1], kv_count(visitor(ring, 1)), ring.grad_arrived[1]);
    hop(ring, ring.computed[0], ring.kv[0], kv_count(r), ring.kv[1], kv_count(visitor(ring, 1)), ring.arrived[1]);
    for (int s = 1; s < n; ++s) {
        const int now = s % 2, next = (s + 1) % 2;
        const int j = visitor(ring, s);
        if (s + 1 < n)
            hop(ring, ring.computed[next], ring.kv[now], kv_count(j), ring.kv[next], kv_count(visitor(ring, s + 1)),
                ring.arrived[next]);
        const RingStep step = ring_step(ring, z, s, C);
        const size_t q0 = size_t(step.first_query);
        CUDA_CHECK(cudaStreamWaitEvent(stream, ring.arrived[now], 0));
        CUDA_CHECK(cudaStreamWaitEvent(stream, ring.grad_arrived[now], 0));
        span_backward(ring, ring.sum + q0 * C, C, ring.dkv[now], 2 * C, dout + q0 * C, qkv + q0 * 3 * C, ring.kv[now], lse + q0,
                      D + q0, step.span, B, C, NH, stream, docs(s, q0), /*accumulate=*/true, ring.grad_computed[now]);
        // The sum moves on once this step has added to it, while the step's dQ kernel runs: to the next
        // visitor's holder, and after the last step home to its keys' rank (the next one), while this
        // rank receives its own.
        hop(ring, ring.grad_computed[now], ring.dkv[now], kv_count(j), ring.dkv[next], kv_count(visitor(ring, s + 1)),
            ring.grad_arrived[next]);
        CUDA_CHECK(cudaEventRecord(ring.computed[now], stream));
    }
    CUDA_CHECK(cudaStreamWaitEvent(stream, ring.grad_arrived[n % 2], 0));
    copy_rows(dqkv, 3 * size_t(C), ring.sum, size_t(C), size_t(B) * L, C, stream);
    copy_rows(dqkv + C, 3 * size_t(C), ring.dkv[n % 2], 2 * size_t(C), size_t(B) * L, 2 * C, stream);
    CUDA_CHECK(cudaEventRecord(ring.drained, ring.stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream, ring.drained, 0));
}
