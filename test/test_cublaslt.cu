// cuBLASLt (the real library under nvcc, emu/cublaslt.cpp under g++) against a naive matmul in
// double computed from the same rounded inputs: every transpose, odd sizes, padded leading
// dimensions, strided batches, alpha/beta (C apart from D and in place), the epilogues the project
// uses with their aux and bias-gradient outputs, FP32 and BF16; and the documented error statuses.
#include "test_util.h"

#include <cublasLt.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

#define LT_CHECK(call)                                                      \
    do {                                                                    \
        const cublasStatus_t lt_status_ = (call);                           \
        INFO(#call << " -> " << cublasLtGetStatusName(lt_status_));         \
        REQUIRE(lt_status_ == CUBLAS_STATUS_SUCCESS);                       \
    } while (0)

constexpr double kFp32Unit = 0x1p-24;  // unit roundoff of FP32 (24-bit significand)
constexpr double kBf16Unit = 0x1p-8;   // unit roundoff of BF16 (8-bit significand)
// GELU and its derivative evaluated in FP32 (the emulator: std::tanh and a few roundings) stay
// within 16 FP32 units of |x| of the double formulas (measured over [-10, 10]: 2.4 units for GELU,
// 9.4 for GELU'). A GPU may use a hardware tanh (PTX tanh.approx: relative error ~2^-11), worth
// up to 0.5 |x| 2^-11 on GELU(x): then the test cannot tell GELU's tanh form from its erf form.
#ifdef __CUDACC__
constexpr double kActivationTolerance = 0x1p-11;
#else
constexpr double kActivationTolerance = 16 * kFp32Unit;
#endif
// With a BF16 D on a GPU, cuBLAS's epilogue is less exact than in FP32 (test_util.h,
// kBf16EpilogueTermUnits and kBf16EpilogueGeluTolerance, with the measurements).
double epilogue_term_units(cudaDataType out_type) { return out_type == CUDA_R_16BF ? kBf16EpilogueTermUnits : 0.0; }
double gelu_epilogue_tolerance(cudaDataType out_type) {
    return out_type == CUDA_R_16BF && !kEmulatedDevice ? kBf16EpilogueGeluTolerance : kActivationTolerance;
}

double unit_of(cudaDataType type) { return type == CUDA_R_16BF ? kBf16Unit : 0.0; }
float round_to(cudaDataType type, float v) { return type == CUDA_R_16BF ? __bfloat162float(__float2bfloat16(v)) : v; }
int64_t round_up(int64_t v, int64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

double gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
double gelu_derivative(double x) {
    const double s = std::sqrt(2 / M_PI), t = std::tanh(s * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * s * (1 + 3 * 0.044715 * x * x);
}

std::mt19937& rng() {
    static std::mt19937 generator(20240326);
    return generator;
}

// A column-major matrix (or batch of them) in device memory, with its host copy. The storage is
// exactly what the layout addresses; the gaps (ld > rows, batch stride > ld * cols) hold NaN, so
// reading one spoils a result and writing one shows up in check_gaps.
enum class Fill { random, nan };
struct Matrix {
    cudaDataType type;
    int64_t rows, cols, ld;
    int batch;
    int64_t stride;
    std::vector<float> host;  // values as stored (already rounded to `type`)
    DeviceBuffer<unsigned char> device;

    Matrix(cudaDataType type_, int64_t rows_, int64_t cols_, int64_t ld_, int batch_, int64_t stride_, Fill fill,
           float scale = 1.0f)
        : type(type_), rows(rows_), cols(cols_), ld(ld_), batch(batch_), stride(batch_ > 1 ? stride_ : 0),
          host(size_t((batch - 1) * stride + (cols - 1) * ld + rows), std::numeric_limits<float>::quiet_NaN()),
          device(host.size() * element_size()) {
        std::uniform_real_distribution<float> uniform(-scale, scale);
        if (fill == Fill::random)
            for (int b = 0; b < batch; ++b)
                for (int64_t j = 0; j < cols; ++j)
                    for (int64_t i = 0; i < rows; ++i) host[at(i, j, b)] = round_to(type, uniform(rng()));
        upload();
    }
    size_t element_size() const { return type == CUDA_R_16BF ? 2 : 4; }
    size_t at(int64_t i, int64_t j, int b = 0) const { return size_t(b * stride + j * ld + i); }
    float operator()(int64_t i, int64_t j, int b = 0) const { return host[at(i, j, b)]; }
    void* ptr() const { return device.ptr; }

    // BF16 moves as the upper half of an FP32's bits: exact both ways for the values `host` holds
    // (BF16 ones and the gaps' NaN), without a conversion call per element (slow under ASan).
    void upload() {
        std::vector<unsigned char> bytes(host.size() * element_size());
        size_t not_bf16 = 0;
        for (size_t e = 0; e < host.size(); ++e) {
            if (type == CUDA_R_16BF) {
                uint32_t bits;
                std::memcpy(&bits, &host[e], 4);
                not_bf16 += (bits & 0xFFFFu) != 0 && !std::isnan(host[e]);
                const uint16_t upper = uint16_t(bits >> 16);
                std::memcpy(&bytes[e * 2], &upper, 2);
            } else {
                std::memcpy(&bytes[e * 4], &host[e], 4);
            }
        }
        INFO("host values of a BF16 matrix that BF16 cannot hold exactly");
        REQUIRE(not_bf16 == 0);
        device.upload(bytes);
    }
    std::vector<float> download() const {
        std::vector<unsigned char> bytes = device.download();
        std::vector<float> values(host.size());
        for (size_t e = 0; e < values.size(); ++e) {
            if (type == CUDA_R_16BF) {
                uint16_t upper;
                std::memcpy(&upper, &bytes[e * 2], 2);
                const uint32_t bits = uint32_t(upper) << 16;
                std::memcpy(&values[e], &bits, 4);
            } else {
                std::memcpy(&values[e], &bytes[e * 4], 4);
            }
        }
        return values;
    }
    // Every element outside the addressed ones must still be NaN. The addressed columns lie in
    // storage order (ld >= rows, stride >= ld * cols), so the gaps are the runs between them.
    void check_gaps(const std::vector<float>& values, const char* name) const {
        size_t written = 0, e = 0;
        bool in_order = true;
        for (int b = 0; b < batch; ++b)
            for (int64_t j = 0; j < cols; ++j) {
                const size_t column = at(0, j, b);
                in_order = in_order && column >= e;
                for (; e < column; ++e) written += !std::isnan(values[e]);
                e = column + size_t(rows);
            }
        for (; e < values.size(); ++e) written += !std::isnan(values[e]);
        REQUIRE(in_order);
        INFO(name << ": elements written outside the matrix");
        CHECK(written == 0);
    }
};

// Compares an output with its reference within per-element bounds; reports the first misses.
struct Comparison {
    explicit Comparison(const char* name_) : name(name_) {}
    const char* name;
    size_t misses = 0;
    std::ostringstream first;
    void check(float got, double expected, double bound, int b, int64_t i, int64_t j) {
        if (std::fabs(double(got) - expected) <= bound) return;  // NaN fails too
        if (misses++ < 4)
            first << "  " << name << "[batch " << b << "](" << i << ", " << j << ") = " << got << ", expected "
                  << expected << " +- " << bound << "\n";
    }
    ~Comparison() {
        INFO(first.str());
        CHECK(misses == 0);
    }
};

// RAII wrappers for the descriptors.
struct Handle {
    cublasLtHandle_t h = nullptr;
    Handle() { LT_CHECK(cublasLtCreate(&h)); }
    ~Handle() { cublasLtDestroy(h); }
};
struct MatmulDesc {
    cublasLtMatmulDesc_t d = nullptr;
    explicit MatmulDesc(cublasComputeType_t compute = CUBLAS_COMPUTE_32F) {
        LT_CHECK(cublasLtMatmulDescCreate(&d, compute, CUDA_R_32F));
    }
    ~MatmulDesc() { cublasLtMatmulDescDestroy(d); }
    template <typename T> void set(cublasLtMatmulDescAttributes_t attribute, T value) {
        LT_CHECK(cublasLtMatmulDescSetAttribute(d, attribute, &value, sizeof value));
    }
};
struct Layout {
    cublasLtMatrixLayout_t l = nullptr;
    explicit Layout(const Matrix& m) {
        LT_CHECK(cublasLtMatrixLayoutCreate(&l, m.type, uint64_t(m.rows), uint64_t(m.cols), m.ld));
        if (m.batch > 1) {
            int32_t count = m.batch;
            int64_t stride = m.stride;
            LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
            LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                      sizeof stride));
        }
    }
    ~Layout() { cublasLtMatrixLayoutDestroy(l); }
};

constexpr size_t kWorkspaceBytes = 4 << 20;

// Heuristic then matmul, as the program calls them.
cublasStatus_t matmul(const Handle& handle, const MatmulDesc& desc, float alpha, const Matrix& A, const Matrix& B,
                      float beta, const Matrix& C, const Matrix& D) {
    static DeviceBuffer<unsigned char> workspace(kWorkspaceBytes);
    Layout a(A), b(B), c(C), d(D);
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t workspace_bytes = kWorkspaceBytes;
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                  sizeof workspace_bytes));
    // As kernels/matmul.cuh asks: split-K partial sums in FP32 only (not in D's type).
    const uint32_t reduction_schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction_schemes,
                                                  sizeof reduction_schemes));
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle.h, desc.d, a.l, b.l, c.l, d.l, pref, 1, &result, &count);
    cublasLtMatmulPreferenceDestroy(pref);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    REQUIRE(count == 1);
    REQUIRE(result.state == CUBLAS_STATUS_SUCCESS);
    status = cublasLtMatmul(handle.h, desc.d, &alpha, A.ptr(), a.l, B.ptr(), b.l, &beta, C.ptr(), c.l, D.ptr(), d.l,
                            &result.algo, workspace.ptr, kWorkspaceBytes, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    return status;
}

