// Linear layers, y = x W^T + b (torch.nn.Linear), through cuBLASLt: forward with the bias and
// GELU fused into the GEMM epilogue, backward for the input (GELU gradient fused), the weight
// (accumulated by the GEMM itself, beta = 1) and the bias (our deterministic column-sum kernel).
//
// Row-major storage seen by column-major cuBLASLt: a row-major R x K matrix (row stride K) is, byte
// for byte, the column-major K x R matrix with ld K, i.e. its transpose. cuBLASLt computes
// D (m x n) = op(A) (m x k) op(B) (k x n), so each product is written for the transposes:
//   forward  out^T (OC x N) = W (OC x C) inp^T (C x N):      A = weight, stored C x OC ld C, TRANSA = T
//            B = inp, stored C x N ld C, N;  m = OC, n = N, k = C;  D = out, ld OC.
//            Bias has one entry per row of D (EPILOGUE_BIAS: "length must match matrix D rows"):
//            one per output feature, as wanted. pre_gelu (GELU input, N x OC) is laid out like D.
//   dinp     dinp^T (C x N) = W^T (C x OC) dout^T (OC x N):   A = weight, stored C x OC ld C, N;
//            B = dout, stored OC x N ld OC, N;  m = C, n = N, k = OC;  D = dinp, ld C. The DGELU
//            aux (pre_gelu_of_inp, N x C) is laid out like D, ld C.
//   dweight  dweight^T (C x OC) += inp^T (C x N) dout (N x OC): A = inp, stored C x N ld C, N;
//            B = dout, stored OC x N ld OC, TRANSB = T;  m = C, n = OC, k = N;  C = D = dweight, ld C.
#pragma once

#include "common.cuh"
#include "elementwise.cuh"
#include "host/matmul_algos.h"

#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

// cublasSetWorkspace docs: 32 MiB is the recommended workspace for Hopper (4 MiB before it).
constexpr size_t kMatmulWorkspaceBytes = size_t(32) << 20;

inline std::string matmul_requirements(int C, int OC) {
    // 8 elements = 16 bytes in BF16: rows of every matrix start 16-byte aligned (Packed128, the
    // tensor-core kernels), and EPILOGUE_AUX_LD (= C or OC) "must be divisible by 8".
    for (auto [name, value] : {std::pair<const char*, int>{"C", C}, {"OC", OC}}) {
        if (value <= 0) return std::string("matmul: ") + name + " = " + std::to_string(value) + " is not positive";
        if (value % 8 != 0)
            return std::string("matmul: ") + name + " = " + std::to_string(value) + " is not a multiple of 8";
    }
    return "";
}

namespace matmul_detail {
struct PlanCache;
}

// The cuBLASLt handle, its workspace and the plans made for each GEMM shape: owned by whoever runs
// matmuls (the model owns one), and passed to every matmul. No global state: two models, or a test
// beside a model, never share one.
struct Matmul {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;  // kMatmulWorkspaceBytes of device memory, the owner's
    // At a shape's first use, time the heuristic's candidates and keep the fastest (--matmul-autotune);
    // off: the heuristic's first. Timing picks can differ between runs and ranks, and so can the
    // last bits of the results: off keeps runs bitwise repeatable, and so does autotune with an earlier
    // run's picks taken (matmul_take_algos below).
    bool autotune = false;
    // The bias gradient in the weight gradient's GEMM (EPILOGUE_BGRADB) where cuBLASLt has an algorithm
    // for it; else, or when false, our column-sum kernels (bias_grad_*_kernel below).
    bool fuse_bias_grad = true;
    // With fuse_bias_grad, where cuBLASLt refuses FP32 sums beside a BF16 D (an H100's cuBLAS 13): BGRADB
    // in D's type, the documented default ("bias gradient vector elements are the same type as the output
    // elements", cublasLt.h), before the kernels. Off by default (--bias-grad epilogue turns it on): the
    // sums are then rounded to BF16 once more before they are added, and what the epilogue costs the GEMMs
    // on a GPU is not measured (the weight gradients' GEMMs split k there, which BGRADB may forbid).
    bool bias_grad_in_output_type = false;
    // matmul_forward's residual added by the GEMM's epilogue (beta C) where cuBLASLt has an algorithm for
    // it; else, or when false, the GEMM and then an elementwise add (accumulate, kernels/elementwise.cuh).
    bool residual_in_epilogue = true;
    std::shared_ptr<matmul_detail::PlanCache> plans;  // made by matmul_create
};

