// The cuBLASLt subset the project uses, defined for the CPU against the real cublasLt.h.
//
// FP32 operands go to column-major BLAS (OpenBLAS's cblas_sgemm) with cuBLASLt's m, n, k,
// transposes and leading dimensions unchanged: cuBLAS keeps the BLAS conventions by design, so
// the stand-in adds no reading of its own there. BF16 operands go to oneDNN's matmul (BF16 x BF16
// products summed in FP32, as tensor cores do, with no widening pass: AVX512-BF16 where the CPU
// has it, oneDNN's own choice at run time), whose descriptors state the same column-major strides;
// where oneDNN has no BF16 matmul for the CPU (AVX2 alone), they are widened to FP32 for sgemm.
// What is ours: descriptor bookkeeping, argument checks, rounding outputs to BF16 (nearest-even),
// and the epilogues, each written from the cuBLASLt documentation (cublasLtEpilogue_t and
// cublasLtMatmulDescAttributes_t, quoted in cublasLt.h) with the rule cited where it is used.
#include "cuda_emu.h"
#include "emu_internal.h"

#include <cblas.h>  // only for the type of cblas_sgemm: OpenBLAS is loaded with dlopen
#include <cublasLt.h>
#include <dlfcn.h>
#include <immintrin.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <strings.h>
#include <unistd.h>  // execv

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

struct cublasLtContext {
    int unused;
};

namespace {

// ---- messages: one line on stderr naming the function and the argument ----

const char* status_name(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

// Why a call failed, on stderr when CUBLASLT_LOG_LEVEL is 1 (errors) or more, as cuBLASLt's own
// logging does; silent by default like the library, since callers probe on purpose (kernels/matmul.cuh
// asks the heuristic for BGRADB and falls back when it is refused) and report what they do not expect.
bool log_errors() {
    static const bool on = [] {
        const char* level = std::getenv("CUBLASLT_LOG_LEVEL");
        return level != nullptr && std::atoi(level) >= 1;
    }();
    return on;
}

[[gnu::format(printf, 2, 3)]] cublasStatus_t fail(cublasStatus_t status, const char* format, ...) {
    if (!log_errors()) return status;
    char message[512];
    va_list args;
    va_start(args, format);
    std::vsnprintf(message, sizeof message, format, args);
    va_end(args);
    std::fprintf(stderr, "%s (%s)\n", message, status_name(status));
    return status;
}

}  // namespace

// ---- the CPU's threads for bulk work ----

namespace cuemu {

// Ranks started by mpirun on one machine share its cores: each takes its share for the GEMM and
// epilogue threads (OpenBLAS, OpenMP), so that waiting threads do not steal time from other ranks.
int cpu_threads_per_rank() {
    static const int threads = [] {
        const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        const int ranks = local ? std::max(1, std::atoi(local)) : 1;
        return std::max(1, omp_get_num_procs() / ranks);
    }();
    return threads;
}

void run_on_cpu_threads(size_t n, size_t granule, int threads, const std::function<void(size_t, size_t)>& slice) {
    if (threads <= 1 || n < 2 * granule) {
        if (n > 0) slice(0, n);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        const size_t t = size_t(omp_get_thread_num()), count = size_t(omp_get_num_threads());
        const size_t first = t == 0 ? 0 : n * t / count / granule * granule;
        const size_t last = t + 1 == count ? n : n * (t + 1) / count / granule * granule;
        if (first < last) slice(first, last);
    }
}

}  // namespace cuemu

namespace {

using cuemu::cpu_threads_per_rank;
using cuemu::run_on_cpu_threads;

// ---- OpenBLAS, loaded on first use ----

// The GEMMs' and epilogues' threads must not spin while the emulator's own threads run kernels.
// libgomp's threads (oneDNN's BF16 matmul and the epilogue run on them) spin after each parallel
// region before they sleep (GOMP_SPINCOUNT: 300,000 iterations when OMP_WAIT_POLICY is unset, some
// milliseconds), and the emulator starts the next kernels right then, on the same cores: measured
// on 2 cores under load, a d12 B4 T64 BF16 step took 7.1 s with them spinning and 4.2 s passive.
// libgomp reads OMP_WAIT_POLICY once, as it loads, before any constructor of this library runs, so a
// program whose environment does not set it executes itself again, once, with it set to passive
// (same process, same arguments). Setting OMP_WAIT_POLICY to anything (active, say) keeps the
// process as started: under valgrind, for one, which would not follow the exec.
__attribute__((constructor)) void passive_openmp_threads(int, char** argv, char**) {
    if (std::getenv("OMP_WAIT_POLICY") != nullptr || argv == nullptr) return;
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);  // returns only on failure: then run on as started
}

using SgemmFn = decltype(&cblas_sgemm);
constexpr const char* kOpenBlasLibrary = "libopenblas.so.0";  // Debian 12: libopenblas0-pthread

// Debian's OpenBLAS (DYNAMIC_ARCH) picks a slow generic kernel on these CPUs unless told the core
// type, and reads OPENBLAS_CORETYPE only when it loads; hence dlopen rather than linking. Where the
// CPU has AVX-512 the SkylakeX kernels are used even when the environment names a weaker set
// (Haswell: ~220 against ~410 GFLOP/s on 2 cores here), with a note; CUEMU_KEEP_OPENBLAS_CORETYPE=1
// keeps the environment's choice.
void choose_openblas_core_type() {
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("avx512vl"))
        return;
    const char* keep = std::getenv("CUEMU_KEEP_OPENBLAS_CORETYPE");
    const char* named = std::getenv("OPENBLAS_CORETYPE");
    if (named == nullptr) {
        setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
    } else if ((keep == nullptr || std::strcmp(keep, "1") != 0) &&
               (strcasecmp(named, "Haswell") == 0 || strcasecmp(named, "Zen") == 0 ||
                strcasecmp(named, "Sandybridge") == 0 || strcasecmp(named, "Prescott") == 0 ||
                strcasecmp(named, "Nehalem") == 0 || strcasecmp(named, "Core2") == 0)) {
        std::fprintf(stderr, "emulated cuBLASLt: OPENBLAS_CORETYPE=%s names a weaker kernel set than this CPU runs; "
                             "using SkylakeX (CUEMU_KEEP_OPENBLAS_CORETYPE=1 keeps %s)\n", named, named);
        setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
    }
}

// OpenBLAS's own (pthread) workers spin after each call for 2^OPENBLAS_THREAD_TIMEOUT cycles before
// they sleep: 2^28 by default, about 0.1 s, on the cores where the emulator runs the next kernels
// (the FP32 build's step: ~1.0 s with them spinning, ~0.85 s with 4, the least it takes). Read as
// the library loads, so set before dlopen; a value in the environment is kept.
void quick_sleeping_openblas_threads() {
    if (std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr) setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1);
}

