// The attention forward's two tensor-core kernels at a model's shapes, timed on one device: the
// mma.sync forward (attention_tc_forward, what the trainer runs) and the wgmma forward
// (attention_wgmma_forward, sm_90a, head size 64). scripts/gpu_check.sh's profile stage runs it on a
// lent H100, so that the wgmma kernel's rate is measured before anything trains with it.
//   build/gpu/attention_bench [-e d12] [-b 64] [-t 1024] [--iters 20] [--json FILE] [--require-wgmma]
// Causal, no documents, one layer's attention (B x NH heads of T x T). Prints, per kernel, the best
// time of `iters` runs (after one warm-up) and TFLOP/s on FlashAttention's count (2 B T^2 C for a
// causal forward), and the largest difference between the two outputs relative to max |out| (they
// sum over other tile boundaries: a few bf16 units at most). Without an sm_90 GPU the wgmma kernel is
// left out and said so (--require-wgmma: then exit 77, skipped, as the suite runs it). Exits 1 if the
// outputs differ by more than that or are not finite. Under g++ both run in the emulator (make test
// runs it at a small shape, to check that it runs; its times mean nothing there).
// precision: BF16 only (the kernels take BF16 operands)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_wgmma.cuh"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int fail(const std::string& what) {
    std::fprintf(stderr, "attention_bench: error: %s\n", what.c_str());
    return EXIT_FAILURE;
}

}  // namespace