namespace matmul_detail {

// A failing cuBLASLt call throws with the call, file, line and status (like CUDA_CHECK).
inline void check_cublaslt(cublasStatus_t status, const char* call, const char* file, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    throw TrainGptError("cuBLASLt error at " + std::string(file) + ":" + std::to_string(line) + ": " + call + ": " +
                        cublasLtGetStatusName(status) + " (CUBLASLT_LOG_LEVEL=1 logs why)");
}
#define CUBLASLT_CHECK(call) matmul_detail::check_cublaslt((call), #call, __FILE__, __LINE__)

constexpr cudaDataType kFloatXType = std::is_same_v<floatX, float> ? CUDA_R_32F : CUDA_R_16BF;

// One cublasLtMatmul, column-major: D = epilogue(op(A) op(B) + beta C), C = D unless `c` is set.
struct Gemm {
    cublasOperation_t transa, transb;
    int m, n, k;
    const floatX* a;
    int lda;
    const floatX* b;
    int ldb;
    floatX* d;
    int ldd;
    float beta = 0.0f;  // 1: accumulate onto D, or onto `c`
    const floatX* c = nullptr;  // with beta != 0: C when it is not D (D's layout)
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const floatX* bias = nullptr;
    floatX* aux = nullptr;  // GELU input: written by GELU_AUX*, read by DGELU; laid out like D
};

// Largest power of two (up to 256) dividing the address.
inline uint32_t alignment_of(const void* p) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(p);
    return address == 0 ? 256u : uint32_t(std::min<uintptr_t>(256, address & (~address + 1)));
}

// What one GEMM costs: 2mnk FLOPs (plus the beta * C accumulation and the bias add); bytes: A, B
// and D once, C when beta != 0, the bias, and the GELU aux (written by GELU_AUX*, read by DGELU).
inline KernelCost gemm_cost(const Gemm& g) {
    const double m = g.m, n = g.n, k = g.k, X = sizeof(floatX);
    double flops = 2 * m * n * k + (g.beta != 0.0f ? 2 * m * n : 0) + (g.bias ? m * n : 0);
    double bytes = (m * k + k * n + m * n * (g.beta != 0.0f ? 2 : 1)) * X + (g.bias ? m * X : 0) + (g.aux ? m * n * X : 0);
    return {flops, bytes, WorkKind::matmul};
}

// Everything that decides a GEMM's cuBLASLt objects and algorithm: the shape, the layouts, the
// epilogue and the operands' alignments (the heuristic reads them: MIN_ALIGNMENT_*_BYTES, and the
// bias and aux pointers' values, BIAS_POINTER doc). Not the pointers themselves: those are set on
// the cached descriptor at every call.
struct PlanKey {
    int transa, transb, m, n, k, lda, ldb, ldd;
    bool accumulate;
    uint32_t epilogue;
    int bias_type;  // -1 without a bias
    uint32_t align_a, align_b, align_d, align_bias, align_aux;
    auto operator<=>(const PlanKey&) const = default;
};

// One shape's objects, made at its first use and kept until matmul_destroy: a d12 micro-step runs
// 15 shapes 147 times, and creating descriptors, layouts and asking the heuristic at every call
// costs host time that the GPU waits out when the host is the slower side.
struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool supported = false;  // the heuristic found an algorithm
    cublasStatus_t heuristic_status = CUBLAS_STATUS_SUCCESS;  // why not, where it found none
    int candidates = 0;      // how many it offered (autotune times up to kAutotuneCandidates)
    int chosen = 0;          // which of them runs
};

struct PlanCache {
    std::map<PlanKey, Plan> plans;
    int misses = 0;  // plans made (tests count them)
    // Under autotune: the algorithms an earlier run picked (host/matmul_algos.h), taken for their shapes
    // without timing where the heuristic still offers them; how many shapes were timed, and how many took
    // a recorded pick.
    std::map<PlanKey, cublasLtMatmulAlgo_t> recorded;
    int timed = 0, from_record = 0;
    PlanCache() = default;
    PlanCache(const PlanCache&) = delete;
    PlanCache& operator=(const PlanCache&) = delete;
    ~PlanCache() {
        for (auto& [key, plan] : plans) {
            if (plan.d) cublasLtMatrixLayoutDestroy(plan.d);
            if (plan.b) cublasLtMatrixLayoutDestroy(plan.b);
            if (plan.a) cublasLtMatrixLayoutDestroy(plan.a);
            if (plan.desc) cublasLtMatmulDescDestroy(plan.desc);
        }
    }
};

constexpr int kAutotuneCandidates = 8;   // the heuristic's best few
constexpr int kAutotuneRepetitions = 3;  // timed runs per candidate, after one untimed

// Sets the per-call pointers on a plan's descriptor.
inline void set_pointers(const Plan& plan, const Gemm& g, const void* bias) {
    if (bias) CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (g.aux) CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux));
}

inline cublasStatus_t launch_gemm(const Matmul& mm, const Plan& plan, const cublasLtMatmulAlgo_t& algo, const Gemm& g,
                                  cudaStream_t stream) {
    const float alpha = 1.0f;
    const void* c = g.c ? static_cast<const void*>(g.c) : g.d;
    return cublasLtMatmul(mm.handle, plan.desc, &alpha, g.a, plan.a, g.b, plan.b, &g.beta, c, plan.d, g.d, plan.d, &algo,
                          mm.workspace, kMatmulWorkspaceBytes, stream);
}