// ---------------------------------------------------------------------------------------------

struct Case {
    cudaDataType ab = CUDA_R_32F, cd = CUDA_R_32F;  // A and B; C and D
    cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
    int m = 37, n = 19, k = 23;
    int pad = 3;  // leading dimension = rows + pad (BF16: rounded up to a multiple of 8)
    int batch = 1;
    float alpha = 1, beta = 0;
    bool in_place = false;  // C == D
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    bool fp32_bias = false;  // sets BIAS_DATA_TYPE to CUDA_R_32F (default: D's type)
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;  // what the call returns (a refused one writes nothing)

    std::string describe() const {
        std::ostringstream s;
        s << (ab == CUDA_R_16BF ? "bf16" : "fp32") << " -> " << (cd == CUDA_R_16BF ? "bf16" : "fp32") << " op(A) "
          << (transa == CUBLAS_OP_N ? "N" : "T") << " op(B) " << (transb == CUBLAS_OP_N ? "N" : "T") << " m " << m
          << " n " << n << " k " << k << " pad " << pad << " batch " << batch << " alpha " << alpha << " beta " << beta
          << (in_place ? " in place" : "") << " epilogue " << int(epilogue) << (fp32_bias ? " fp32 bias" : "");
        return s.str();
    }
};

void run_case(const Case& c) {
    INFO(c.describe());
    const cublasLtEpilogue_t e = c.epilogue;
    const bool add_bias = e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const bool store_aux = e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const bool gelu_forward = store_aux || e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS;
    const bool dgelu = e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    const bool bgrad_d = e == CUBLASLT_EPILOGUE_DGELU_BGRAD, bgrad_a = e == CUBLASLT_EPILOGUE_BGRADA,
               bgrad_b = e == CUBLASLT_EPILOGUE_BGRADB;
    const bool ta = c.transa != CUBLAS_OP_N, tb = c.transb != CUBLAS_OP_N;

    auto ld_for = [&](cudaDataType type, int64_t rows) {
        return type == CUDA_R_16BF ? round_up(rows + c.pad, 8) : rows + c.pad;
    };
    // Batch strides larger than the matrix, multiples of 8 so BF16 entries stay 16-byte aligned.
    auto stride_for = [](int64_t ld, int64_t cols) { return round_up(ld * cols + 24, 8); };
    auto make = [&](cudaDataType type, int64_t rows, int64_t cols, Fill fill, float scale = 1.0f) {
        const int64_t ld = ld_for(type, rows);
        return std::make_unique<Matrix>(type, rows, cols, ld, c.batch, stride_for(ld, cols), fill, scale);
    };
    auto A = make(c.ab, ta ? c.k : c.m, ta ? c.m : c.k, Fill::random);
    auto B = make(c.ab, tb ? c.n : c.k, tb ? c.k : c.n, Fill::random);
    auto C = make(c.cd, c.m, c.n, Fill::random);
    auto D_storage = c.in_place ? nullptr : make(c.cd, c.m, c.n, Fill::nan);
    const Matrix& D = c.in_place ? *C : *D_storage;

    // Epilogue vectors and the aux matrix (GELU input: written by GELU_AUX, read by DGELU, whose
    // values span [-3, 3] to reach GELU's curved part). Aux ld and strides: multiples of 8.
    const cudaDataType out_type = c.cd;
    const cudaDataType bias_type = c.fp32_bias ? CUDA_R_32F : out_type;
    const int64_t bias_length = bgrad_b ? c.n : c.m;
    std::unique_ptr<Matrix> bias, aux;
    if (add_bias || bgrad_d || bgrad_a || bgrad_b)
        bias = std::make_unique<Matrix>(bias_type, bias_length, 1, bias_length, c.batch, round_up(bias_length + 8, 8),
                                        add_bias ? Fill::random : Fill::nan);
    if (store_aux || dgelu) {
        const int64_t aux_ld = round_up(c.m + c.pad, 8);
        aux = std::make_unique<Matrix>(out_type, c.m, c.n, aux_ld, c.batch, stride_for(aux_ld, c.n),
                                       dgelu ? Fill::random : Fill::nan, 3.0f);
    }
    const std::vector<float> c_values = C->host;  // C as read (D overwrites it in place)

    Handle handle;
    MatmulDesc desc;
    desc.set(CUBLASLT_MATMUL_DESC_TRANSA, c.transa);
    desc.set(CUBLASLT_MATMUL_DESC_TRANSB, c.transb);
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, e);
    if (c.fp32_bias) desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(CUDA_R_32F));
    if (bias) {
        desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias->ptr());
        if (c.batch > 1) desc.set(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, bias->stride);
    }
    if (aux) {
        desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux->ptr());
        desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux->ld);
        if (c.batch > 1) desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, aux->stride);
    }
    const cublasStatus_t status = matmul(handle, desc, c.alpha, *A, *B, c.beta, *C, D);
    INFO("matmul -> " << cublasLtGetStatusName(status));
    REQUIRE(status == c.status);

    const std::vector<float> d_got = D.download();
    if (status != CUBLAS_STATUS_SUCCESS) {  // refused: D as it was (NaN, or C's values in place)
        size_t written = 0;
        for (int b = 0; b < c.batch; ++b)
            for (int64_t j = 0; j < c.n; ++j)
                for (int64_t i = 0; i < c.m; ++i)
                    written += c.in_place ? d_got[D.at(i, j, b)] != c_values[C->at(i, j, b)] : !std::isnan(d_got[D.at(i, j, b)]);
        CHECK(written == 0);
        return;
    }
    const std::vector<float> aux_got = aux ? aux->download() : std::vector<float>();
    const std::vector<float> bias_got = bias ? bias->download() : std::vector<float>();
    D.check_gaps(d_got, "D");
    if (store_aux) aux->check_gaps(aux_got, "aux");
    if (bias && !add_bias) bias->check_gaps(bias_got, "bias gradient");

    const double u_out = unit_of(out_type), u_bias = unit_of(bias_type), u_aux = aux ? unit_of(aux->type) : 0.0;

    Comparison d_check("D"), aux_check("aux"), bias_check("bias gradient");
    // op(A)'s rows and op(B)'s columns as dense k-vectors of doubles: the same values summed in the
    // same order as reading them through the layouts, without an indexed lookup per term (under
    // ASan that lookup made this reference most of the test's time on the 4.5M-element products).
    std::vector<double> a_rows(size_t(c.m) * c.k), b_cols(size_t(c.n) * c.k);
    for (int b = 0; b < c.batch; ++b) {
        for (int64_t i = 0; i < c.m; ++i)
            for (int64_t l = 0; l < c.k; ++l) a_rows[i * c.k + l] = double(ta ? (*A)(l, i, b) : (*A)(i, l, b));
        for (int64_t j = 0; j < c.n; ++j)
            for (int64_t l = 0; l < c.k; ++l) b_cols[j * c.k + l] = double(tb ? (*B)(j, l, b) : (*B)(l, j, b));
        std::vector<double> row_sum(c.m, 0.0), row_abs(c.m, 0.0), row_bound(c.m, 0.0);
        for (int64_t j = 0; j < c.n; ++j) {
            const double* b_col = &b_cols[j * c.k];
            for (int64_t i = 0; i < c.m; ++i) {
                const double* a_row = &a_rows[i * c.k];
                double product = 0, magnitude = 0;
                for (int64_t l = 0; l < c.k; ++l) {
                    const double term = a_row[l] * b_col[l];
                    product += term;
                    magnitude += std::fabs(term);
                }
                const double c_term = c.beta * double(c_values[C->at(i, j, b)]);
                const double bias_term = add_bias ? double((*bias)(i, 0, b)) : 0.0;
                const double x = c.alpha * product + c_term + bias_term;
                // FP32 accumulation of k products (exact for BF16 inputs), then the alpha, beta and
                // bias additions: at most (k + 4) FP32 roundings of the magnitudes involved
                // (Higham's gamma_n bound for a recursive sum).
                const double x_bound =
                    (c.k + 4) * kFp32Unit * (std::fabs(c.alpha) * magnitude + std::fabs(c_term) + std::fabs(bias_term)) +
                    epilogue_term_units(out_type) * (std::fabs(c.alpha * product) + std::fabs(c_term) + std::fabs(bias_term));
                double y = x, y_bound = x_bound;
                const double activation_tolerance = gelu_epilogue_tolerance(out_type);
                if (store_aux) aux_check.check(aux_got[aux->at(i, j, b)], x, x_bound * (1 + u_aux) + u_aux * std::fabs(x), b, i, j);
                // |GELU'| <= 1.13 carries x's error; the activation adds its own evaluation error.
                if (gelu_forward) {
                    y = gelu(x);
                    y_bound = 1.2 * x_bound + activation_tolerance * std::fabs(x);
                }
                if (dgelu) {
                    const double slope = gelu_derivative((*aux)(i, j, b));
                    y = x * slope;
                    y_bound = std::fabs(slope) * x_bound + activation_tolerance * std::fabs(x);
                }
                const double d_bound = y_bound * (1 + u_out) + u_out * std::fabs(y);
                d_check.check(d_got[D.at(i, j, b)], y, d_bound, b, i, j);
                row_sum[i] += y;
                row_abs[i] += std::fabs(y);
                row_bound[i] += d_bound;
            }
        }
        // Bias gradients: a sum of n (DGELU_BGRAD), or k (BGRADA/B) FP32 terms, then one rounding
        // to the bias type. DGELU_BGRAD's terms are the D values, within d_bound each whether the
        // sum takes them before or after D's own rounding.
        if (bgrad_d)
            for (int64_t i = 0; i < c.m; ++i) {
                const double bound = row_bound[i] + c.n * kFp32Unit * row_abs[i];
                bias_check.check(bias_got[bias->at(i, 0, b)], row_sum[i], bound * (1 + u_bias) + u_bias * std::fabs(row_sum[i]), b, i, 0);
            }
        if (bgrad_a || bgrad_b)
            for (int64_t v = 0; v < bias_length; ++v) {
                double sum = 0, magnitude = 0;
                for (int64_t l = 0; l < c.k; ++l) {
                    const double term = bgrad_a ? a_rows[v * c.k + l] : b_cols[v * c.k + l];
                    sum += term;
                    magnitude += std::fabs(term);
                }
                const double bound = c.k * kFp32Unit * magnitude;
                bias_check.check(bias_got[bias->at(v, 0, b)], sum, bound * (1 + u_bias) + u_bias * std::fabs(sum), b, v, 0);
            }
    }
}