SgemmFn load_sgemm(const char* caller) {
    static SgemmFn sgemm = nullptr;
    static std::once_flag once;
    std::call_once(once, [] {
        choose_openblas_core_type();
        quick_sleeping_openblas_threads();
        void* library = dlopen(kOpenBlasLibrary, RTLD_NOW | RTLD_LOCAL);
        if (library != nullptr) sgemm = reinterpret_cast<SgemmFn>(dlsym(library, "cblas_sgemm"));
        if (library != nullptr)
            if (auto set_threads = reinterpret_cast<void (*)(int)>(dlsym(library, "openblas_set_num_threads")))
                set_threads(cpu_threads_per_rank());
        if (sgemm == nullptr)
            std::fprintf(stderr, "emulated cuBLASLt: cannot load cblas_sgemm from %s (%s); `make deps` installs libopenblas-dev\n",
                         kOpenBlasLibrary, dlerror());
    });
    if (sgemm == nullptr) fail(CUBLAS_STATUS_NOT_INITIALIZED, "%s: OpenBLAS is not available", caller);
    return sgemm;
}

// ---- descriptors: our structs live inside the header's semi-opaque storage ----

struct Layout {
    uint32_t type;
    int32_t order = CUBLASLT_ORDER_COL;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch_count = 1;
    int64_t batch_stride = 0;  // elements
};
struct MatmulDesc {
    int32_t compute_type, scale_type;
    int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
    uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    void* bias = nullptr;
    int32_t bias_type = -1;  // -1: the documented default (see resolve_epilogue)
    int64_t bias_batch_stride = 0;
    void* aux = nullptr;
    int64_t aux_ld = 0, aux_batch_stride = 0;
    int32_t aux_type = -1;
};
struct Preference {
    uint64_t max_workspace_bytes = 0;
    // The alignments the caller promises for A, B, C and D. The one algorithm here works at any
    // alignment, so they are kept (for GetAttribute) but do not restrict it.
    uint32_t min_alignment_a = 256, min_alignment_b = 256, min_alignment_c = 256, min_alignment_d = 256;
    // Split-K reduction schemes allowed (default all, CUBLASLT_REDUCTION_SCHEME_MASK). The one
    // algorithm here never splits k, so any mask leaves it available.
    uint32_t reduction_scheme_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
};
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(MatmulDesc) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(Preference) <= sizeof(cublasLtMatmulPreferenceOpaque_t));

template <typename Impl, typename Opaque> Impl* impl(Opaque* p) { return std::launder(reinterpret_cast<Impl*>(p)); }