// Times each candidate on the call's own operands and returns the fastest's index. The candidates
// write D (and the aux or bias output) as the real call will; where the GEMM accumulates onto D
// itself (beta = 1, no other C) they would add to it too, so D is saved first and put back after.
// Where no memory is left for that copy, the heuristic's first is kept, with a note.
inline int fastest_candidate(const Matmul& mm, const Plan& plan, const cublasLtMatmulHeuristicResult_t* candidates,
                             int count, const Gemm& g, cudaStream_t stream) {
    const size_t d_bytes = (size_t(g.ldd) * size_t(g.n - 1) + size_t(g.m)) * sizeof(floatX);
    void* saved = nullptr;
    if (g.beta != 0.0f && (g.c == nullptr || g.c == g.d)) {
        if (cudaMalloc(&saved, d_bytes) != cudaSuccess) {
            (void)cudaGetLastError();
            std::fprintf(stderr, "note: matmul autotune: no %zu bytes to save D (m %d, n %d, k %d): the heuristic's first algorithm\n",
                         d_bytes, g.m, g.n, g.k);
            return 0;
        }
        CUDA_CHECK(cudaMemcpyAsync(saved, g.d, d_bytes, cudaMemcpyDeviceToDevice, stream));
    }
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    int best = 0;
    float best_ms = -1.0f;
    for (int i = 0; i < count; ++i) {
        if (launch_gemm(mm, plan, candidates[i].algo, g, stream) != CUBLAS_STATUS_SUCCESS) continue;  // untimed warm-up
        CUDA_CHECK(cudaEventRecord(start, stream));
        bool ok = true;
        for (int r = 0; r < kAutotuneRepetitions && ok; ++r)
            ok = launch_gemm(mm, plan, candidates[i].algo, g, stream) == CUBLAS_STATUS_SUCCESS;
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (ok && (best_ms < 0.0f || ms < best_ms)) best = i, best_ms = ms;
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    if (saved) {
        CUDA_CHECK(cudaMemcpyAsync(g.d, saved, d_bytes, cudaMemcpyDeviceToDevice, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        CUDA_CHECK(cudaFree(saved));
    }
    return best;
}

// Under autotune: the candidate an earlier run picked for this shape (PlanCache::recorded), if the
// heuristic still offers it; else the fastest, timed now. A recorded pick the heuristic no longer
// offers is timed again, with a note: that run's results and this one's may then differ in their last bits.
inline int recorded_or_fastest(const Matmul& mm, const PlanKey& key, const Plan& plan,
                               const cublasLtMatmulHeuristicResult_t* candidates, const Gemm& g, cudaStream_t stream) {
    PlanCache& cache = *mm.plans;
    if (const auto found = cache.recorded.find(key); found != cache.recorded.end()) {
        for (int i = 0; i < plan.candidates; ++i)
            if (std::memcmp(&candidates[i].algo, &found->second, sizeof found->second) == 0) {
                ++cache.from_record;
                return i;
            }
        std::fprintf(stderr, "note: matmul autotune: the recorded algorithm for m %d, n %d, k %d (epilogue %u) is not among "
                     "cuBLASLt's %d candidates now: timed again\n", g.m, g.n, g.k, uint32_t(g.epilogue), plan.candidates);
    }
    ++cache.timed;
    return fastest_candidate(mm, plan, candidates, plan.candidates, g, stream);
}

// The plan for this GEMM: cached, or made now (descriptor, layouts, the heuristic's algorithm, or
// the fastest of its candidates under autotune).
inline const Plan& plan_for(const Matmul& mm, const Gemm& g, const void* bias, int bias_type, cudaStream_t stream) {
    const PlanKey key{int(g.transa), int(g.transb), g.m, g.n, g.k, g.lda, g.ldb, g.ldd, g.beta != 0.0f, uint32_t(g.epilogue),
                      bias ? bias_type : -1, alignment_of(g.a), alignment_of(g.b),
                      std::min(alignment_of(g.d), g.c ? alignment_of(g.c) : 256u),  // C's too: MIN_ALIGNMENT_C takes it
                      bias ? alignment_of(bias) : 0u, g.aux ? alignment_of(g.aux) : 0u};
    if (const auto found = mm.plans->plans.find(key); found != mm.plans->plans.end()) return found->second;
    ++mm.plans->misses;
    Plan plan;
    CUBLASLT_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const int32_t transa = g.transa, transb = g.transb;  // attribute types from cublasLt.h
    const uint32_t epilogue = g.epilogue;
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa));
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb));
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    if (bias) {
        const int32_t type = bias_type;  // BIAS_DATA_TYPE: the bias, or the bias gradient BGRAD* writes
        CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof type));
    }
    if (g.aux) {
        const int64_t aux_ld = g.ldd;  // EPILOGUE_AUX_LD: a multiple of 8, at least D's rows
        CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
    }
    // Set before the heuristic: it reads these pointers' values for their alignment (BIAS_POINTER doc).
    set_pointers(plan, g, bias);
    // Layouts: rows x cols of the matrix as stored (before op), column-major.
    const bool ta = g.transa != CUBLAS_OP_N, tb = g.transb != CUBLAS_OP_N;
    CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&plan.a, kFloatXType, ta ? g.k : g.m, ta ? g.m : g.k, g.lda));
    CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&plan.b, kFloatXType, tb ? g.n : g.k, tb ? g.k : g.n, g.ldb));
    CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&plan.d, kFloatXType, g.m, g.n, g.ldd));

    cublasLtMatmulPreference_t preference;
    CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const uint64_t workspace_bytes = kMatmulWorkspaceBytes;
    CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                        &workspace_bytes, sizeof workspace_bytes));
    // MIN_ALIGNMENT_*_BYTES docs: the heuristic assumes 256-byte aligned matrices by default;
    // slices of the parameter and activation buffers may be less aligned, so say what they are.
    CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_a, sizeof key.align_a));
    CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_b, sizeof key.align_b));
    CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_d, sizeof key.align_d));
    CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_d, sizeof key.align_d));
    // Split-K partial sums in FP32 only: the default mask also allows INPLACE and OUTPUT_TYPE, which
    // add the parts up in D's type (REDUCTION_SCHEME docs), i.e. in BF16 for a BF16 output. The weight
    // gradients (small m x n, k = B*T) are where the heuristic splits k (an H100 ran nvjet ..._splitK
    // kernels there). The BF16 accumulation errors measured on the H100 did not change with this mask:
    // they come from the epilogue adding beta C in BF16 (test_kernel_matmul, kHardwareTermUnits).
    const uint32_t reduction_schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;  // | NONE, which is 0
    CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                        &reduction_schemes, sizeof reduction_schemes));

    cublasLtMatmulHeuristicResult_t candidates[kAutotuneCandidates] = {};
    const int requested = mm.autotune ? kAutotuneCandidates : 1;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(mm.handle, plan.desc, plan.a, plan.b, plan.d, plan.d,
                                                                 preference, requested, candidates, &plan.candidates);
    cublasLtMatmulPreferenceDestroy(preference);
    // No algorithm for this problem: NOT_SUPPORTED, or success with none returned; and INVALID_VALUE,
    // which an H100's cuBLAS 13 returns for a type combination it lacks (an FP32 bias gradient with a
    // BF16 D under BGRADB), where the documentation would lead one to expect NOT_SUPPORTED. Which
    // call needed the algorithm decides: run() fails naming this status, the fused bias gradient
    // falls back to its kernels.
    if (status != CUBLAS_STATUS_NOT_SUPPORTED && status != CUBLAS_STATUS_INVALID_VALUE) CUBLASLT_CHECK(status);
    if (status != CUBLAS_STATUS_SUCCESS) plan.candidates = 0;
    plan.heuristic_status = status;
    plan.supported = plan.candidates > 0;
    if (plan.supported) {
        plan.chosen = plan.candidates > 1 ? recorded_or_fastest(mm, key, plan, candidates, g, stream) : 0;
        plan.algo = candidates[plan.chosen].algo;
    }
    return mm.plans->plans.emplace(key, plan).first->second;
}

