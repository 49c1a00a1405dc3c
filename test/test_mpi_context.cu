// Ring attention (parallel/context.h) across the ranks of `mpirun -np N test_mpi_context`, each rank
// one context rank: every rank holds the zigzag rows of the same random sequences, runs the ring's
// forward and backward passes, and its rows of out, lse and dq, dk, dv must match a double-precision
// reference over the whole sequence (test/attention_reference.h, the full T x T softmax from the
// definitions). Lengths not divisible by 2 x ranks split unevenly (chunks one position apart). The ring
// runs the SIMT kernels, and in the BF16 build also the tensor-core ones (ContextRing::tensor_cores).
#include "parallel/mpi_api.h"
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attention_reference.h"
#include "mpi_test_util.h"
#include "parallel/context.h"
#include "test_util.h"

using namespace attention_reference;

namespace {

int world_rank = 0, world_size = 1;
ProcessGroup context_group;  // the whole world as one context group

// The single-kernel test's bounds (test_kernel_attention.cu), relative to each tensor's max |ref|: the
// ring sums its partial results in FP32 and rounds each output to floatX once, as the kernel does.
struct Tolerances {
    double out, dqk, lse;
};
constexpr Tolerances kTolerances = std::is_same_v<floatX, float> ? Tolerances{5e-6, 5e-6, 1e-6}
                                                                 : Tolerances{0x1p-8 + 5e-6, 1e-2, 1e-6};
// The tensor-core kernels' bounds (test_kernel_attention_tc.cu: they also round P and dS to bf16), dq and
// dk 1.5e-2: measured over these cases at 1-4 ranks out 3.7e-3, lse 1.9e-7, dq 4.5e-3, dv 4.5e-3 and dk
// 1.0e-2 (the sharp rows, T 96, rank 2 of 4: relative to the max of the rank's own rows, each a sum of
// dS^T q over bf16-rounded dS; the SIMT kernels 8.8e-3 there, the whole sequence's single kernel 5.6e-3).
constexpr Tolerances kTensorCoreTolerances{0x1p-8 + 1e-3, 1.5e-2, 1e-6};
const Tolerances& tolerances_of(Kernels which) { return which == Kernels::tensor_core ? kTensorCoreTolerances : kTolerances; }

// The kernels the ring can run in this build: the tensor-core ones take BF16 operands.
std::vector<Kernels> ring_kernels() {
    if (std::is_same_v<floatX, float>) return {Kernels::simt};
    return {Kernels::simt, Kernels::tensor_core};
}

struct RingResults {
    std::vector<floatX> out, dqkv;
    std::vector<float> lse;
};

// This rank's rows through the ring, outputs NaN-filled first (every element must be written); with
// doc_start_whole, (B, T) document starts of the whole rows, document-masked.
RingResults run_ring(Kernels which, const std::vector<floatX>& qkv_whole, const std::vector<floatX>& dout_whole, const Sizes& s,
                     const std::vector<int>* doc_start_whole = nullptr) {
    const ZigzagLayout z{s.T, world_size};
    const int L = z.local_length(world_rank), C = s.C;
    std::vector<floatX> qkv_local(size_t(s.B) * L * 3 * C), dout_local(size_t(s.B) * L * C);
    for (int b = 0; b < s.B; ++b)
        for (int t = 0; t < L; ++t) {
            const size_t from = size_t(b) * s.T + z.position(world_rank, t), to = size_t(b) * L + t;
            std::memcpy(&qkv_local[to * 3 * C], &qkv_whole[from * 3 * C], 3 * C * sizeof(floatX));
            std::memcpy(&dout_local[to * C], &dout_whole[from * C], C * sizeof(floatX));
        }
    const ContextRingSizes sizes = context_ring_sizes(s.B, s.T, C, s.NH, world_size);
    DeviceBuffer<floatX> qkv(qkv_local), dout(dout_local), out(size_t(s.B) * L * C), dqkv(qkv_local.size());
    DeviceBuffer<floatX> kv0(sizes.kv), kv1(sizes.kv);
    DeviceBuffer<float> dkv0(sizes.kv), dkv1(sizes.kv), sum(sizes.out), part_out(sizes.out), part_lse(sizes.lse);
    DeviceBuffer<float> lse(size_t(s.B) * s.NH * L), D(size_t(s.B) * s.NH * L);
    for (auto* b : {&out, &dqkv, &kv0, &kv1}) b->fill_bytes(0xFF);
    for (auto* b : {&lse, &D, &dkv0, &dkv1, &sum, &part_out, &part_lse}) b->fill_bytes(0xFF);
    // Document masking: the first key each local query sees in each ring step's key buffer.
    std::vector<int> first_keys_host(size_t(world_size) * s.B * L, 0), local_starts(size_t(s.B) * L);
    if (doc_start_whole) {
        zigzag_rows(local_starts.data(), doc_start_whole->data(), s.B, z, world_rank);
        context_first_keys(first_keys_host.data(), local_starts.data(), s.B, z, world_rank);
    }
    DeviceBuffer<int> first_keys(first_keys_host);
    const int* docs = doc_start_whole ? first_keys.ptr : nullptr;
    CUDA_CHECK(cudaDeviceSynchronize());  // the fills and copies (legacy stream) before the ring's non-blocking streams
    ContextRing ring{context_group.nccl, context_group.mpi, context_group.rank, context_group.size};
    ring.kv[0] = kv0.ptr, ring.kv[1] = kv1.ptr, ring.dkv[0] = dkv0.ptr, ring.dkv[1] = dkv1.ptr;
    ring.sum = sum.ptr, ring.part_out = part_out.ptr, ring.part_lse = part_lse.ptr;
    ring.tensor_cores = which == Kernels::tensor_core;
    context_ring_start(ring);
    cudaStream_t stream = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    launch_record::start(false);
    ring_attention_forward(ring, out.ptr, lse.ptr, qkv.ptr, s.B, s.T, C, s.NH, stream, docs);
    ring_attention_backward(ring, dqkv.ptr, D.ptr, dout.ptr, qkv.ptr, out.ptr, lse.ptr, s.B, s.T, C, s.NH, stream, docs);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    // The kernels asked for ran: per ring step one forward and two backward (dK/dV, dQ) launches.
    int tensor_core_launches = 0;
    for (const LaunchRecord& r : launch_record::stop()) tensor_core_launches += r.kind == WorkKind::tensor_cores;
    CHECK(tensor_core_launches == (which == Kernels::tensor_core ? 3 * world_size : 0));
    CUDA_CHECK(cudaStreamDestroy(stream));
    context_ring_stop(ring);
    return {out.download(), dqkv.download(), lse.download()};
}

}  // namespace