// The type combinations of cuBLASLt's table for CUBLAS_COMPUTE_32F: A/B type -> C/D type.
const std::pair<cudaDataType, cudaDataType> kTypes[] = {
    {CUDA_R_32F, CUDA_R_32F}, {CUDA_R_16BF, CUDA_R_16BF}, {CUDA_R_16BF, CUDA_R_32F}};
const cublasOperation_t kOps[] = {CUBLAS_OP_N, CUBLAS_OP_T};

}  // namespace

TEST_CASE("cublasLt matmul: every transpose, odd sizes, padded leading dimensions") {
    struct Size { int m, n, k, pad; };
    for (const auto& [ab, cd] : kTypes)
        for (cublasOperation_t transa : kOps)
            for (cublasOperation_t transb : kOps)
                for (Size s : {Size{37, 19, 23, 3}, Size{8, 41, 64, 0}, Size{1, 5, 3, 1}}) {
                    Case c;
                    c.ab = ab, c.cd = cd, c.transa = transa, c.transb = transb;
                    c.m = s.m, c.n = s.n, c.k = s.k, c.pad = s.pad;
                    run_case(c);
                }
}

TEST_CASE("cublasLt matmul: alpha and beta, C apart from D and in place") {
    for (const auto& [ab, cd] : kTypes)
        for (bool in_place : {false, true}) {
            Case c;
            c.ab = ab, c.cd = cd, c.transa = CUBLAS_OP_T, c.transb = CUBLAS_OP_N;
            c.alpha = 0.75f, c.beta = -1.5f, c.in_place = in_place;
            run_case(c);
            c.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;  // beta C joins the GELU input
            run_case(c);
        }
}