// Runs one GEMM through its plan; false (and nothing run) where cuBLASLt has no algorithm for it,
// with the heuristic's status in *why_not. `bias` is g.bias, or the bias gradient's output for BGRAD*
// epilogues, of type `bias_type`.
inline bool try_run(const Matmul& mm, const Gemm& g, const void* bias, int bias_type, cudaStream_t stream,
                    const std::string& name, cublasStatus_t* why_not = nullptr) {
    const Plan& plan = plan_for(mm, g, bias, bias_type, stream);
    if (why_not) *why_not = plan.heuristic_status;
    if (!plan.supported) return false;
    set_pointers(plan, g, bias);
    const KernelCost cost = gemm_cost(g);
    launch_record::Scope recorded(name, cost.kind, cost.flops, cost.bytes, stream);
    recorded.gemm(g.m, g.n, g.k);
    CUBLASLT_CHECK(launch_gemm(mm, plan, plan.algo, g, stream));
    return true;
}

// `name` labels the GEMM in launch records (launch_record.h).
inline void run(const Matmul& mm, const Gemm& g, cudaStream_t stream, const std::string& name) {
    cublasStatus_t why_not = CUBLAS_STATUS_SUCCESS;
    if (!try_run(mm, g, g.bias, kFloatXType, stream, name, &why_not))
        require_supported("cublasLtMatmulAlgoGetHeuristic",
                          "matmul: cuBLASLt has no algorithm for m = " + std::to_string(g.m) + ", n = " +
                              std::to_string(g.n) + ", k = " + std::to_string(g.k) + ", epilogue " +
                              std::to_string(uint32_t(g.epilogue)) + " (" + cublasLtGetStatusName(why_not) + ")");
}