TEST_CASE("zigzag layout: every position on exactly one rank and found there, the causal work balanced") {
    for (const int cp : {1, 2, 3, 4, 8})
        for (const int T : {16, 37, 64, 1000, 1024}) {
            CAPTURE(cp, T);
            const ZigzagLayout z{T, cp};
            std::set<int> seen;
            double most = 0, least = 1e300;
            for (int r = 0; r < cp; ++r) {
                double pairs = 0;  // causal (query, key) pairs of the rank's queries: position + 1 each
                for (int t = 0; t < z.local_length(r); ++t) {
                    CHECK(seen.insert(z.position(r, t)).second);
                    const ZigzagLayout::Row back = z.row_of(z.position(r, t));  // the inverse (sampling's last row)
                    CHECK((back.rank == r && back.row == t));
                    pairs += z.position(r, t) + 1;
                    if (t > 0) CHECK(z.position(r, t) > z.position(r, t - 1));  // local order is position order
                }
                most = std::max(most, pairs), least = std::min(least, pairs);
            }
            CHECK(int(seen.size()) == T);
            CHECK(*seen.begin() == 0);
            CHECK(*seen.rbegin() == T - 1);
            // Chunks i and 2cp-1-i pair a short causal row count with a long one: with even chunks every
            // rank has the same pairs; uneven ones differ by at most a chunk's worth of rows.
            if (T % (2 * cp) == 0) CHECK(most == least);
            else CHECK(most - least <= 2.0 * T);
        }
    CHECK(context_parallel_problem(1024, 4) == "");
    CHECK(context_parallel_problem(1000, 8) == "--cp 8 splits each sequence into 2 x cp = 16 chunks (zigzag), which must divide -t 1000");
    CHECK(context_parallel_problem(64, 0) == "--cp 0 must be at least 1");
}

// This rank's rows of out, lse, dq, dk and dv against the reference's rows at the same positions.
void check_rows_against(Kernels which, const RingResults& got, const Reference& ref, const Sizes& s, const char* what) {
    const ZigzagLayout z{s.T, world_size};
    const int L = z.local_length(world_rank), C = s.C;
    std::vector<double> out_ref, lse_ref, grad_ref[3];
    std::vector<floatX> grad[3];
    for (int b = 0; b < s.B; ++b)
        for (int t = 0; t < L; ++t) {
            const size_t whole = size_t(b) * s.T + z.position(world_rank, t), local = size_t(b) * L + t;
            for (int c = 0; c < C; ++c) out_ref.push_back(ref.out[whole * C + c]);
            for (int part = 0; part < 3; ++part)
                for (int c = 0; c < C; ++c) {
                    grad_ref[part].push_back(ref.dqkv[whole * 3 * C + part * C + c]);
                    grad[part].push_back(got.dqkv[local * 3 * C + part * C + c]);
                }
        }
    for (int b = 0; b < s.B; ++b)
        for (int h = 0; h < s.NH; ++h)
            for (int t = 0; t < L; ++t) lse_ref.push_back(ref.lse[(size_t(b) * s.NH + h) * s.T + z.position(world_rank, t)]);
    const TensorError e_out = tensor_error(got.out, out_ref), e_lse = tensor_error(got.lse, lse_ref);
    const TensorError e_dq = tensor_error(grad[0], grad_ref[0]), e_dk = tensor_error(grad[1], grad_ref[1]);
    const TensorError e_dv = tensor_error(grad[2], grad_ref[2]);
    const Tolerances& tol = tolerances_of(which);
    CHECK(e_out <= tol.out);
    CHECK(e_lse <= tol.lse);
    CHECK(e_dq <= tol.dqk);
    CHECK(e_dk <= tol.dqk);
    CHECK(e_dv <= tol.out);
    if (std::getenv("TEST_MPI_CONTEXT_VERBOSE"))
        std::printf("rank %d/%d %s %s T %d C %d: out %.3g lse %.3g dq %.3g dk %.3g dv %.3g\n", world_rank, world_size,
                    kernels_name(which), what, s.T, C, e_out.value, e_lse.value, e_dq.value, e_dk.value, e_dv.value);
}