int main(int argc, char** argv) {
    std::string model = "d12", json_path;
    int B = 64, T = 1024, iters = 20;
    bool require_wgmma = false;
    for (int i = 1; i < argc; i += 2) {
        const std::string flag = argv[i];
        if (flag == "--require-wgmma") {
            require_wgmma = true;
            --i;
            continue;
        }
        if (i + 1 >= argc) return fail("flag '" + flag + "' needs a value");
        const char* value = argv[i + 1];
        if (flag == "-e") model = value;
        else if (flag == "-b") B = std::atoi(value);
        else if (flag == "-t") T = std::atoi(value);
        else if (flag == "--iters") iters = std::atoi(value);
        else if (flag == "--json") json_path = value;
        else return fail("unknown flag '" + flag + "' (-e d12|d24|d36|d48|mini, -b B, -t T, --iters N, --json FILE, --require-wgmma)");
    }
    // GPT-2's presets (host/model_config.h): heads and channels; mini: a small shape for the emulator.
    const struct { const char* name; int NH, C; } presets[] = {
        {"d12", 12, 768}, {"d24", 16, 1024}, {"d36", 20, 1280}, {"d48", 25, 1600}, {"mini", 2, 128}};
    int NH = 0, C = 0;
    for (const auto& p : presets)
        if (model == p.name) NH = p.NH, C = p.C;
    if (NH == 0) return fail("-e " + model + ": expected d12, d24, d36, d48 or mini");
    if (B < 1 || T < 1 || iters < 1) return fail("-b, -t and --iters must be positive");
    if (const std::string problem = attention_wgmma_requirements(B, T, C, NH); !problem.empty())
        return fail("-e " + model + " -b " + std::to_string(B) + " -t " + std::to_string(T) + ": " + problem);

    bool wgmma_runs = kEmulatedDevice;
    std::string device = "the CPU emulator";
    if (!kEmulatedDevice) {
        cudaDeviceProp prop{};
        CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        device = prop.name;
        wgmma_runs = prop.major == 9 && prop.minor == 0;
    }
    if (require_wgmma && !wgmma_runs) {
        std::printf("skipped: wgmma needs an sm_90 GPU (this is %s)\n", device.c_str());
        return 77;
    }
    const size_t BT = size_t(B) * T;
    std::vector<floatX> qkv_host(BT * 3 * C);
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
    for (floatX& x : qkv_host) x = from_float<floatX>(uniform(rng));
    floatX *qkv, *out_mma, *out_wgmma;
    float* lse;
    CUDA_CHECK(cudaMalloc(&qkv, qkv_host.size() * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc(&out_mma, BT * C * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc(&out_wgmma, BT * C * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc(&lse, BT * NH * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(qkv, qkv_host.data(), qkv_host.size() * sizeof(floatX), cudaMemcpyHostToDevice));

    struct Result {
        const char* kernel;
        bool ran;
        double ms;
    };
    const auto time_kernel = [&](const char* name, bool runs, auto&& forward) -> Result {
        if (!runs) return {name, false, 0.0};
        forward();  // warm-up
        CUDA_CHECK(cudaDeviceSynchronize());
        double best = 1e30;
        for (int r = 0; r < iters; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            forward();
            CUDA_CHECK(cudaDeviceSynchronize());
            best = std::min(best, seconds_since(t0));
        }
        return {name, true, best * 1e3};
    };
    const Result results[] = {
        time_kernel("attention_tc_forward (mma.sync)", true,
                    [&] { attention_tc_forward(out_mma, lse, qkv, B, T, C, NH, 0); }),
        time_kernel("attention_wgmma_forward (wgmma)", wgmma_runs,
                    [&] { attention_wgmma_forward(out_wgmma, lse, qkv, B, T, C, NH, 0); }),
    };
    double difference = -1;  // relative to max |out|; -1: not compared
    if (wgmma_runs) {
        std::vector<floatX> a(BT * C), b(BT * C);
        CUDA_CHECK(cudaMemcpy(a.data(), out_mma, a.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(b.data(), out_wgmma, b.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
        double largest = 0, diff = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            const double x = to_float(a[i]), y = to_float(b[i]);
            if (!std::isfinite(x) || !std::isfinite(y)) return fail("a non-finite output at element " + std::to_string(i));
            largest = std::max(largest, std::abs(x));
            diff = std::max(diff, std::abs(x - y));
        }
        difference = largest > 0 ? diff / largest : diff;
    }
    const double flops = 2.0 * B * double(T) * T * C;  // FlashAttention's count of a causal forward
    std::printf("attention_bench: %s B=%d T=%d NH=%d hs=%d on %s, %.1f GFLOP (FlashAttention's count)\n", model.c_str(), B,
                T, NH, C / NH, device.c_str(), flops / 1e9);
    for (const Result& r : results) {
        if (r.ran) std::printf("  %-34s %9.3f ms  %9.4g TFLOP/s\n", r.kernel, r.ms, flops / (r.ms * 1e-3) / 1e12);
        else std::printf("  %-34s not run: wgmma needs an sm_90 GPU\n", r.kernel);
    }
    if (difference >= 0) std::printf("  outputs differ by at most %.3g of max |out|\n", difference);
    if (!json_path.empty()) {
        FILE* f = std::fopen(json_path.c_str(), "w");
        if (!f) return fail("--json " + json_path + ": cannot write");
        std::fprintf(f, "{\"model\": \"%s\", \"B\": %d, \"T\": %d, \"NH\": %d, \"hs\": %d, \"device\": \"%s\", \"flops\": %.6g,\n",
                     model.c_str(), B, T, NH, C / NH, device.c_str(), flops);
        std::fprintf(f, " \"relative_difference\": %.6g, \"kernels\": [", difference);
        for (size_t i = 0; i < 2; ++i) {
            const Result& r = results[i];
            std::fprintf(f, "%s{\"kernel\": \"%s\", \"ran\": %s, \"ms\": %.6g, \"tflops\": %.6g}", i ? ", " : "", r.kernel,
                         r.ran ? "true" : "false", r.ms, r.ran ? flops / (r.ms * 1e-3) / 1e12 : 0.0);
        }
        std::fprintf(f, "]}\n");
        if (std::fclose(f) != 0) return fail("--json " + json_path + ": cannot write");
    }
    // Same inputs, so the two must agree to bf16 rounding of the output (test_kernel_attention_wgmma's
    // bound against each other: twice 2^-8 + 1e-3).
    if (difference > 2 * (0x1p-8 + 1e-3)) return fail("the two kernels' outputs differ by " + std::to_string(difference));
    for (void* p : {(void*)qkv, (void*)out_mma, (void*)out_wgmma, (void*)lse}) CUDA_CHECK(cudaFree(p));
    return EXIT_SUCCESS;
}