// ---------------------------------------------------------------------------------------------
// Bias gradient, dbias[o] += sum over rows n of dout[n, o], without atomics: blocks of 32 x 4
// threads cover 32 16-byte column groups of one chunk of rows; each writes its chunk's column
// sums to `partials` (chunk-major), and a second kernel adds the chunks in order.

// 4 row threads, each with two running sums (its even and odd rows): with 8 row threads of one
// chain each, the CPU emulator's threads waited on their chains' adds and paid twice the starts and
// barrier switches (d12 B=4 T=64, 48 launches: 7.5-9.7 -> 5.3-5.6 ms); a GPU keeps as many loads in
// flight (two per thread).
constexpr int kBiasRowThreads = 4;  // blockDim.y
// At least 256 rows a chunk: a GPU's row counts (B*T in the tens of thousands) still fill 128
// chunks; at a CPU run's few hundred rows, each emulated thread's barrier is worth its rows
// (d12 B=4 T=64 step: 46 -> 20-22 ms against 64 rows a chunk).
constexpr int kBiasMinRowsPerChunk = 256, kBiasMaxChunks = 128;
constexpr int kPack = Packed128<floatX>::size;
// A block's columns: 32 16-byte groups of the rows it reads (floatX: dout; float: another kernel's
// partial rows, bias_grad_add_partials).
template <typename In> constexpr int kBiasColumnsPerBlock = 32 * Packed128<In>::size;

inline int bias_grad_chunks(int N) { return std::min(int(ceil_div(N, kBiasMinRowsPerChunk)), kBiasMaxChunks); }

template <typename In>
static __global__ void __launch_bounds__(32 * kBiasRowThreads)
    bias_grad_partial_kernel(float* partials, const In* dout, int N, int OC, int rows_per_chunk) {
    constexpr int kPack = Packed128<In>::size, kColumns = kBiasColumnsPerBlock<In>;
    __shared__ float column_sums[kBiasRowThreads][kColumns];
    const int block_column = blockIdx.x * kColumns;
    const int column = block_column + threadIdx.x * kPack;
    const int row_end = min(N, int(blockIdx.y + 1) * rows_per_chunk);
    // Two running sums, the thread's even and odd rows, added at the end: one was a chain of
    // dependent adds, whose latency bounded the CPU emulator's threads.
    float sums[2][kPack] = {};
    if (column < OC) {
        const auto add_row = [&](float (&to)[kPack], int row) {
            float values[kPack];
            unpack_floats(values, load128(dout + size_t(row) * OC + column));
            LANE_LOOP
            for (int i = 0; i < kPack; ++i) to[i] += values[i];
        };
        int row = blockIdx.y * rows_per_chunk + threadIdx.y;
        for (; row + kBiasRowThreads < row_end; row += 2 * kBiasRowThreads) {
            add_row(sums[0], row);
            add_row(sums[1], row + kBiasRowThreads);
        }
        if (row < row_end) add_row(sums[0], row);
    }
    for (int i = 0; i < kPack; ++i) column_sums[threadIdx.y][threadIdx.x * kPack + i] = sums[0][i] + sums[1][i];
    __syncthreads();
    // The threads finish the block's columns (kPack / kBiasRowThreads each): the row threads' sums in
    // a fixed order.
    for (int local = threadIdx.y * 32 + threadIdx.x; local < kColumns && block_column + local < OC;
         local += 32 * kBiasRowThreads) {
        float sum = 0.0f;
        for (int y = 0; y < kBiasRowThreads; ++y) sum += column_sums[y][local];
        partials[size_t(blockIdx.y) * OC + block_column + local] = sum;
    }
}

// The finishing kernel: a block of 32 x partial_row_slices(chunks) threads takes 32 16-byte column
// groups; slice y adds the chunks y, y + slices, ... in order, then the slices are added in order
// (kernels/common.cuh; below 64 chunks one slice, the chunks in order). One thread per column group
// for every chunk left a GPU's 128 chunks (d12, B=64) to one block of 96 threads at 768 columns, each
// add waiting on its load: 23 us a launch on an H100 (1.13 ms over the first profile's 48), for 0.4 MB.
// Now each 32 chunks get a slice of threads: at 128 chunks 4 slices of 32, 4 times the threads (and 3
// blocks, not 1, at 768 columns: a thread takes 8 columns, a block 256).
template <typename Partial>
static __global__ void bias_grad_finish_kernel(floatX* dbias, const Partial* partials, int chunks, int OC) {
    using PartialPack = Packed128<Partial>;
    constexpr int kPartialPacks = kPack / PartialPack::size;
    __shared__ float slice_sums[kPartialRowSlices][32][kPack];
    const int column = (blockIdx.x * 32 + threadIdx.x) * kPack;
    float sums[kPack] = {};
    if (column < OC)
        for (int c = int(threadIdx.y); c < chunks; c += int(blockDim.y))
            for (int i = 0; i < kPartialPacks; ++i) {
                const PartialPack p = load128(partials + size_t(c) * OC + column + i * PartialPack::size);
                for (int j = 0; j < PartialPack::size; ++j) sums[i * PartialPack::size + j] += to_float(p[j]);
            }
    for (int i = 0; i < kPack; ++i) slice_sums[threadIdx.y][threadIdx.x][i] = sums[i];
    __syncthreads();
    if (threadIdx.y != 0 || column >= OC) return;
    float bias[kPack];
    unpack_floats(bias, load128(dbias + column));
    LANE_LOOP
    for (int i = 0; i < kPack; ++i) {
        float total = 0.0f;
        for (int y = 0; y < int(blockDim.y); ++y) total += slice_sums[y][threadIdx.x][i];
        bias[i] += total;  // +=: accumulate
    }
    store128(dbias + column, pack_floats<floatX>(bias));
}