template <typename Opaque, typename Impl, typename Handle>
cublasStatus_t create(const char* caller, Handle* out, const Impl& initial) {
    if (out == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: the output pointer is NULL", caller);
    Opaque* storage = new (std::nothrow) Opaque{};
    if (storage == nullptr) return fail(CUBLAS_STATUS_ALLOC_FAILED, "%s: out of memory", caller);
    new (storage) Impl(initial);
    *out = storage;
    return CUBLAS_STATUS_SUCCESS;
}

// One settable attribute: where it lives and its documented size (cublasLt.h gives each type).
struct Field {
    const char* name = nullptr;
    void* data = nullptr;
    size_t size = 0;
};
#define FIELD(attribute, member) \
    case attribute: return {#attribute, &(object).member, sizeof((object).member)}

Field layout_field(Layout& object, cublasLtMatrixLayoutAttribute_t attribute) {
    switch (attribute) {
        FIELD(CUBLASLT_MATRIX_LAYOUT_TYPE, type);
        FIELD(CUBLASLT_MATRIX_LAYOUT_ORDER, order);
        FIELD(CUBLASLT_MATRIX_LAYOUT_ROWS, rows);
        FIELD(CUBLASLT_MATRIX_LAYOUT_COLS, cols);
        FIELD(CUBLASLT_MATRIX_LAYOUT_LD, ld);
        FIELD(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, batch_count);
        FIELD(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, batch_stride);
        default: return {};
    }
}

Field matmul_field(MatmulDesc& object, cublasLtMatmulDescAttributes_t attribute) {
    switch (attribute) {
        FIELD(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, compute_type);
        FIELD(CUBLASLT_MATMUL_DESC_SCALE_TYPE, scale_type);
        FIELD(CUBLASLT_MATMUL_DESC_POINTER_MODE, pointer_mode);
        FIELD(CUBLASLT_MATMUL_DESC_TRANSA, transa);
        FIELD(CUBLASLT_MATMUL_DESC_TRANSB, transb);
        FIELD(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
        FIELD(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
        FIELD(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
        FIELD(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, bias_batch_stride);
        FIELD(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
        FIELD(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld);
        FIELD(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, aux_batch_stride);
        FIELD(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, aux_type);
        default: return {};
    }
}

Field preference_field(Preference& object, cublasLtMatmulPreferenceAttributes_t attribute) {
    switch (attribute) {
        FIELD(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_workspace_bytes);
        FIELD(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, min_alignment_a);
        FIELD(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, min_alignment_b);
        FIELD(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, min_alignment_c);
        FIELD(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, min_alignment_d);
        FIELD(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reduction_scheme_mask);
        default: return {};
    }
}
#undef FIELD

// Set/GetAttribute rules from cublasLt.h: INVALID_VALUE when buf is NULL or sizeInBytes does not
// match the attribute's storage; Get with sizeInBytes == 0 reports the size needed.
cublasStatus_t set_attribute(const char* caller, const void* object, Field field, int attribute, const void* buf,
                             size_t size) {
    if (object == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: the descriptor is NULL", caller);
    if (field.data == nullptr)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: attribute %d is not supported by the emulated cuBLASLt", caller,
                    attribute);
    if (buf == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s: buf is NULL", caller, field.name);
    if (size != field.size)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s takes %zu bytes, sizeInBytes is %zu", caller, field.name,
                    field.size, size);
    std::memcpy(field.data, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t get_attribute(const char* caller, const void* object, Field field, int attribute, void* buf,
                             size_t size, size_t* size_written) {
    if (object == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: the descriptor is NULL", caller);
    if (field.data == nullptr)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: attribute %d is not supported by the emulated cuBLASLt", caller,
                    attribute);
    if (size == 0) {
        if (size_written == nullptr)
            return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s: sizeInBytes is 0 and sizeWritten is NULL", caller,
                        field.name);
        *size_written = field.size;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (buf == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s: buf is NULL", caller, field.name);
    if (size != field.size)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s takes %zu bytes, sizeInBytes is %zu", caller, field.name,
                    field.size, size);
    std::memcpy(buf, field.data, size);
    if (size_written) *size_written = size;
    return CUBLAS_STATUS_SUCCESS;
}

// ---- the problem, checked once for both the heuristic and the matmul ----

bool is_supported_type(int64_t type) { return type == CUDA_R_32F || type == CUDA_R_16BF; }
const char* type_name(int64_t type) {
    return type == CUDA_R_32F ? "CUDA_R_32F" : type == CUDA_R_16BF ? "CUDA_R_16BF" : "unsupported";
}

// What each supported cublasLtEpilogue_t value asks for.
struct Epilogue {
    bool add_bias = false;     // BIAS: bias[row] added before the activation
    bool gelu = false;         // GELU: x := GELU(x)
    bool store_aux = false;    // *_AUX: the GELU input written to the aux matrix
    bool dgelu = false;        // DGELU: x := x * GELU'(aux)
    bool bgrad_d = false;      // DGELU_BGRAD: bias gradient from the DGELU output
    bool bgrad_a = false;      // BGRADA
    bool bgrad_b = false;      // BGRADB
    bool needs_bias() const { return add_bias || bgrad_d || bgrad_a || bgrad_b; }
    bool needs_aux() const { return store_aux || dgelu; }
};

bool decode_epilogue(uint32_t value, Epilogue* e) {
    switch (value) {
        case CUBLASLT_EPILOGUE_DEFAULT: break;
        case CUBLASLT_EPILOGUE_BIAS: e->add_bias = true; break;
        case CUBLASLT_EPILOGUE_GELU: e->gelu = true; break;
        case CUBLASLT_EPILOGUE_GELU_AUX: e->gelu = e->store_aux = true; break;
        case CUBLASLT_EPILOGUE_GELU_BIAS: e->gelu = e->add_bias = true; break;
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: e->gelu = e->store_aux = e->add_bias = true; break;
        case CUBLASLT_EPILOGUE_DGELU: e->dgelu = true; break;
        case CUBLASLT_EPILOGUE_DGELU_BGRAD: e->dgelu = e->bgrad_d = true; break;
        case CUBLASLT_EPILOGUE_BGRADA: e->bgrad_a = true; break;
        case CUBLASLT_EPILOGUE_BGRADB: e->bgrad_b = true; break;
        default: return false;
    }
    return true;
}

struct Problem {
    int m, n, k, batches;
    CBLAS_TRANSPOSE transa, transb;
    const Layout *a, *b, *c, *d;
    Epilogue epilogue;
    int64_t bias_type, aux_type;
};

cublasStatus_t check_layout(const char* caller, const char* name, const Layout* l) {
    if (l == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s is NULL", caller, name);
    if (l->order != CUBLASLT_ORDER_COL)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: %s: order %d is not supported by the emulated cuBLASLt (only CUBLASLT_ORDER_COL)",
                    caller, name, l->order);
    if (!is_supported_type(l->type))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: %s: data type %u is not supported by the emulated cuBLASLt (CUDA_R_32F, CUDA_R_16BF)",
                    caller, name, l->type);
    if (l->rows > INT_MAX || l->cols > INT_MAX || l->ld > INT_MAX)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: %s: rows, cols and ld must fit in int32", caller, name);
    // LD doc: "must be large enough so that matrix memory locations are not overlapping (e.g.
    // greater or equal to CUBLASLT_MATRIX_LAYOUT_ROWS in case of CUBLASLT_ORDER_COL)".
    if (l->ld < int64_t(l->rows) || l->ld < 0)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s: ld %lld is less than rows %llu", caller, name,
                    (long long)l->ld, (unsigned long long)l->rows);
    if (l->batch_count < 1)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s: batch count %d is less than 1", caller, name, l->batch_count);
    return CUBLAS_STATUS_SUCCESS;
}

CBLAS_TRANSPOSE to_cblas(int32_t op) { return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }

cublasStatus_t check_problem(const char* caller, const MatmulDesc* desc, const Layout* a, const Layout* b,
                             const Layout* c, const Layout* d, Problem* p) {
    if (desc == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: computeDesc is NULL", caller);
    const struct {
        const char* name;
        const Layout* layout;
    } layouts[] = {{"Adesc", a}, {"Bdesc", b}, {"Cdesc", c}, {"Ddesc", d}};
    for (const auto& l : layouts)
        if (cublasStatus_t s = check_layout(caller, l.name, l.layout); s != CUBLAS_STATUS_SUCCESS) return s;

    if (desc->compute_type != CUBLAS_COMPUTE_32F)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: compute type %d is not supported by the emulated cuBLASLt (only CUBLAS_COMPUTE_32F)",
                    caller, desc->compute_type);
    if (desc->scale_type != CUDA_R_32F)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: scale type %d is not supported by the emulated cuBLASLt (only CUDA_R_32F)",
                    caller, desc->scale_type);
    if (desc->pointer_mode != CUBLASLT_POINTER_MODE_HOST)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: pointer mode %d is not supported by the emulated cuBLASLt (only CUBLASLT_POINTER_MODE_HOST)",
                    caller, desc->pointer_mode);
    // cublasOperation_t: for real data the conjugate transpose (CUBLAS_OP_C) is the transpose.
    for (int32_t op : {desc->transa, desc->transb})
        if (op != CUBLAS_OP_N && op != CUBLAS_OP_T && op != CUBLAS_OP_C)
            return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s %d is not CUBLAS_OP_N, CUBLAS_OP_T or CUBLAS_OP_C", caller,
                        op == desc->transa ? "TRANSA" : "TRANSB", op);

    // Type combinations of the cublasLtMatmul() type table for CUBLAS_COMPUTE_32F / CUDA_R_32F
    // scale: A and B share a type, C and D share a type, BF16 inputs may produce BF16 or FP32.
    if (a->type != b->type || c->type != d->type || (a->type == CUDA_R_32F && d->type != CUDA_R_32F))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: types A %s, B %s, C %s, D %s are not a supported combination", caller,
                    type_name(a->type), type_name(b->type), type_name(c->type), type_name(d->type));

    // D is m x n; op(A) is m x k; op(B) is k x n; C has D's shape (cublasLtMatmul()).
    const bool ta = desc->transa != CUBLAS_OP_N, tb = desc->transb != CUBLAS_OP_N;
    const uint64_t m = d->rows, n = d->cols, k = ta ? a->rows : a->cols;
    const uint64_t a_m = ta ? a->cols : a->rows, b_k = tb ? b->cols : b->rows, b_n = tb ? b->rows : b->cols;
    if (a_m != m || b_k != k || b_n != n || c->rows != m || c->cols != n)
        return fail(CUBLAS_STATUS_INVALID_VALUE,
                    "%s: shapes do not agree: op(A) %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu", caller,
                    (unsigned long long)a_m, (unsigned long long)k, (unsigned long long)b_k, (unsigned long long)b_n,
                    (unsigned long long)c->rows, (unsigned long long)c->cols, (unsigned long long)m, (unsigned long long)n);
    if (a->batch_count != d->batch_count || b->batch_count != d->batch_count || c->batch_count != d->batch_count)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: batch counts differ: A %d, B %d, C %d, D %d", caller,
                    a->batch_count, b->batch_count, c->batch_count, d->batch_count);

    Epilogue e;
    if (!decode_epilogue(desc->epilogue, &e))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: epilogue %u is not supported by the emulated cuBLASLt", caller,
                    desc->epilogue);
    // BIAS_DATA_TYPE doc: bias (and bias gradient) elements default to the output's type;
    // EPILOGUE_AUX_DATA_TYPE doc: the GELU input matrix defaults to the output's type.
    const int64_t bias_type = desc->bias_type == -1 ? d->type : desc->bias_type;
    const int64_t aux_type = desc->aux_type == -1 ? d->type : desc->aux_type;
    if (e.needs_bias() && !is_supported_type(bias_type))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: bias data type %lld is not supported (CUDA_R_32F, CUDA_R_16BF)",
                    caller, (long long)bias_type);
    // Not in the documentation, measured on an H100 with cuBLAS 13 (2026-11-27): an FP32 bias or bias
    // gradient with a BF16 D is refused with INVALID_VALUE, by the heuristic (BGRADB) and by the
    // matmul (GELU_AUX_BIAS). A BF16 D takes a BF16 bias only.
    if (e.needs_bias() && d->type == CUDA_R_16BF && bias_type != CUDA_R_16BF)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: a BF16 D takes a BF16 bias (BIAS_DATA_TYPE %lld), as cuBLAS 13 on an H100 does",
                    caller, (long long)bias_type);
    if (e.needs_aux()) {
        if (!is_supported_type(aux_type))
            return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: aux data type %lld is not supported (CUDA_R_32F, CUDA_R_16BF)",
                        caller, (long long)aux_type);
        // EPILOGUE_AUX_LD doc (GELU input matrix): "Must be divisible by 8 and be no less than the
        // number of rows in the output matrix"; EPILOGUE_AUX_BATCH_STRIDE: "Must be divisible by 8".
        if (desc->aux_ld < int64_t(m) || desc->aux_ld % 8 != 0 || desc->aux_ld > INT_MAX)
            return fail(CUBLAS_STATUS_INVALID_VALUE,
                        "%s: EPILOGUE_AUX_LD %lld must be a multiple of 8 and at least the rows of D (%llu)", caller,
                        (long long)desc->aux_ld, (unsigned long long)m);
        if (desc->aux_batch_stride % 8 != 0)
            return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: EPILOGUE_AUX_BATCH_STRIDE %lld must be a multiple of 8", caller,
                        (long long)desc->aux_batch_stride);
    }
    *p = {int(m), int(n), int(k), d->batch_count, to_cblas(desc->transa), to_cblas(desc->transb), a, b, c, d, e,
          bias_type, aux_type};
    return CUBLAS_STATUS_SUCCESS;
}