TEST_CASE("cublasLt matmul: strided batches") {
    for (const auto& [ab, cd] : kTypes)
        for (bool in_place : {false, true}) {
            Case c;
            c.ab = ab, c.cd = cd, c.transa = CUBLAS_OP_N, c.transb = CUBLAS_OP_T;
            c.m = 21, c.n = 13, c.k = 17, c.batch = 3;
            c.alpha = 1.25f, c.beta = 0.5f, c.in_place = in_place;
            run_case(c);
        }
}

// The epilogues the project uses, the forward ones in the layout of a linear layer's forward pass
// (weights transposed), the gradient ones in that of its backward pass (BGRADA/B: dW = X dY^T shapes).
struct EpilogueUse { cublasLtEpilogue_t epilogue; cublasOperation_t transa, transb; float alpha; };
const EpilogueUse kEpilogueUses[] = {
    {CUBLASLT_EPILOGUE_DEFAULT, CUBLAS_OP_T, CUBLAS_OP_N, 0.5f},
    {CUBLASLT_EPILOGUE_BIAS, CUBLAS_OP_T, CUBLAS_OP_N, 0.5f},
    {CUBLASLT_EPILOGUE_GELU, CUBLAS_OP_T, CUBLAS_OP_N, 0.5f},
    {CUBLASLT_EPILOGUE_GELU_AUX, CUBLAS_OP_T, CUBLAS_OP_N, 0.5f},
    {CUBLASLT_EPILOGUE_GELU_BIAS, CUBLAS_OP_T, CUBLAS_OP_N, 0.5f},
    {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLAS_OP_T, CUBLAS_OP_N, 0.5f},
    {CUBLASLT_EPILOGUE_DGELU, CUBLAS_OP_N, CUBLAS_OP_N, 1.0f},
    {CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLAS_OP_N, CUBLAS_OP_N, 1.0f},
    {CUBLASLT_EPILOGUE_BGRADA, CUBLAS_OP_N, CUBLAS_OP_T, 1.0f},
    {CUBLASLT_EPILOGUE_BGRADB, CUBLAS_OP_N, CUBLAS_OP_T, 1.0f},
};

