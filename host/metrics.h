// Step reporting: the console step line, model FLOPs utilization (MFU), and metrics.jsonl (one
// JSON object per line, flushed as written, so a crash loses at most the line being written; its
// JSON is written in host/metrics.cpp, the host library).
#pragma once

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>

// Training FLOPs per token, forward + backward (Kaplan et al. 2020, "Scaling Laws for Neural
// Language Models", section 2.1, as llm.c estimates MFU): 6N + 6*L*C*T, with N the parameter
// count (2N forward and 4N backward for the matmuls), and 6*L*C*T for attention scores and
// weighted values (2*L*T*C forward per token, tripled for the backward). N slightly overcounts
// (LayerNorm, biases, position embeddings); the causal mask's halving is not taken off.
inline double flops_per_token(int64_t num_parameters, int num_layers, int channels, int seq_len) {
    return 6.0 * double(num_parameters) + 6.0 * double(num_layers) * channels * seq_len;
}

// Dense (no sparsity) BF16 tensor-core peak FLOP/s of one GPU, from the vendor datasheets (the
// "BF16 Tensor Core" row; datasheets list twice these values "with sparsity"). Keyed by a
// substring of the CUDA device name, case-insensitive, first match wins: the specific entries come
// before the ones they contain (H100 PCIe before H100, L40S before L40 before L4).
// 0 when the device is unknown (and on the CPU build): MFU is then reported as n/a.
inline double peak_bf16_flops(const std::string& gpu_name) {
    struct Peak {
        const char* name_part;
        double flops;
    };
    static const Peak peaks[] = {
        {"H100 PCIe", 756e12},  // NVIDIA H100 datasheet: 1,513 TFLOPS with sparsity
        {"H100 NVL", 835e12},   // NVIDIA H100 datasheet (NVL): 1,671 with sparsity
        {"H200 NVL", 835e12},   // NVIDIA H200 datasheet (NVL): 1,671 with sparsity
        {"H100", 989e12},       // NVIDIA H100 datasheet (SXM): 1,979 with sparsity
        {"H200", 989e12},       // NVIDIA H200 datasheet (SXM): 1,979 with sparsity; GH200 too
        {"A100", 312e12},       // NVIDIA A100 datasheet (SXM and PCIe): 624 with sparsity
        {"L40S", 362e12},       // NVIDIA L40S datasheet: 733 with sparsity
        {"L40", 181e12},        // NVIDIA L40 datasheet: 362 with sparsity
        {"L4", 121e12},         // NVIDIA L4 datasheet: 242 with sparsity
        {"RTX 4090", 165e12},   // NVIDIA Ada (AD102) whitepaper: 165.2 with FP32 accumulate
        {"RTX 3090", 71e12},    // NVIDIA Ampere (GA102) whitepaper: 71 with FP32 accumulate
    };
    const auto lower = [](std::string s) {
        for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
        return s;
    };
    const std::string name = lower(gpu_name);
    for (const Peak& p : peaks)
        if (name.find(lower(p.name_part)) != std::string::npos) return p.flops;
    return 0.0;
}

// Achieved / peak FLOP/s over all devices; none when the peak is unknown.
inline std::optional<double> model_flops_utilization(double flops_per_token, double tokens_per_second,
                                                     double peak_flops_per_device, int num_devices) {
    if (!(peak_flops_per_device > 0) || num_devices < 1) return std::nullopt;
    return flops_per_token * tokens_per_second / (peak_flops_per_device * num_devices);
}