// dbias += the sums of `chunks` partial rows of OC values, in row order: one read of the partials, dbias
// read and written.
template <typename Partial>
inline void finish_bias_grad(floatX* dbias, const Partial* partials, int chunks, int OC, cudaStream_t stream) {
    const double partial_values = double(chunks) * OC;
    const KernelCost cost{partial_values + OC, partial_values * sizeof(Partial) + 2.0 * OC * sizeof(floatX)};
    launch<bias_grad_finish_kernel<Partial>>(cost, dim3(ceil_div(OC / kPack, 32)), dim3(32, partial_row_slices(chunks)), 0,
                                             stream, dbias, partials, chunks, OC);
}

// dbias += the column sums of N rows of OC values at `rows` (In: floatX, an output's gradient; float,
// another kernel's partial rows): the partial kernel's rows into `scratch` (bias_grad_chunks(N) rows of
// OC floats), then the finishing kernel.
template <typename In>
inline void sum_bias_grad(floatX* dbias, float* scratch, const In* rows, int N, int OC, cudaStream_t stream) {
    const int chunks = bias_grad_chunks(N), rows_per_chunk = int(ceil_div(N, chunks));
    const int used_chunks = int(ceil_div(N, rows_per_chunk));
    // Column sums: one add per value, read once; one partial row per chunk written.
    const double partial_floats = double(used_chunks) * OC;
    const KernelCost cost{double(N) * OC, double(N) * OC * sizeof(In) + partial_floats * sizeof(float)};
    launch<bias_grad_partial_kernel<In>>(cost, dim3(ceil_div(OC, kBiasColumnsPerBlock<In>), used_chunks),
                                         dim3(32, kBiasRowThreads), 0, stream, scratch, rows, N, OC, rows_per_chunk);
    finish_bias_grad(dbias, (const float*)scratch, used_chunks, OC, stream);
}

// "matmul_forward(C=768, OC=2304, bias, gelu)": one row per layer shape in the roofline tables.
inline std::string record_name(const char* what, int C, int OC, std::initializer_list<const char*> fused) {
    std::string name = std::string(what) + "(C=" + std::to_string(C) + ", OC=" + std::to_string(OC);
    for (const char* f : fused)
        if (*f) name += std::string(", ") + f;
    return name + ")";
}

// Launcher input checks (one line naming the launcher and the argument, thrown).
struct NamedPointer {
    const char* name;
    const void* pointer;
    bool required = true;
};
inline void check_arguments(const Matmul& mm, const char* launcher, int N, int C, int OC,
                            std::initializer_list<NamedPointer> pointers) {
    require_supported(launcher, mm.handle == nullptr || !mm.plans ? "matmul: the Matmul has no handle (matmul_create)" : "");
    require_supported(launcher, N < 0 ? "matmul: N = " + std::to_string(N) + " is negative" : "");
    require_supported(launcher, matmul_requirements(C, OC));
    for (const NamedPointer& p : pointers) {
        if (p.pointer == nullptr && p.required) require_supported(launcher, std::string("matmul: ") + p.name + " is NULL");
        if (reinterpret_cast<uintptr_t>(p.pointer) % 16 != 0)
            require_supported(launcher, std::string("matmul: ") + p.name + " is not 16-byte aligned");
    }
}

}  // namespace matmul_detail

// ---------------------------------------------------------------------------------------------

// The caller owns the workspace (kMatmulWorkspaceBytes of device memory), so that the program's
// memory plan accounts for it; matmul_destroy does not free it.
inline Matmul matmul_create(void* workspace) {
    require_supported("matmul_create", workspace == nullptr ? "matmul: workspace is null" : "");
    Matmul mm;
    CUBLASLT_CHECK(cublasLtCreate(&mm.handle));
    mm.workspace = workspace;
    mm.plans = std::make_shared<matmul_detail::PlanCache>();
    return mm;
}