TEST_CASE("cublasLt matmul: epilogues, with their aux and bias-gradient outputs") {
    for (cudaDataType type : {CUDA_R_32F, CUDA_R_16BF})
        for (const EpilogueUse& use : kEpilogueUses)
            for (int batch : {1, 3}) {
                Case c;
                c.ab = c.cd = type;
                c.epilogue = use.epilogue, c.transa = use.transa, c.transb = use.transb, c.alpha = use.alpha;
                c.k = 40;  // GELU inputs of a few units: the curved part of GELU
                c.batch = batch;
                run_case(c);
            }
    // Refused with INVALID_VALUE by an H100's cuBLAS 13 (2026-11-27), which the documentation does
    // not say; the emulator does the same, so the CPU build takes the paths a GPU takes.
    SECTION("FP32 bias with a BF16 output (BIAS_DATA_TYPE): INVALID_VALUE") {
        Case c;
        c.ab = c.cd = CUDA_R_16BF;
        c.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS, c.transa = CUBLAS_OP_T;
        c.fp32_bias = true;
        c.status = CUBLAS_STATUS_INVALID_VALUE;
        run_case(c);
        c.epilogue = CUBLASLT_EPILOGUE_BGRADB, c.transa = CUBLAS_OP_N, c.transb = CUBLAS_OP_T;
        run_case(c);
    }
    SECTION("FP32 bias with an FP32 output") {
        Case c;
        c.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS, c.transa = CUBLAS_OP_T;
        c.fp32_bias = true;
        run_case(c);
    }
}