// ---- element access: rows of FP32 or BF16 as FP32, in loops the compiler vectorizes ----

float load(const void* base, int64_t type, size_t i) {
    return type == CUDA_R_32F ? static_cast<const float*>(base)[i]
                              : __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}
size_t element_size(int64_t type) { return type == CUDA_R_32F ? 4 : 2; }
const void* offset(const void* base, int64_t type, int64_t elements) {
    return static_cast<const char*>(base) + elements * int64_t(element_size(type));
}
void* offset(void* base, int64_t type, int64_t elements) {
    return static_cast<char*>(base) + elements * int64_t(element_size(type));
}

// n elements as FP32. BF16 -> FP32 is exact: the 16 bits are the top half of the float.
void widen(const void* src, int64_t type, float* dst, size_t n) {
    if (type == CUDA_R_32F) {
        std::memcpy(dst, src, n * sizeof(float));
        return;
    }
    const uint16_t* bits = static_cast<const uint16_t*>(src);
    for (size_t i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(uint32_t(bits[i]) << 16);
}

// n FP32 values stored as `type`: BF16 rounds to nearest even, and a NaN becomes the canonical
// 0x7FFF (cuda_bf16.hpp's host __float2bfloat16), branch-free so that it vectorizes.
void narrow(const float* src, void* dst, int64_t type, size_t n) {
    if (type == CUDA_R_32F) {
        std::memmove(dst, src, n * sizeof(float));
        return;
    }
    uint16_t* bits = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) {
        const uint32_t u = std::bit_cast<uint32_t>(src[i]);
        const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
        bits[i] = (u & 0x7FFFFFFFu) > 0x7F800000u ? uint16_t(0x7FFF) : uint16_t(rounded);
    }
}

// ---- tanh and GELU over rows ----
// tanh through glibc's libmvec SIMD tanhf (at most 4 ulp), chosen at run time by what the CPU has.
// Every element goes through the same function, the last partial vector padded, so an element's
// result does not depend on where a thread's range of rows begins.

extern "C" __attribute__((target("avx512f"))) __m512 _ZGVeN16v_tanhf(__m512);
extern "C" __attribute__((target("avx2"))) __m256 _ZGVdN8v_tanhf(__m256);

[[gnu::target("avx512f")]] void tanh_avx512(float* x, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _ZGVeN16v_tanhf(_mm512_loadu_ps(x + i)));
    if (i == n) return;
    const __mmask16 tail = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, tail, _ZGVeN16v_tanhf(_mm512_maskz_loadu_ps(tail, x + i)));
}
[[gnu::target("avx2")]] void tanh_avx2(float* x, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _ZGVdN8v_tanhf(_mm256_loadu_ps(x + i)));
    if (i == n) return;
    float padded[8] = {};
    std::memcpy(padded, x + i, (n - i) * sizeof(float));
    _mm256_storeu_ps(padded, _ZGVdN8v_tanhf(_mm256_loadu_ps(padded)));
    std::memcpy(x + i, padded, (n - i) * sizeof(float));
}
void tanh_scalar(float* x, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] = std::tanh(x[i]);
}
void tanh_in_place(float* x, size_t n) {
    static const auto implementation = __builtin_cpu_supports("avx512f") ? tanh_avx512
                                       : __builtin_cpu_supports("avx2") ? tanh_avx2
                                                                        : tanh_scalar;
    implementation(x, n);
}

// GELU in its tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the one GPT-2 uses.
// The cuBLASLt docs say only "x:=GELU(x)"; the erf form differs by at most 4.7e-4.
constexpr float kSqrt2OverPi = 0.7978845608f, kGeluCubic = 0.044715f;
void gelu_in_place(float* x, float* scratch, size_t n) {
    for (size_t i = 0; i < n; ++i) scratch[i] = kSqrt2OverPi * (x[i] + kGeluCubic * x[i] * x[i] * x[i]);
    tanh_in_place(scratch, n);
    for (size_t i = 0; i < n; ++i) x[i] = 0.5f * x[i] * (1.0f + scratch[i]);
}
// x[i] *= GELU'(u[i]), the derivative of the form above; u is overwritten.
void multiply_by_gelu_derivative(float* x, float* u, float* scratch, size_t n) {
    for (size_t i = 0; i < n; ++i) scratch[i] = kSqrt2OverPi * (u[i] + kGeluCubic * u[i] * u[i] * u[i]);
    tanh_in_place(scratch, n);
    for (size_t i = 0; i < n; ++i) {
        const float t = scratch[i];
        x[i] *= 0.5f * (1.0f + t) + 0.5f * u[i] * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * u[i] * u[i]);
    }
}

// ---- the BF16 GEMM: oneDNN's matmul ----

dnnl::engine& dnnl_engine() {
    static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    return engine;
}