TEST_CASE("ring attention over the context group equals attention over the whole sequence") {
    const Sizes cases[] = {
        {2, 37, 32, 2, 3.0f},    // hs 16; T = 37: uneven chunks at every rank count
        {1, 130, 128, 2, 2.0f},  // hs 64 (GPT-2); several 32-row tiles per chunk at 2 ranks
        {2, 48, 256, 2, 1.5f},   // hs 128
        {1, 96, 64, 1, 4.0f},    // sharp rows: the merges rescale by large factors
    };
    for (const Kernels which : ring_kernels())
    for (const Sizes& s : cases) {
        CAPTURE(kernels_name(which), world_size, s.B, s.T, s.C, s.NH);
        std::mt19937 rng(2024 + s.T + s.C);  // the same sequences on every rank
        const std::vector<floatX> qkv = random_qkv(s, rng);
        const std::vector<floatX> dout = random_floatX(size_t(s.B) * s.T * s.C, 1.0f, rng);
        check_rows_against(which, run_ring(which, qkv, dout, s), reference_attention(qkv, dout, s), s, "causal");
    }
}

// Documents cross the chunks: a query's document may start in another rank's chunk, or in its own
// chunk after every key of a visiting chunk (the visitor's step then gives that row nothing: out 0,
// lse -inf, weight 0 in the merge). The test's own document cases (test/attention_reference.h).
TEST_CASE("ring attention with documents equals document-masked attention over the whole sequence") {
    for (const Kernels which : ring_kernels())
    for (const DocumentCase& c : document_cases()) {
        const Sizes& s = c.s;
        CAPTURE(kernels_name(which), world_size, c.what, s.B, s.T, s.C, s.NH);
        std::mt19937 rng(777 + s.T * 7 + s.C);
        const std::vector<floatX> qkv = random_qkv(s, rng);
        const std::vector<floatX> dout = random_floatX(size_t(s.B) * s.T * s.C, 1.0f, rng);
        const std::vector<int> docs = packed_rows(s.T, c.eots);
        const Reference ref = reference_attention(qkv, dout, s, &docs);
        const RingResults got = run_ring(which, qkv, dout, s, &docs);
        check_rows_against(which, got, ref, s, "documents");
        // The mask matters: plain causal attention is far from it.
        CHECK(tensor_error(run_ring(which, qkv, dout, s).out, got.out).value > 10 * tolerances_of(which).out);
    }
}

TEST_CASE("ring attention is bitwise deterministic") {
    const Sizes s{2, 64, 128, 2, 2.0f};
    std::mt19937 rng(7);
    const std::vector<floatX> qkv = random_qkv(s, rng);
    const std::vector<floatX> dout = random_floatX(size_t(s.B) * s.T * s.C, 1.0f, rng);
    auto same_bits = [](const auto& a, const auto& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    for (const Kernels which : ring_kernels()) {
        CAPTURE(kernels_name(which));
        const RingResults first = run_ring(which, qkv, dout, s), second = run_ring(which, qkv, dout, s);
        CHECK(same_bits(first.out, second.out));
        CHECK(same_bits(first.lse, second.lse));
        CHECK(same_bits(first.dqkv, second.dqkv));
    }
}

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (!mpi_test_device_per_rank("test_mpi_context")) {
        MPI_Finalize();
        return kSkipReturnCode;
    }
    GridCoordinates shape;
    shape.context = world_size;
    context_group = make_process_group(shape, world_rank, Axis::context);

    const int failed = run_catch_session(
        argc, argv, "test_mpi_context rank " + std::to_string(world_rank) + " of " + std::to_string(world_size));
    release_process_group(context_group);
    int ranks_failed = failed != 0;
    MPI_Allreduce(MPI_IN_PLACE, &ranks_failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (world_rank == 0) std::printf("test_mpi_context: %d rank(s), %d with failures\n", world_size, ranks_failed);
    MPI_Finalize();
    return ranks_failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