// 1234567 -> "1,234,567".
inline std::string with_thousands(int64_t value) {
    const uint64_t magnitude = value < 0 ? 0 - uint64_t(value) : uint64_t(value);
    const std::string digits = std::to_string(magnitude);
    std::string out;
    for (size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return value < 0 ? "-" + out : out;
}

// Seconds -> "42s", "6m12s", "3h05m", "2d07h" (two units at most); "n/a" when unknown (< 0, NaN).
inline std::string format_duration(double seconds) {
    if (!(seconds >= 0) || !std::isfinite(seconds)) return "n/a";
    const int64_t s = std::llround(seconds);
    char text[48];
    if (s < 60) std::snprintf(text, sizeof(text), "%llds", (long long)s);
    else if (s < 3600) std::snprintf(text, sizeof(text), "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
    else if (s < 86400) std::snprintf(text, sizeof(text), "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
    else std::snprintf(text, sizeof(text), "%lldd%02lldh", (long long)(s / 86400), (long long)(s % 86400 / 3600));
    return text;
}

struct StepReport {
    int64_t step = 0;         // optimizer steps completed, 1..total_steps (as printed and logged)
    int64_t total_steps = 0;
    float loss = 0, lr = 0, grad_norm = 0;
    double ms = 0;            // wall time of this step
    double tokens_per_second = 0;
    std::optional<double> mfu;  // fraction of the peak; none when unknown
    double eta_seconds = -1;    // < 0: unknown
    int64_t batch_tokens = 0;   // tokens in this step (all ranks)
};

// "step 12/500 | loss 4.1234 | lr 3.00e-04 | norm 1.23 | 812.3 ms | 64,512 tok/s | MFU 41.2% | ETA 6m12s"
inline std::string step_line(const StepReport& r) {
    char mfu[32] = "n/a";
    if (r.mfu) std::snprintf(mfu, sizeof(mfu), "%.1f%%", *r.mfu * 100.0);
    char line[256];
    std::snprintf(line, sizeof(line), "step %lld/%lld | loss %.4f | lr %.2e | norm %.2f | %.1f ms | %s tok/s | MFU %s | ETA %s",
                  (long long)r.step, (long long)r.total_steps, r.loss, r.lr, r.grad_norm, r.ms,
                  with_thousands(std::llround(std::max(0.0, r.tokens_per_second))).c_str(), mfu,
                  format_duration(r.eta_seconds).c_str());
    return line;
}

// Appends to <output_dir>/metrics.jsonl (a resumed run continues the file; readers keep the last
// record of a step). Records:
//   {"step", "loss", "lr", "grad_norm", "ms", "tokens_per_second", "mfu" (null when unknown), "batch_tokens"}
//   {"step", "val_loss", "val_tokens" (the valid targets it averaged over, every rank's)}   and   {"step", "sample"}
//   {"step", "hellaswag_accuracy", "hellaswag_correct", "hellaswag_examples"} (examples scored)
// Non-finite numbers are written as null (JSON has no NaN).
class MetricsWriter {
public:
    explicit MetricsWriter(const std::string& output_dir);
    ~MetricsWriter();
    MetricsWriter(const MetricsWriter&) = delete;
    MetricsWriter& operator=(const MetricsWriter&) = delete;

    const std::string& path() const { return path_; }

    void log_step(const StepReport& r);
    void log_val(int64_t step, float val_loss, long long val_tokens);
    void log_sample(int64_t step, const std::string& text);
    void log_hellaswag(int64_t step, long long correct, long long examples);

private:
    void write_line(const std::string& line);

    std::string path_;
    std::FILE* file_ = nullptr;
};

// What a run prints and logs: on rank 0 the step line and evaluation results on stdout, skipped
// steps on stderr, and each also in metrics.jsonl when there is an output dir; on other ranks nothing.
class RunLog {
public:
    RunLog(bool main_rank, const std::string& output_dir) : main_(main_rank) {
        if (main_ && !output_dir.empty()) metrics_.emplace(output_dir);
    }
    void step(const StepReport& r) {
        if (!main_) return;
        std::printf("%s\n", step_line(r).c_str());
        std::fflush(stdout);
        if (metrics_) metrics_->log_step(r);
    }
    void skipped(int64_t step, const std::string& why) {
        if (!main_) return;
        std::fprintf(stderr, "train_gpt: step %lld skipped: %s\n", (long long)step, why.c_str());
        std::fflush(stderr);
    }
    void val(int64_t step, double val_loss, long long val_tokens) {
        if (!main_) return;
        std::printf("val loss %.4f (%s tokens)\n", val_loss, with_thousands(val_tokens).c_str());
        if (metrics_) metrics_->log_val(step, float(val_loss), val_tokens);
    }
    void hellaswag(int64_t step, double accuracy, long long correct, long long total, long long skipped) {
        if (!main_) return;
        const std::string note = skipped ? ", " + std::to_string(skipped) + " skipped: longer than T" : "";
        std::printf("hellaswag %.4f (%lld/%lld)%s\n", accuracy, correct, total, note.c_str());
        std::fflush(stdout);
        if (metrics_) metrics_->log_hellaswag(step, correct, total);
    }
    void sample(int64_t step, const std::string& text) {
        if (!main_) return;
        std::printf("sample: %s\n", text.c_str());
        if (metrics_) metrics_->log_sample(step, text);
    }
    // After the last step's evaluation: the command that draws metrics.jsonl (scripts/plot_metrics.py).
    void finished() {
        if (!main_ || !metrics_) return;
        std::printf("plot: python3 scripts/plot_metrics.py %s\n", metrics_->path().c_str());
        std::fflush(stdout);
    }

private:
    bool main_;
    std::optional<MetricsWriter> metrics_;
};
