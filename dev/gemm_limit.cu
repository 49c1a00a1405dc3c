// The GEMM limit of a training step: how long the step's matmuls alone take on this machine, with
// the shapes and transposes the program uses (kernels/matmul.cuh's launchers, no bias, GELU or bias
// gradient), so `make cpu-bench` can say how far a whole step is from it. Under g++ the matmuls are
// the emulated cuBLASLt's: OpenBLAS sgemm in the FP32 build, oneDNN's BF16 matmul in the BF16 build.
//   build/cpu/gemm_limit [-e d12] [-b 4] [-t 64]      (make cpu-bench runs it for both builds)
// Prints one line: GFLOP of the step's matmuls, the best of 3 timings, GFLOP/s, seconds.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/matmul.cuh"

namespace {

struct Shape {
    int C, OC, count;  // inp (N, C) @ weight (OC, C)^T, `count` times per step
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
    std::string model = "d12";
    int B = 4, T = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "-e")) model = argv[i + 1];
        else if (!std::strcmp(argv[i], "-b")) B = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "-t")) T = std::atoi(argv[i + 1]);
        else {
            std::fprintf(stderr, "gemm_limit: unknown flag '%s' (-e d12|d24|d36|d48, -b B, -t T)\n", argv[i]);
            return EXIT_FAILURE;
        }
    }
    // GPT-2's presets (train_gpt.cu's gpt2_preset): layers and channels; vocabulary padded to 50304.
    const struct { const char* name; int L, C; } presets[] = {{"d12", 12, 768}, {"d24", 24, 1024}, {"d36", 36, 1280}, {"d48", 48, 1600}};
    int L = 0, C = 0;
    for (const auto& p : presets)
        if (model == p.name) L = p.L, C = p.C;
    if (L == 0 || B < 1 || T < 1) {
        std::fprintf(stderr, "gemm_limit: -e must be d12, d24, d36 or d48 and -b, -t positive\n");
        return EXIT_FAILURE;
    }
    const int N = B * T, Vp = 50304;
    // Per layer: qkv, attention projection, fc, fc projection; once per step: the logits.
    const std::vector<Shape> shapes = {{C, 3 * C, L}, {C, C, L}, {C, 4 * C, L}, {4 * C, C, L}, {C, Vp, 1}};

    size_t max_in = 0, max_weight = 0, max_out = 0;
    for (const Shape& s : shapes) {
        max_in = std::max(max_in, size_t(N) * s.C);
        max_weight = std::max(max_weight, size_t(s.OC) * s.C);
        max_out = std::max(max_out, size_t(N) * s.OC);
    }
    floatX *inp, *weight, *out, *dinp, *dweight;
    void* workspace;
    CUDA_CHECK(cudaMalloc(&inp, max_in * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc(&dinp, max_in * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc(&weight, max_weight * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc(&dweight, max_weight * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc(&out, max_out * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc(&workspace, kMatmulWorkspaceBytes));
    // Small finite values: the timing must not depend on NaN or denormal paths.
    const size_t largest = std::max({max_in, max_weight, max_out});
    std::vector<floatX> fill(largest);
    for (size_t i = 0; i < largest; ++i) fill[i] = from_float<floatX>(float(int(i % 17) - 8) / 64.0f);
    for (floatX* p : {inp, dinp}) CUDA_CHECK(cudaMemcpy(p, fill.data(), max_in * sizeof(floatX), cudaMemcpyHostToDevice));
    for (floatX* p : {weight, dweight})
        CUDA_CHECK(cudaMemcpy(p, fill.data(), max_weight * sizeof(floatX), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(out, fill.data(), max_out * sizeof(floatX), cudaMemcpyHostToDevice));
    Matmul mm = matmul_create(workspace);

    // One step's matmuls: forward out = inp W^T; backward dinp = dout W and dweight += dout^T inp.
    auto step = [&] {
        for (const Shape& s : shapes)
            for (int i = 0; i < s.count; ++i) {
                matmul_forward(mm, out, inp, weight, nullptr, N, s.C, s.OC, 0);
                matmul_backward(mm, dinp, dweight, nullptr, nullptr, out, inp, weight, N, s.C, s.OC, 0);
            }
        CUDA_CHECK(cudaDeviceSynchronize());
    };
    double flops = 0;
    for (const Shape& s : shapes) flops += 6.0 * N * s.C * s.OC * s.count;
    step();  // warm-up: libraries loaded, kernels generated
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        step();
        best = std::min(best, seconds_since(t0));
    }
    std::printf("gemm_limit: %s B=%d T=%d [%s]: %.1f GFLOP of matmuls per step, %.3f s at %.1f GFLOP/s\n", model.c_str(),
                B, T, kPrecisionName, flops / 1e9, best, flops / best / 1e9);
    matmul_destroy(mm);
    for (void* p : {(void*)inp, (void*)dinp, (void*)weight, (void*)dweight, (void*)out, workspace}) CUDA_CHECK(cudaFree(p));
    return EXIT_SUCCESS;
}