inline void matmul_destroy(Matmul& mm) {
    mm.plans.reset();  // its descriptors and layouts before the handle
    if (mm.handle != nullptr) CUBLASLT_CHECK(cublasLtDestroy(mm.handle));
    mm = Matmul{};
}

// ---------------------------------------------------------------------------------------------
// Autotune's picks kept across runs (host/matmul_algos.h): a later run that takes them runs the same
// algorithms, with the same bits, without timing.

namespace matmul_detail {
// A structured binding of all PlanKey's fields: a field added to PlanKey stops this compiling until the
// file's field list (kMatmulPlanKeyFields) has it too.
inline std::array<int64_t, kMatmulPlanKeyFieldCount> plan_key_fields(const PlanKey& key) {
    const auto [transa, transb, m, n, k, lda, ldb, ldd, accumulate, epilogue, bias_type, align_a, align_b, align_d,
                align_bias, align_aux] = key;
    return {transa, transb, m, n, k, lda, ldb, ldd, accumulate, epilogue, bias_type, align_a, align_b, align_d, align_bias,
            align_aux};
}
inline PlanKey plan_key_of(const std::array<int64_t, kMatmulPlanKeyFieldCount>& f) {
    const auto i = [&](size_t at) { return int(f[at]); };
    const auto u = [&](size_t at) { return uint32_t(f[at]); };
    return PlanKey{i(0), i(1), i(2), i(3), i(4), i(5), i(6), i(7), f[8] != 0, u(9), i(10), u(11), u(12), u(13), u(14), u(15)};
}
}  // namespace matmul_detail

// What picks hold for: this cuBLASLt's version, the current device, the precision.
inline MatmulAlgoOrigin matmul_algo_origin() {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    return {"cuBLASLt " + std::to_string(cublasLtGetVersion()), prop.name, kPrecisionName};
}

// The algorithms of every shape autotune chose for (timed, or taken from a record), and the recorded
// ones this run has not met (yet): what a later run should take.
inline MatmulAlgos matmul_algos(const Matmul& mm) {
    using namespace matmul_detail;
    std::map<PlanKey, cublasLtMatmulAlgo_t> picks = mm.plans->recorded;
    for (const auto& [key, plan] : mm.plans->plans)
        if (plan.supported && plan.candidates > 1) picks[key] = plan.algo;
    MatmulAlgos algos{matmul_algo_origin(), {}};
    for (const auto& [key, algo] : picks) {
        MatmulAlgoPick pick{plan_key_fields(key), {}};
        static_assert(sizeof pick.algo == sizeof algo.data, "cublasLtMatmulAlgo_t is 8 words");
        std::memcpy(pick.algo.data(), algo.data, sizeof algo.data);
        algos.picks.push_back(pick);
    }
    return algos;
}

// Takes an earlier run's picks for the shapes not planned yet; "" then, or, where they were written
// for another library, device or precision, why not (and nothing is taken).
inline std::string matmul_take_algos(Matmul& mm, const MatmulAlgos& algos) {
    using namespace matmul_detail;
    const MatmulAlgoOrigin here = matmul_algo_origin();
    if (!(algos.origin == here))
        return "written for " + algos.origin.library + " on " + algos.origin.device + " (" + algos.origin.precision +
               "), this is " + here.library + " on " + here.device + " (" + here.precision + ")";
    for (const MatmulAlgoPick& pick : algos.picks) {
        cublasLtMatmulAlgo_t algo;
        std::memcpy(algo.data, pick.algo.data(), sizeof algo.data);
        mm.plans->recorded[plan_key_of(pick.key)] = algo;
    }
    return "";
}