// out (m x n FP32, column-major, leading dimension out_ld) = alpha op(A) op(B) for BF16 A and B.
// A column-major m x n matrix with leading dimension ld is the row-major n x m matrix with row
// stride ld, and oneDNN's fast kernels want a row-major destination, so oneDNN computes the
// transpose, D^T = op(B)^T op(A)^T: its src is op(B)^T (n x k), its weights op(A)^T (k x m), each
// described by the strides of the cuBLASLt layout. Element (l, j) of op(B) lies at l + j ldb when B
// is not transposed and at j + l ldb when it is; element (i, l) of op(A) at i + l lda or l + i lda.
// Where oneDNN has no BF16 matmul for this CPU (seen on an AMD EPYC with AVX2 alone: "could not create
// a primitive descriptor iterator"): the operands widened to FP32 (exact) and OpenBLAS's sgemm, so the
// same exact products summed in FP32 in another order. Slower, and a sum's last bits may differ from a
// machine where oneDNN runs; runs on one machine stay repeatable. Each operand is widened as stored
// (its columns of `rows` elements, ld apart) into a compact copy. The copies are the calling thread's,
// kept between calls: fresh ones (13 MB for GPT-2's wte) paid their page faults on every call, a fifth
// of a small model's step on that EPYC.
cublasStatus_t gemm_bf16_widened(const Problem& p, float alpha, const void* a, const void* b, float* out, size_t out_ld) {
    const SgemmFn sgemm = load_sgemm("cublasLtMatmul");
    if (sgemm == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    auto widen_columns = [](std::vector<float>& wide, const void* stored, size_t rows, size_t cols, int64_t ld) {
        if (wide.size() < rows * cols) wide.resize(rows * cols);
        for (size_t j = 0; j < cols; ++j) widen(offset(stored, CUDA_R_16BF, int64_t(j) * ld), CUDA_R_16BF, wide.data() + j * rows, rows);
    };
    const size_t a_rows = p.transa == CblasNoTrans ? size_t(p.m) : size_t(p.k), a_cols = size_t(p.m) * size_t(p.k) / a_rows;
    const size_t b_rows = p.transb == CblasNoTrans ? size_t(p.k) : size_t(p.n), b_cols = size_t(p.k) * size_t(p.n) / b_rows;
    thread_local std::vector<float> a_wide, b_wide;
    widen_columns(a_wide, a, a_rows, a_cols, p.a->ld);
    widen_columns(b_wide, b, b_rows, b_cols, p.b->ld);
    sgemm(CblasColMajor, p.transa, p.transb, p.m, p.n, p.k, alpha, a_wide.data(), int(a_rows), b_wide.data(), int(b_rows), 0.0f,
          out, int(out_ld));
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t gemm_bf16(const Problem& p, float alpha, const void* a, const void* b, float* out, size_t out_ld) {
    using dims = dnnl::memory::dims;
    using dt = dnnl::memory::data_type;
    const dnnl::memory::dim m = p.m, n = p.n, k = p.k, lda = p.a->ld, ldb = p.b->ld, ldd = dnnl::memory::dim(out_ld);
    try {
        const dnnl::memory::desc src({n, k}, dt::bf16, p.transb == CblasNoTrans ? dims{ldb, 1} : dims{1, ldb});
        const dnnl::memory::desc weights({k, m}, dt::bf16, p.transa == CblasNoTrans ? dims{lda, 1} : dims{1, lda});
        const dnnl::memory::desc dst({n, m}, dt::f32, dims{ldd, 1});
        dnnl::primitive_attr attr;
        if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
        dnnl::engine& engine = dnnl_engine();
        std::optional<dnnl::matmul::primitive_desc> described;
        try {
            described.emplace(dnnl::matmul::desc(src, weights, dst), attr, engine);
        } catch (const dnnl::error&) {
            return gemm_bf16_widened(p, alpha, a, b, out, out_ld);  // no BF16 matmul for this CPU
        }
        const dnnl::matmul matmul(*described);
        dnnl::stream stream(engine);
        dnnl::memory src_memory(src, engine, const_cast<void*>(b)), weights_memory(weights, engine, const_cast<void*>(a)),
            dst_memory(dst, engine, out);
        omp_set_num_threads(cpu_threads_per_rank());  // oneDNN runs on the calling thread's OpenMP team
        matmul.execute(stream, {{DNNL_ARG_SRC, src_memory}, {DNNL_ARG_WEIGHTS, weights_memory}, {DNNL_ARG_DST, dst_memory}});
        stream.wait();
    } catch (const dnnl::error& error) {
        return fail(CUBLAS_STATUS_EXECUTION_FAILED, "cublasLtMatmul: oneDNN's BF16 matmul (m %d, n %d, k %d) failed: %s",
                    p.m, p.n, p.k, error.what());
    }
    return CUBLAS_STATUS_SUCCESS;
}

// ---- the epilogue, over a range of D's rows ----

struct EpilogueJob {
    const Epilogue* e;
    const Problem* p;
    const MatmulDesc* desc;
    const float* product;  // the FP32 result of the GEMM (D itself when D is FP32 and taken directly)
    size_t product_ld;
    const void* c;  // added as beta C here when the GEMM did not add it
    float beta;
    const void* bias;
    void* aux;
    void* d;
    float* bias_grad;  // DGELU_BGRAD: FP32 sums, one per row
    size_t product_first_row = 0;  // the row of D that the product's row 0 is (a panel's first)
};

// Rows [first, last) of every column. Threads that split the rows never touch one element, and each
// row's bias-gradient sum runs over the columns in order, so results do not depend on the split.
void epilogue_rows(const EpilogueJob& job, size_t first, size_t last) {
    const Epilogue& e = *job.e;
    const Problem& p = *job.p;
    const size_t rows = last - first;
    std::vector<float> x(rows), u(rows), scratch(rows), bias(e.add_bias ? rows : 0);
    if (e.add_bias) widen(offset(job.bias, p.bias_type, first), p.bias_type, bias.data(), rows);
    for (size_t j = 0; j < size_t(p.n); ++j) {
        std::memcpy(x.data(), job.product + j * job.product_ld + (first - job.product_first_row), rows * sizeof(float));
        if (job.c) {
            widen(offset(job.c, p.c->type, j * p.c->ld + first), p.c->type, u.data(), rows);
            for (size_t i = 0; i < rows; ++i) x[i] += job.beta * u[i];
        }
        // EPILOGUE_BIAS: "Bias vector length must match matrix D rows ... broadcasted to all
        // columns and added before applying final postprocessing".
        if (e.add_bias)
            for (size_t i = 0; i < rows; ++i) x[i] += bias[i];
        // GELU_AUX: "outputs GELU input as a separate matrix" (EPILOGUE_AUX_LD apart).
        if (e.store_aux) narrow(x.data(), offset(job.aux, p.aux_type, j * job.desc->aux_ld + first), p.aux_type, rows);
        if (e.gelu) gelu_in_place(x.data(), scratch.data(), rows);
        // DGELU: "Apply GELU gradient to matmul output"; aux holds the GELU input.
        if (e.dgelu) {
            widen(offset(job.aux, p.aux_type, j * job.desc->aux_ld + first), p.aux_type, u.data(), rows);
            multiply_by_gelu_derivative(x.data(), u.data(), scratch.data(), rows);
        }
        if (e.bgrad_d)
            for (size_t i = 0; i < rows; ++i) job.bias_grad[first + i] += x[i];
        narrow(x.data(), offset(job.d, p.d->type, j * p.d->ld + first), p.d->type, rows);
    }
}

// The epilogue over all rows, split over the CPU's threads (OpenMP) when D is large enough for it to
// pay; each thread's range starts at a multiple of 16 rows (whole vectors).
void epilogue(const EpilogueJob& job) {
    const size_t m = size_t(job.p->m), n = size_t(job.p->n);
    const int threads = m * n >= (size_t(1) << 16) ? std::min<int>(cpu_threads_per_rank(), int(m / 16)) : 1;
    run_on_cpu_threads(m, 16, threads, [&](size_t first, size_t last) { epilogue_rows(job, first, last); });
}

// BF16 products that need the epilogue (D in BF16, or C to add) come out of oneDNN in FP32. Whole, that
// FP32 product went to memory and came back for the epilogue: `make train`'s logits (512 x 50304) are
// 103 MB of it, and that GEMM took 57 ms where the same FLOPs into a small D take 17-23. In panels
// instead, each panel's GEMM runs on one thread (oneDNN inside an OpenMP region runs sequentially)
// into a buffer of about 1 MB, and the epilogue rounds it while it is in that core's cache; the
// threads take the panels in contiguous runs. A panel is D's rows over all its columns, or where n is
// too wide for 64 rows of it, D's columns over all its rows (not for DGELU_BGRAD, whose row sums run
// over the columns in one order). At least 64 rows or columns: oneDNN's kernels are slow on thinner
// panels. A panel's values do not depend on the thread count. Only products of 16 panels or more
// are split: with a few, one thread got more of them than the other (GPT-2 124M's QKV and MLP
// products, 3 panels each: the d12 step 1.54 -> 1.65-1.86 s), and oneDNN's own split of a whole
// GEMM over the threads is balanced.
struct Panels {
    bool of_rows;
    size_t size, count;  // rows (or columns) per panel, and panels
};
constexpr size_t kPanelFloats = size_t(1) << 18, kPanelMin = 64, kPanelsMin = 16;

// The split of an m x n product, or none (count 0) under kPanelsMin panels or where neither way fits.
Panels panels_of(size_t m, size_t n, bool row_sums) {
    const auto split = [](bool of_rows, size_t length, size_t across) {
        const size_t size = std::max(kPanelMin, kPanelFloats / across / 16 * 16);
        return size < length ? Panels{of_rows, size, (length + size - 1) / size} : Panels{of_rows, 0, 0};
    };
    if (m * n < kPanelsMin * kPanelFloats) return {true, 0, 0};
    if (kPanelMin * n <= kPanelFloats) return split(true, m, n);
    if (kPanelMin * m <= kPanelFloats && !row_sums) return split(false, n, m);
    return {true, 0, 0};
}

cublasStatus_t gemm_bf16_in_panels(const EpilogueJob& whole, const Panels& panels, float alpha, const void* a, const void* b) {
    const Problem& p = *whole.p;
    const size_t m = size_t(p.m), n = size_t(p.n);
    std::atomic<int> status{CUBLAS_STATUS_SUCCESS};
    const int threads = int(std::min<size_t>(size_t(cpu_threads_per_rank()), panels.count));
    run_on_cpu_threads(panels.count, 1, threads, [&](size_t first_panel, size_t last_panel) {
        // Every panel fits kPanelFloats: panels_of splits only where kPanelMin rows (columns) do.
        thread_local std::unique_ptr<float[]> buffer(new float[kPanelFloats]);
        for (size_t panel = first_panel; panel < last_panel && status == CUBLAS_STATUS_SUCCESS; ++panel) {
            const size_t first = panel * panels.size, last = std::min(panels.of_rows ? m : n, first + panels.size);
            Problem part = p;
            EpilogueJob job = whole;
            job.p = &part;
            job.product = buffer.get();
            cublasStatus_t s;
            if (panels.of_rows) {  // rows [first, last) of op(A), and of D
                part.m = int(last - first);
                const size_t a_offset = p.transa == CblasNoTrans ? first : first * size_t(p.a->ld);
                s = gemm_bf16(part, alpha, offset(a, p.a->type, int64_t(a_offset)), b, buffer.get(), last - first);
                job.product_ld = last - first;
                job.product_first_row = first;
            } else {  // columns [first, last) of op(B), and of C, D and aux
                part.n = int(last - first);
                const size_t b_offset = p.transb == CblasNoTrans ? first * size_t(p.b->ld) : first;
                s = gemm_bf16(part, alpha, a, offset(b, p.b->type, int64_t(b_offset)), buffer.get(), m);
                job.product_ld = m;
                if (job.c) job.c = offset(job.c, p.c->type, int64_t(first * size_t(p.c->ld)));
                if (job.aux) job.aux = offset(job.aux, p.aux_type, int64_t(first * size_t(job.desc->aux_ld)));
                job.d = offset(job.d, p.d->type, int64_t(first * size_t(p.d->ld)));
            }
            if (s != CUBLAS_STATUS_SUCCESS) {
                status = s;
                return;
            }
            if (panels.of_rows) epilogue_rows(job, first, last);
            else epilogue_rows(job, 0, m);
        }
    });
    return cublasStatus_t(status.load());
}

cublasStatus_t run_matmul(const MatmulDesc& desc, const Problem& p, float alpha, const void* A, const void* B,
                          float beta, const void* C, void* D) {
    const char* caller = "cublasLtMatmul";
    const bool bf16_inputs = p.a->type == CUDA_R_16BF;
    SgemmFn sgemm = bf16_inputs ? nullptr : load_sgemm(caller);
    if (!bf16_inputs && sgemm == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    const Epilogue& e = p.epilogue;
    const size_t m = size_t(p.m), n = size_t(p.n);
    std::vector<float> bias_grad;
    // The FP32 product of a GEMM not split into panels, kept between calls and never cleared: a
    // fresh zero-filled vector per call paid for in page faults and a memset (a third of the
    // classifier's weight-gradient GEMM, 154 MB of product, before that was split). Every element
    // is written by the GEMM (or the k == 0 fill) before the epilogue reads it.
    thread_local std::unique_ptr<float[]> product_buffer;
    thread_local size_t product_capacity = 0;

    for (int batch = 0; batch < p.batches; ++batch) {
        const void* a = offset(A, p.a->type, batch * p.a->batch_stride);
        const void* b = offset(B, p.b->type, batch * p.b->batch_stride);
        const void* c = beta != 0.0f ? offset(C, p.c->type, batch * p.c->batch_stride) : nullptr;
        void* d = offset(D, p.d->type, batch * p.d->batch_stride);
        void* bias = e.needs_bias() ? offset(desc.bias, p.bias_type, batch * desc.bias_batch_stride) : nullptr;
        void* aux = e.needs_aux() ? offset(desc.aux, p.aux_type, batch * desc.aux_batch_stride) : nullptr;

        // cublasLtMatmul(): D = epilogue(alpha op(A) op(B) + beta C). The GEMM computes the linear
        // part into D itself when D is FP32 (sgemm adds beta C there, C copied first unless C is D;
        // oneDNN only when there is no C), else into an FP32 temporary that the epilogue rounds into
        // D, adding beta C: panel by panel for BF16 inputs and a large product (panels_of). With beta
        // == 0, C is not read (BLAS convention). The epilogue reads each element before it writes it,
        // so C may be D.
        const bool direct = p.d->type == CUDA_R_32F && p.k > 0 && (!bf16_inputs || c == nullptr);
        const bool elementwise = !direct || e.add_bias || e.gelu || e.store_aux || e.dgelu || e.bgrad_d;
        if (e.bgrad_d) bias_grad.assign(m, 0.0f);
        const Panels panels = bf16_inputs && !direct && p.k > 0 ? panels_of(m, n, e.bgrad_d) : Panels{true, 0, 0};
        if (panels.count > 0) {
            const EpilogueJob job{&e, &p, &desc, nullptr, 0, c, beta, bias, aux, d, bias_grad.data()};
            if (cublasStatus_t s = gemm_bf16_in_panels(job, panels, alpha, a, b); s != CUBLAS_STATUS_SUCCESS) return s;
        } else {
            if (!direct && product_capacity < m * n) {
                product_buffer.reset(new float[m * n]);
                product_capacity = m * n;
            }
            float* out = direct ? static_cast<float*>(d) : product_buffer.get();
            const size_t out_ld = direct ? size_t(p.d->ld) : m;
            if (m > 0 && n > 0) {
                if (p.k == 0) {
                    for (size_t j = 0; j < n; ++j) std::fill_n(out + j * out_ld, m, 0.0f);
                } else if (bf16_inputs) {
                    if (cublasStatus_t s = gemm_bf16(p, alpha, a, b, out, out_ld); s != CUBLAS_STATUS_SUCCESS) return s;
                } else {
                    if (direct && c && c != d)
                        for (size_t j = 0; j < n; ++j)
                            std::memcpy(out + j * out_ld, static_cast<const float*>(c) + j * p.c->ld, m * sizeof(float));
                    sgemm(CblasColMajor, p.transa, p.transb, p.m, p.n, p.k, alpha, static_cast<const float*>(a), int(p.a->ld),
                          static_cast<const float*>(b), int(p.b->ld), direct && c ? beta : 0.0f, out, int(out_ld));
                }
            }
            if (elementwise && m > 0 && n > 0)
                epilogue({&e, &p, &desc, out, out_ld, direct ? nullptr : c, beta, bias, aux, d, bias_grad.data()});
        }
        // DGELU_BGRAD: the bias gradient of the GELU gradient, one value per row of D (the length
        // of the bias it is the gradient of: BIAS_POINTER doc), reduced over D's columns.
        if (e.bgrad_d) narrow(bias_grad.data(), bias, p.bias_type, m);
        // BGRADA: "The bias size corresponds to the number of rows of the matrix D. The reduction
        // happens over the GEMM's k dimension": bias[i] = sum over l of op(A)(i, l).
        if (e.bgrad_a) {
            const bool t = p.transa == CblasTrans;
            for (size_t i = 0; i < m; ++i) {
                float sum = 0.0f;
                for (size_t l = 0; l < size_t(p.k); ++l) sum += load(a, p.a->type, t ? i * p.a->ld + l : l * p.a->ld + i);
                narrow(&sum, offset(bias, p.bias_type, i), p.bias_type, 1);
            }
        }
        // BGRADB: "The bias size corresponds to the number of columns of the matrix D. The
        // reduction happens over the GEMM's k dimension": bias[j] = sum over l of op(B)(l, j).
        // Each column's sum runs over l in order; with op(B) stored row by row (TRANSB = T) the
        // rows are added whole, so the loads are contiguous and the adds vectorize.
        if (e.bgrad_b) {
            const bool t = p.transb == CblasTrans;
            std::vector<float> sums(n, 0.0f), row(n);
            for (size_t l = 0; l < size_t(p.k); ++l) {
                if (t) {
                    widen(offset(b, p.b->type, l * p.b->ld), p.b->type, row.data(), n);
                } else {
                    for (size_t j = 0; j < n; ++j) row[j] = load(b, p.b->type, j * p.b->ld + l);
                }
                for (size_t j = 0; j < n; ++j) sums[j] += row[j];
            }
            narrow(sums.data(), bias, p.bias_type, n);
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Library handle and status strings

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
    if (handle == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: lightHandle is NULL");
    if (load_sgemm("cublasLtCreate") == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    *handle = new cublasLtContext{};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    if (handle == nullptr) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy: lightHandle is NULL");
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) { return status_name(status); }

// The emulator is no cuBLASLt release: version 0 (a file of autotuned picks names it, host/matmul_algos.h).
size_t cublasLtGetVersion() { return 0; }

const char* cublasLtGetStatusString(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "success";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
        case CUBLAS_STATUS_ALLOC_FAILED: return "resource allocation failed";
        case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "the device does not support the operation";
        case CUBLAS_STATUS_MAPPING_ERROR: return "access to device memory failed";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "the operation failed to execute";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
        case CUBLAS_STATUS_LICENSE_ERROR: return "license error";
    }
    return "unknown status";
}

// ---------------------------------------------------------------------------------------------
// Matrix layouts

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    Layout initial;
    initial.type = uint32_t(type);
    initial.rows = rows;
    initial.cols = cols;
    initial.ld = ld;
    return create<cublasLtMatrixLayoutOpaque_t>("cublasLtMatrixLayoutCreate", layout, initial);
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
    const Field field = layout ? layout_field(*impl<Layout>(layout), attr) : Field{};
    return set_attribute("cublasLtMatrixLayoutSetAttribute", layout, field, attr, buf, size);
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                void* buf, size_t size, size_t* size_written) {
    const Field field = layout ? layout_field(*impl<Layout>(layout), attr) : Field{};
    return get_attribute("cublasLtMatrixLayoutGetAttribute", layout, field, attr, buf, size, size_written);
}

// ---------------------------------------------------------------------------------------------
// Matmul descriptors

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute_type,
                                        cudaDataType_t scale_type) {
    MatmulDesc initial;
    initial.compute_type = compute_type;
    initial.scale_type = scale_type;
    return create<cublasLtMatmulDescOpaque_t>("cublasLtMatmulDescCreate", desc, initial);
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
    const Field field = desc ? matmul_field(*impl<MatmulDesc>(desc), attr) : Field{};
    return set_attribute("cublasLtMatmulDescSetAttribute", desc, field, attr, buf, size);
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              void* buf, size_t size, size_t* size_written) {
    const Field field = desc ? matmul_field(*impl<MatmulDesc>(desc), attr) : Field{};
    return get_attribute("cublasLtMatmulDescGetAttribute", desc, field, attr, buf, size, size_written);
}

// ---------------------------------------------------------------------------------------------
// Heuristic preferences and the heuristic: two alike algorithms, no workspace, for any supported problem

constexpr int kEmulatedAlgorithms = 2;

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    return create<cublasLtMatmulPreferenceOpaque_t>("cublasLtMatmulPreferenceCreate", pref, Preference{});
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
    const Field field = pref ? preference_field(*impl<Preference>(pref), attr) : Field{};
    return set_attribute("cublasLtMatmulPreferenceSetAttribute", pref, field, attr, buf, size);
}

cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, void* buf, size_t size,
                                                    size_t* size_written) {
    const Field field = pref ? preference_field(*impl<Preference>(pref), attr) : Field{};
    return get_attribute("cublasLtMatmulPreferenceGetAttribute", pref, field, attr, buf, size, size_written);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t pref, int requested_count,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned_count) {
    const char* caller = "cublasLtMatmulAlgoGetHeuristic";
    if (handle == nullptr) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "%s: lightHandle is NULL", caller);
    if (pref == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: preference is NULL", caller);
    if (requested_count <= 0)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: requestedAlgoCount %d is not positive", caller, requested_count);
    if (results == nullptr || returned_count == nullptr)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: heuristicResultsArray or returnAlgoCount is NULL", caller);
    *returned_count = 0;
    Problem problem;
    cublasStatus_t status =
        check_problem(caller, desc ? impl<MatmulDesc>(desc) : nullptr, Adesc ? impl<Layout>(Adesc) : nullptr,
                      Bdesc ? impl<Layout>(Bdesc) : nullptr, Cdesc ? impl<Layout>(Cdesc) : nullptr,
                      Ddesc ? impl<Layout>(Ddesc) : nullptr, &problem);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    // Two candidates that compute alike (the library offers several; a caller that times them and
    // keeps one, as matmul.cuh's autotune does, runs its choosing here too). The first word of
    // algo.data numbers them.
    const int count = std::min(requested_count, kEmulatedAlgorithms);
    for (int i = 0; i < count; ++i) {
        results[i] = {};
        results[i].algo.data[0] = uint64_t(i);
        results[i].workspaceSize = 0;
        results[i].state = CUBLAS_STATUS_SUCCESS;
        results[i].wavesCount = 1.0f;
    }
    *returned_count = count;
    return CUBLAS_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// What a matmul touches, for the race detector (cuda_emu.h, "Race detection"): the bytes each
// column-major operand spans over all batches.

namespace {
size_t span_bytes(uint64_t rows, uint64_t cols, int64_t ld, int batches, int64_t batch_stride, int64_t type) {
    if (rows == 0 || cols == 0) return 0;
    return element_size(type) * size_t(ld * int64_t(cols - 1) + int64_t(rows) + batch_stride * (batches - 1));
}
size_t span_bytes(const Layout& l) { return span_bytes(l.rows, l.cols, l.ld, l.batch_count, l.batch_stride, l.type); }

void report_matmul_accesses(const MatmulDesc& desc, const Problem& p, const void* A, const void* B, float beta,
                            const void* C, void* D, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    const Epilogue& e = p.epilogue;
    std::vector<cuemu::MemoryAccess> accesses = {{A, span_bytes(*p.a), false, false}, {B, span_bytes(*p.b), false, false}};
    if (beta != 0.0f) accesses.push_back({C, span_bytes(*p.c), false, false});
    if (e.needs_bias()) {
        // The bias is a vector along D's rows, except for BGRADB (along its columns).
        const uint64_t length = e.bgrad_b ? uint64_t(p.n) : uint64_t(p.m);
        const bool written = e.bgrad_d || e.bgrad_a || e.bgrad_b;
        accesses.push_back({desc.bias, span_bytes(length, 1, int64_t(length), p.batches, desc.bias_batch_stride, p.bias_type),
                            written, false});
    }
    if (e.needs_aux())  // GELU_AUX writes the GELU input there; DGELU reads it
        accesses.push_back({desc.aux, span_bytes(uint64_t(p.m), uint64_t(p.n), desc.aux_ld, p.batches,
                                                 desc.aux_batch_stride, p.aux_type),
                            e.store_aux, false});
    accesses.push_back({D, span_bytes(*p.d), true, false});
    if (workspace != nullptr && workspace_bytes > 0) accesses.push_back({workspace, workspace_bytes, true, false});
    cuemu::race::operation("cublasLtMatmul", stream, accesses.data(), int(accesses.size()));
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// The matmul. Streams run synchronously here, so it returns with D written; algo and workspace
// are accepted and unused.

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
    const char* caller = "cublasLtMatmul";
    if (handle == nullptr) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "%s: lightHandle is NULL", caller);
    Problem p;
    const MatmulDesc* desc = computeDesc ? impl<MatmulDesc>(computeDesc) : nullptr;
    cublasStatus_t status =
        check_problem(caller, desc, Adesc ? impl<Layout>(Adesc) : nullptr, Bdesc ? impl<Layout>(Bdesc) : nullptr,
                      Cdesc ? impl<Layout>(Cdesc) : nullptr, Ddesc ? impl<Layout>(Ddesc) : nullptr, &p);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    if (alpha == nullptr || beta == nullptr)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: alpha or beta is NULL", caller);
    const float alpha_value = *static_cast<const float*>(alpha), beta_value = *static_cast<const float*>(beta);
    if (A == nullptr || B == nullptr || D == nullptr || (beta_value != 0.0f && C == nullptr))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: a matrix pointer is NULL (A %p, B %p, C %p with beta %g, D %p)",
                    caller, A, B, C, double(beta_value), D);
    // In place (C == D) only with the same layout, so that each element is read before written.
    if (C == D && (p.c->ld != p.d->ld || p.c->batch_stride != p.d->batch_stride || p.c->type != p.d->type))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: C == D (in place) needs Cdesc and Ddesc to have the same type, ld and batch stride",
                    caller);
    if (p.epilogue.needs_bias() && desc->bias == nullptr)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: epilogue %u needs CUBLASLT_MATMUL_DESC_BIAS_POINTER", caller,
                    desc->epilogue);
    // NOT_SUPPORTED, not INVALID_VALUE as for a missing bias pointer: what an H100's cuBLAS 13 returns
    // (measured by test_cublaslt, 2026-11-27).
    if (p.epilogue.needs_aux() && desc->aux == nullptr)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: epilogue %u needs CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER", caller,
                    desc->epilogue);
    if (cuemu::record_only()) return CUBLAS_STATUS_SUCCESS;  // checked, not executed (cuda_emu.h)
    // What the call does: now, or when a captured graph is launched (with the descriptors as captured).
    const auto execute = [=](const MatmulDesc& d, const Problem& q) {
        if (cuemu::race::enabled()) report_matmul_accesses(d, q, A, B, beta_value, C, D, workspace, workspace_bytes, stream);
        return run_matmul(d, q, alpha_value, A, B, beta_value, C, D);
    };
    if (cuemu::capturing(stream)) {
        // Captured with the descriptors and scalars as they are now: the graph keeps what the call read.
        struct Snapshot {
            MatmulDesc desc;
            Layout a, b, c, d;
        };
        const auto saved = std::make_shared<const Snapshot>(Snapshot{*desc, *p.a, *p.b, *p.c, *p.d});
        const cudaError_t captured = cuemu::capture(stream, caller, [=] {
            Problem q = p;
            q.a = &saved->a, q.b = &saved->b, q.c = &saved->c, q.d = &saved->d;
            return execute(saved->desc, q) == CUBLAS_STATUS_SUCCESS;
        });
        return captured == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                       : fail(CUBLAS_STATUS_EXECUTION_FAILED, "%s: stream capture: %s", caller,
                                              cudaGetErrorString(captured));
    }
    return execute(*desc, p);
}