// Products the emulator computes and finishes in cache-sized panels (emu/cublaslt.cpp, panels_of: 2^18
// FP32 values each, from 16 panels on): 15000 x 300 splits D's rows (18 panels, the last partial),
// 72 x 60000 its columns (17; DGELU_BGRAD there: whole, as its row sums run over the columns), each
// with every epilogue (op(A) and op(B) both transposed and not among them), C added (apart and in
// place) and two batches. On a GPU these are plain matmuls of the same sizes.
TEST_CASE("cublasLt matmul: products larger than a panel, every epilogue") {
    struct Size { int m, n; };
    for (Size size : {Size{15000, 300}, Size{72, 60000}})
        for (const EpilogueUse& use : kEpilogueUses) {
            Case c;
            c.ab = c.cd = CUDA_R_16BF;
            c.m = size.m, c.n = size.n, c.k = 8;
            c.epilogue = use.epilogue, c.transa = use.transa, c.transb = use.transb, c.alpha = use.alpha;
            run_case(c);
            if (use.epilogue != CUBLASLT_EPILOGUE_DEFAULT) continue;
            c.beta = -1.5f;  // C added: an FP32 D too takes the epilogue
            for (cudaDataType cd : {CUDA_R_16BF, CUDA_R_32F})
                for (bool in_place : {false, true}) {
                    c.cd = cd, c.in_place = in_place, c.batch = in_place ? 2 : 1;
                    run_case(c);
                }
        }
}