// out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias; with pre_gelu: pre_gelu = that, out = GELU(it).
// With `residual` (N, OC), not with pre_gelu: out = that + residual, added by the GEMM's epilogue as
// beta C (the residual stream's add, so the LayerNorm after it reads one tensor, not two; out must
// not alias residual).
inline void matmul_forward(const Matmul& mm, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                           int N, int C, int OC, cudaStream_t stream, floatX* pre_gelu = nullptr,
                           const floatX* residual = nullptr) {
    using namespace matmul_detail;
    check_arguments(mm, "matmul_forward", N, C, OC,
                    {{"out", out}, {"inp", inp}, {"weight", weight}, {"bias", bias, false}, {"pre_gelu", pre_gelu, false},
                     {"residual", residual, false}});
    require_supported("matmul_forward", pre_gelu && residual ? "matmul: a residual is not added after GELU" : "");
    require_supported("matmul_forward", residual && residual == out ? "matmul: out must not alias residual" : "");
    if (N == 0) return;
    Gemm g{CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, weight, C, inp, C, out, OC};
    g.bias = bias;
    g.aux = pre_gelu;
    g.epilogue = pre_gelu ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                          : (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    if (residual) {
        Gemm with_residual = g;
        with_residual.beta = 1.0f, with_residual.c = residual;
        if (mm.residual_in_epilogue &&
            try_run(mm, with_residual, bias, kFloatXType, stream, record_name("matmul_forward", C, OC, {bias ? "bias" : "", "residual"})))
            return;
    }
    run(mm, g, stream, record_name("matmul_forward", C, OC, {bias ? "bias" : "", pre_gelu ? "gelu" : ""}));
    if (residual) accumulate(out, residual, size_t(N) * OC, stream);  // out += residual: the epilogue's add refused or off
}

inline size_t matmul_backward_scratch_floats(int N, int OC) {
    return size_t(matmul_detail::bias_grad_chunks(std::max(N, 0))) * size_t(std::max(OC, 0));
}

// dinp = dout @ weight (overwritten; times gelu'(pre_gelu_of_inp) when given, which must not alias
// dinp); dweight += dout^T @ inp; dbias += column sums of dout (deterministic, via scratch).
inline void matmul_backward(const Matmul& mm, floatX* dinp, floatX* dweight, floatX* dbias, float* scratch,
                            const floatX* dout, const floatX* inp, const floatX* weight, int N, int C, int OC,
                            cudaStream_t stream, const floatX* pre_gelu_of_inp = nullptr) {
    using namespace matmul_detail;
    check_arguments(mm, "matmul_backward", N, C, OC,
                    {{"dinp", dinp}, {"dweight", dweight}, {"dout", dout}, {"inp", inp}, {"weight", weight},
                     {"pre_gelu_of_inp", pre_gelu_of_inp, false}, {"dbias", dbias, false},
                     {"scratch", scratch, dbias != nullptr}});
    if (N == 0) return;

    Gemm input_grad{CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight, C, dout, OC, dinp, C};
    input_grad.aux = const_cast<floatX*>(pre_gelu_of_inp);  // DGELU reads it (cuBLASLt takes void*)
    input_grad.epilogue = pre_gelu_of_inp ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;
    run(mm, input_grad, stream, record_name("matmul_backward_dinp", C, OC, {pre_gelu_of_inp ? "dgelu" : ""}));

    Gemm weight_grad{CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, OC, dweight, C};
    weight_grad.beta = 1.0f;
    const std::string weight_grad_name = record_name("matmul_backward_dweight", C, OC, {});
    if (!dbias) {
        run(mm, weight_grad, stream, weight_grad_name);
        return;
    }
    // Fused: BGRADB sums op(B) = dout (N x OC) over k = N into one value per column of D, i.e. per
    // output feature ("bias size = columns of D; the reduction happens over the GEMM's k dimension"),
    // while the GEMM reads dout anyway: FP32 sums, or (bias_grad_in_output_type) sums in D's type
    // where those are refused. It overwrites its output, so it goes to scratch and the finishing
    // kernel adds it into dbias (+=, one rounding), as after the partials.
    if (mm.fuse_bias_grad) {
        Gemm fused = weight_grad;
        fused.epilogue = CUBLASLT_EPILOGUE_BGRADB;
        if (try_run(mm, fused, scratch, CUDA_R_32F, stream, record_name("matmul_backward_dweight", C, OC, {"dbias"})))
            return finish_bias_grad(dbias, (const float*)scratch, 1, OC, stream);
        if (kFloatXType != CUDA_R_32F && mm.bias_grad_in_output_type &&
            try_run(mm, fused, scratch, kFloatXType, stream, record_name("matmul_backward_dweight", C, OC, {"dbias bf16"})))
            return finish_bias_grad(dbias, (const floatX*)scratch, 1, OC, stream);
    }
    run(mm, weight_grad, stream, weight_grad_name);
    sum_bias_grad(dbias, scratch, dout, N, OC, stream);
}

// Scratch of bias_grad_add_partials(..., chunks, OC, ...): the partial rows' own partial rows.
inline size_t bias_grad_add_partials_scratch_floats(int chunks, int OC) { return matmul_backward_scratch_floats(chunks, OC); }

// dbias += the column sums of `chunks` rows of OC floats that another kernel summed while it wrote the
// rows it sums (the tensor-core attention backward's qkv sums, kernels/attention_tc.cuh: a row per block
// of 64 rows, 1,024 of them at d12, B=64), through the column-sum and finishing kernels (a finishing
// kernel alone would read them with ceil(OC / 1024) blocks: 3 for 2304 columns). Deterministic: rows in
// order, as for matmul_backward's partials.
inline void bias_grad_add_partials(floatX* dbias, const float* partials, int chunks, int OC, float* scratch,
                                   cudaStream_t stream) {
    require_supported("bias_grad_add_partials", dbias == nullptr || partials == nullptr || scratch == nullptr
                                                    ? "matmul: dbias, partials or scratch is NULL"
                                                : chunks <= 0 ? "matmul: chunks = " + std::to_string(chunks) + " is not positive"
                                                              : matmul_requirements(8, OC));
    matmul_detail::sum_bias_grad(dbias, scratch, partials, chunks, OC, stream);
}