// A BF16 output rounds as cvt.rn.bf16.f32 and the host's __float2bfloat16 do: to nearest, ties to
// even, overflow to infinity, NaN to the canonical 0x7FFF. Each element of D is the exact FP32 sum
// of two BF16 inputs (op(B) = [1, 1]) chosen to land on or near a rounding boundary.
TEST_CASE("cublasLt matmul: BF16 output rounds to nearest even, like __float2bfloat16") {
    const float largest = std::ldexp(255.0f, 120);  // the largest finite BF16, (2 - 2^-7) 2^127
    const std::vector<std::pair<float, float>> sums = {
        {1.0f, 0x1p-8f},                   // half an ulp above 1: a tie, to 1 (even)
        {1.0f + 0x1p-7f, 0x1p-8f},         // a tie above an odd significand: up to 1 + 2^-6
        {1.0f, 0x1p-9f},                   // under half an ulp: down
        {1.0f, 0x1p-8f + 0x1p-10f},        // over half an ulp: up
        {-1.0f - 0x1p-7f, -0x1p-8f},       // negative tie: away from the odd significand
        {largest, std::ldexp(1.0f, 119)},  // a tie above the largest finite: to infinity
        {largest, std::ldexp(1.0f, 118)},  // under half an ulp there: stays finite
        {INFINITY, 1.0f},
        {INFINITY, -INFINITY},  // NaN
        {3.0f, 0.0f},           // exact
    };
    const int m = int(sums.size());
    const int64_t ld = round_up(m, 8);
    Matrix A(CUDA_R_16BF, m, 2, ld, 1, 0, Fill::nan), B(CUDA_R_16BF, 2, 1, 8, 1, 0, Fill::nan),
        C(CUDA_R_16BF, m, 1, ld, 1, 0, Fill::nan), D(CUDA_R_16BF, m, 1, ld, 1, 0, Fill::nan);
    for (int i = 0; i < m; ++i) {
        A.host[A.at(i, 0)] = sums[i].first;
        A.host[A.at(i, 1)] = sums[i].second;
        REQUIRE(round_to(CUDA_R_16BF, sums[i].first) == sums[i].first);  // both inputs exactly BF16
        REQUIRE(round_to(CUDA_R_16BF, sums[i].second) == sums[i].second);
    }
    B.host = {1.0f, 1.0f};
    A.upload();
    B.upload();
    Handle handle;
    MatmulDesc desc;
    LT_CHECK(matmul(handle, desc, 1.0f, A, B, 0.0f, C, D));
    const std::vector<unsigned char> bytes = D.device.download();
    for (int i = 0; i < m; ++i) {
        uint16_t got, want;
        std::memcpy(&got, &bytes[2 * D.at(i, 0)], 2);
        const __nv_bfloat16 expected = __float2bfloat16(sums[i].first + sums[i].second);
        std::memcpy(&want, &expected, 2);
        INFO("row " << i << ": " << sums[i].first << " + " << sums[i].second << " -> 0x" << std::hex << got
                    << ", __float2bfloat16 gives 0x" << want);
        CHECK(got == want);
    }
}

TEST_CASE("cublasLt: descriptor attributes round-trip and reject bad sizes") {
    MatmulDesc desc;
    desc.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
    int32_t transa = -1;
    uint32_t epilogue = 0;
    size_t written = 0;
    LT_CHECK(cublasLtMatmulDescGetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa, &written));
    CHECK(transa == CUBLAS_OP_T);
    CHECK(written == sizeof transa);
    LT_CHECK(cublasLtMatmulDescGetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue, nullptr));
    CHECK(epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
    // sizeInBytes 0 asks for the size (cublasLtMatmulDescGetAttribute).
    LT_CHECK(cublasLtMatmulDescGetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, nullptr, 0, &written));
    CHECK(written == sizeof(int64_t));

    // "INVALID_VALUE if buf is NULL or sizeInBytes doesn't match size of internal storage".
    int64_t wide = CUBLAS_OP_T;
    CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof wide) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, nullptr, sizeof(int32_t)) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulDescGetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof wide, &written) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulDescSetAttribute(desc.d, cublasLtMatmulDescAttributes_t(9999), &transa, sizeof transa) ==
          CUBLAS_STATUS_INVALID_VALUE);

    cublasLtMatrixLayout_t layout;
    LT_CHECK(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 37, 19, 40));
    uint64_t rows = 0;
    int64_t ld = 0;
    LT_CHECK(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows, &written));
    LT_CHECK(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld, &written));
    CHECK(rows == 37);
    CHECK(ld == 40);
    CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ROWS, &transa, sizeof transa) ==
          CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatrixLayoutDestroy(layout);
    CHECK(std::string(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED)) == "CUBLAS_STATUS_NOT_SUPPORTED");
}

TEST_CASE("cublasLt: misuse returns the documented status") {
    Handle handle;
    Matrix A(CUDA_R_32F, 16, 8, 16, 1, 0, Fill::random), B(CUDA_R_32F, 8, 24, 8, 1, 0, Fill::random);
    Matrix D(CUDA_R_32F, 16, 24, 16, 1, 0, Fill::nan);
    MatmulDesc desc;

    // NOT_SUPPORTED where a missing bias pointer gives INVALID_VALUE: what an H100's cuBLAS 13 returns
    // (2026-11-27), and so what the emulator returns.
    SECTION("an epilogue without its aux pointer: NOT_SUPPORTED") {
        desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX);
        desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(16));
        CHECK(matmul(handle, desc, 1, A, B, 0, D, D) == CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("an epilogue without its bias pointer: INVALID_VALUE") {
        desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
        CHECK(matmul(handle, desc, 1, A, B, 0, D, D) == CUBLAS_STATUS_INVALID_VALUE);
    }
    SECTION("shapes that do not agree: INVALID_VALUE") {
        Matrix B_wrong(CUDA_R_32F, 9, 24, 9, 1, 0, Fill::random);
        CHECK(matmul(handle, desc, 1, A, B_wrong, 0, D, D) == CUBLAS_STATUS_INVALID_VALUE);
    }
    SECTION("FP32 inputs with a BF16 output, outside the type table: NOT_SUPPORTED") {
        Matrix D16(CUDA_R_16BF, 16, 24, 16, 1, 0, Fill::nan);
        CHECK(matmul(handle, desc, 1, A, B, 0, D16, D16) == CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("requestedAlgoCount 0: INVALID_VALUE") {
        Layout a(A), b(B), d(D);
        cublasLtMatmulPreference_t pref;
        LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        cublasLtMatmulHeuristicResult_t result{};
        int count = -1;
        CHECK(cublasLtMatmulAlgoGetHeuristic(handle.h, desc.d, a.l, b.l, d.l, d.l, pref, 0, &result, &count) ==
              CUBLAS_STATUS_INVALID_VALUE);
        cublasLtMatmulPreferenceDestroy(pref);
    }
#ifndef __CUDACC__
    // Limits of the emulator, not of cuBLASLt (which has row-major and TF32 kernels): the
    // emulator must refuse them loudly rather than compute something else.
    SECTION("emulator: a row-major layout is NOT_SUPPORTED") {
        Layout a(A), b(B), d(D);
        const int32_t row = CUBLASLT_ORDER_ROW;
        LT_CHECK(cublasLtMatrixLayoutSetAttribute(a.l, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row));
        const float one = 1, zero = 0;
        CHECK(cublasLtMatmul(handle.h, desc.d, &one, A.ptr(), a.l, B.ptr(), b.l, &zero, D.ptr(), d.l, D.ptr(), d.l,
                             nullptr, nullptr, 0, 0) == CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("emulator: compute types other than CUBLAS_COMPUTE_32F are NOT_SUPPORTED") {
        MatmulDesc tf32(CUBLAS_COMPUTE_32F_FAST_TF32);
        CHECK(matmul(handle, tf32, 1, A, B, 0, D, D) == CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("emulator: the heuristic offers two alike algorithms without workspace") {
        Layout a(A), b(B), d(D);
        cublasLtMatmulPreference_t pref;
        LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        cublasLtMatmulHeuristicResult_t results[4] = {};
        int count = 0;
        LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle.h, desc.d, a.l, b.l, d.l, d.l, pref, 4, results, &count));
        CHECK(count == 2);
        for (int i = 0; i < count; ++i) {
            CHECK(results[i].state == CUBLAS_STATUS_SUCCESS);
            CHECK(results[i].workspaceSize == 0);
        }
        LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle.h, desc.d, a.l, b.l, d.l, d.l, pref, 1, results, &count));
        CHECK(count == 1);
        cublasLtMatmulPreferenceDestroy(pref);
    }
#endif
}
