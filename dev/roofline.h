// Roofline estimates of recorded launches (dev/launch_record.h) on one H100 SXM, and the
// tables that the roofline tool (dev/roofline.cu) and `train_gpt --profile-step` print.
//
// Per launch: time = max(FLOPs / (e_c * P_c), bytes / (e_m * P_m)) + overhead, with the peak P and
// the efficiency e of the unit that executes it. Peaks: NVIDIA H100 SXM5 datasheet. Efficiencies
// are ASSUMPTIONS (the reasons beside each); --profile-step on a GPU measures what they should be.
//   unit       P_c                      e_c   P_m                  e_m  overhead
//   cublasLt   989 TFLOP/s BF16 dense   0.75  3.35 TB/s HBM3       0.80 3 us
//     cuBLAS reaches ~70-80% of the dense BF16 peak on large GEMMs on H100 (NVIDIA's published
//     cuBLAS benchmarks); GPT-2's GEMMs are large (k >= 768, n = B*T >= 16K): 0.75.
//   tensor     989 TFLOP/s BF16 dense   0.35  3.35 TB/s            0.80 3 us
//     mma.sync flash attention (FlashAttention-2's design) runs at ~35% of the H100's BF16 peak
//     (Shah et al. 2024, "FlashAttention-3", section 1); ours is built the same way.
//   simt (attention kernels) 67 TFLOP/s FP32 (non-tensor) 0.25, 3.35 TB/s 0.80, 3 us
//     the SIMT attention's inner loops do two shared-memory float4 loads per four FMAs, so shared
//     memory bandwidth, not the FMA pipes, bounds them: a quarter of the FP32 peak.
//   simt (the rest)          67 TFLOP/s FP32 0.50, 3.35 TB/s 0.80, 3 us
//     elementwise and reduction kernels stream memory; vectorized streaming kernels reach ~80-90%
//     of HBM bandwidth in STREAM-like tests. 3 us: the gap between dependent launches on one
//     stream without CUDA graphs.
//   nccl       450 GB/s per direction (NVLink 4: 18 links x 25 GB/s)  e = 0.80  10 us per call
//     bytes are NCCL's bus bytes per rank; nccl-tests reports ~360-480 GB/s bus bandwidth on
//     8x H100 SXM: 0.80 -> 360 GB/s. Collectives on the communication stream overlap compute.
//   memset, device copy: HBM at 0.80, 3 us.   pcie: 64 GB/s (Gen5 x16) at 0.40 (pageable host
//     memory), 10 us.
// Step time: the recorded work replayed on its streams in issue order, each stream serial, with
// the event dependencies the emulator records (cudaEventRecord / cudaStreamWaitEvent; the nvcc
// build records none, so there streams are treated as independent); the step ends when the last
// stream does. MFU follows llm.c (6N + 6LCT FLOPs per token, host/metrics.h) and PaLM (Chowdhery
// et al. 2022, appendix B: 6N + 12LCT).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <utility>
#include <map>
#include <string>
#include <vector>

#include "host/metrics.h"
#include "kernels/cuda_common.h"

struct Roof {
    double peak_flops, flops_efficiency, peak_bytes, bytes_efficiency, overhead_s;
};

struct H100Model {
    static constexpr double kTensorFlops = 989e12, kCudaCoreFlops = 67e12, kHbmBytes = 3.35e12;
    static constexpr double kNvlinkBytes = 450e9, kPcieBytes = 64e9;

    static Roof roof(const LaunchRecord& r) {
        switch (r.kind) {
            case WorkKind::matmul: return {kTensorFlops, 0.75, kHbmBytes, 0.80, 3e-6};
            case WorkKind::tensor_cores: return {kTensorFlops, 0.35, kHbmBytes, 0.80, 3e-6};
            case WorkKind::cuda_cores:
                return {kCudaCoreFlops, r.name.find("attention") != std::string::npos ? 0.25 : 0.50, kHbmBytes, 0.80,
                        3e-6};
            case WorkKind::communication: return {0, 1, kNvlinkBytes, 0.80, 10e-6};
            case WorkKind::memset:
            case WorkKind::copy_device: return {0, 1, kHbmBytes, 0.80, 3e-6};
            case WorkKind::copy_host: return {0, 1, kPcieBytes, 0.40, 10e-6};
            case WorkKind::event_record:
            case WorkKind::stream_wait: return {0, 1, 1, 1, 0};
        }
        return {0, 1, 1, 1, 0};
    }
    static std::string assumptions() {
        return "H100 SXM roofline: cublasLt 989 TFLOP/s x 0.75; tensor-core kernels 989 x 0.35; SIMT attention 67 TFLOP/s "
               "FP32 x 0.25, other SIMT 67 x 0.50; HBM 3.35 TB/s x 0.80; NVLink 450 GB/s/direction x 0.80 (NCCL bus "
               "bytes); PCIe 64 GB/s x 0.40; +3 us per launch, +10 us per collective or host copy (dev/roofline.h)";
    }
};

struct RooflineTime {
    double seconds = 0, compute_s = 0, memory_s = 0;
};

inline RooflineTime roofline_time(const LaunchRecord& r) {
    const Roof roof = H100Model::roof(r);
    RooflineTime t;
    if (r.kind == WorkKind::event_record || r.kind == WorkKind::stream_wait) return t;
    t.compute_s = roof.peak_flops > 0 ? r.flops / (roof.peak_flops * roof.flops_efficiency) : 0.0;
    t.memory_s = r.bytes / (roof.peak_bytes * roof.bytes_efficiency);
    t.seconds = std::max(t.compute_s, t.memory_s) + roof.overhead_s;
    return t;
}

inline bool is_sync_record(const LaunchRecord& r) {
    return r.kind == WorkKind::event_record || r.kind == WorkKind::stream_wait;
}

// ---------------------------------------------------------------------------------------------
// The step replayed on its streams.

struct StepTimeline {
    double step_s = 0;           // when the last stream finishes
    double busiest_stream_s = 0;  // the busiest stream's own work (the compute stream in training)
    double other_streams_s = 0;  // work on the other streams (communication)
    double exposed_s = 0;        // step_s - busiest_stream_s: time the other streams add
    bool has_dependencies = false;
};

inline StepTimeline replay_streams(const std::vector<LaunchRecord>& records) {
    std::map<cudaStream_t, double> clock, busy;
    std::map<const void*, double> event_time;
    StepTimeline t;
    for (const LaunchRecord& r : records) {
        double& c = clock[r.stream];
        if (r.kind == WorkKind::event_record) {
            event_time[r.event] = c;
            t.has_dependencies = true;
        } else if (r.kind == WorkKind::stream_wait) {
            auto it = event_time.find(r.event);
            if (it != event_time.end()) c = std::max(c, it->second);
        } else {
            const double s = roofline_time(r).seconds;
            c += s;
            busy[r.stream] += s;
        }
    }
    double total_busy = 0;
    for (auto& [stream, b] : busy) {
        total_busy += b;
        t.busiest_stream_s = std::max(t.busiest_stream_s, b);
    }
    for (auto& [stream, c] : clock) t.step_s = std::max(t.step_s, c);
    t.other_streams_s = total_busy - t.busiest_stream_s;
    t.exposed_s = t.step_s - t.busiest_stream_s;
    return t;
}

// ---------------------------------------------------------------------------------------------
// The per-kernel table.

struct KernelRow {
    std::string name;
    WorkKind kind;
    long long launches = 0;
    double flops = 0, bytes = 0, estimate_s = 0, compute_s = 0, memory_s = 0;
    double measured_s = 0;
    bool measured = false;
};

// Rows aggregated by name, longest estimate first (ties by name).
inline std::vector<KernelRow> kernel_rows(const std::vector<LaunchRecord>& records) {
    std::map<std::string, KernelRow> by_name;
    for (const LaunchRecord& r : records) {
        if (is_sync_record(r)) continue;
        KernelRow& row = by_name[r.name];
        row.name = r.name;
        row.kind = r.kind;
        ++row.launches;
        row.flops += r.flops;
        row.bytes += r.bytes;
        const RooflineTime t = roofline_time(r);
        row.estimate_s += t.seconds;
        row.compute_s += t.compute_s;
        row.memory_s += t.memory_s;
        if (r.ms >= 0) {
            row.measured = true;
            row.measured_s += r.ms / 1e3;
        }
    }
    std::vector<KernelRow> rows;
    for (auto& [name, row] : by_name) rows.push_back(row);
    std::stable_sort(rows.begin(), rows.end(), [](const KernelRow& a, const KernelRow& b) { return a.estimate_s > b.estimate_s; });
    return rows;
}

inline const char* bound_of(const KernelRow& row) {
    if (row.kind == WorkKind::communication) return "link";
    if (row.kind == WorkKind::copy_host) return "pcie";
    const double roofline = std::max(row.compute_s, row.memory_s);
    if (roofline < row.estimate_s - roofline) return "launch";  // the per-launch overhead dominates
    return row.compute_s >= row.memory_s ? "compute" : "memory";
}

// One line per kernel name, then the totals. `measured_label` names the measured columns' clock
// ("GPU" or "emulator"); measured columns appear when any record was timed.
inline std::string kernel_table(const std::vector<LaunchRecord>& records, const char* measured_label = "GPU") {
    const std::vector<KernelRow> rows = kernel_rows(records);
    const bool measured = std::any_of(rows.begin(), rows.end(), [](const KernelRow& r) { return r.measured; });
    std::string out;
    char line[512];
    std::snprintf(line, sizeof line, "%-46s %-8s %8s %11s %10s %8s %11s %-7s", "kernel", "unit", "launches", "GFLOP",
                  "GB", "FLOP/B", "est ms", "bound");
    out += line;
    if (measured) {
        std::snprintf(line, sizeof line, " %11s %9s %9s %8s", (std::string(measured_label) + " ms").c_str(), "TFLOP/s",
                      "GB/s", "est/meas");
        out += line;
    }
    out += "\n";
    KernelRow total;
    total.name = "total";
    for (const KernelRow& r : rows) {
        const std::string name = r.name.size() > 46 ? r.name.substr(0, 43) + "..." : r.name;
        const double intensity = r.bytes > 0 ? r.flops / r.bytes : 0.0;
        std::snprintf(line, sizeof line, "%-46s %-8s %8lld %11.3f %10.3f %8.1f %11.3f %-7s", name.c_str(),
                      work_kind_name(r.kind), r.launches, r.flops / 1e9, r.bytes / 1e9, intensity, r.estimate_s * 1e3,
                      bound_of(r));
        out += line;
        if (measured && r.measured && r.measured_s > 0) {
            std::snprintf(line, sizeof line, " %11.3f %9.2f %9.1f %8.2f", r.measured_s * 1e3, r.flops / r.measured_s / 1e12,
                          r.bytes / r.measured_s / 1e9, r.estimate_s / r.measured_s);
            out += line;
        }
        out += "\n";
        total.launches += r.launches;
        total.flops += r.flops;
        total.bytes += r.bytes;
        total.estimate_s += r.estimate_s;
        total.measured_s += r.measured_s;
    }
    std::snprintf(line, sizeof line, "%-46s %-8s %8lld %11.3f %10.3f %8.1f %11.3f %-7s", "total (all streams)", "",
                  total.launches, total.flops / 1e9, total.bytes / 1e9, total.bytes > 0 ? total.flops / total.bytes : 0.0,
                  total.estimate_s * 1e3, "");
    out += line;
    if (measured && total.measured_s > 0) {
        std::snprintf(line, sizeof line, " %11.3f %9.2f %9.1f %8.2f", total.measured_s * 1e3,
                      total.flops / total.measured_s / 1e12, total.bytes / total.measured_s / 1e9,
                      total.estimate_s / total.measured_s);
        out += line;
    }
    return out + "\n";
}

// ---------------------------------------------------------------------------------------------
// Throughput and MFU of a step.

// PaLM's count (Chowdhery et al. 2022, appendix B): 6N + 12LCT per token. Its attention term
// counts both attention products (QK^T and AV: 2 x 2LCT forward, tripled for the backward),
// where Kaplan et al.'s (llm.c's 6LCT) counts the logits only; neither halves for the causal mask.
inline double flops_per_token_palm(int64_t num_parameters, int num_layers, int channels, int seq_len) {
    return 6.0 * double(num_parameters) + 12.0 * double(num_layers) * channels * seq_len;
}

struct StepThroughput {
    double step_s, tokens_per_step, tokens_per_s, mfu_llmc, mfu_palm;
};

// tokens_per_step: over all `world` ranks; MFU against the H100's BF16 dense peak per GPU.
inline StepThroughput step_throughput(double step_s, double tokens_per_step, int world, int64_t num_parameters,
                                      int num_layers, int channels, int seq_len, double peak_flops = H100Model::kTensorFlops) {
    StepThroughput t;
    t.step_s = step_s;
    t.tokens_per_step = tokens_per_step;
    t.tokens_per_s = tokens_per_step / step_s;
    const double per_gpu = peak_flops * world;
    t.mfu_llmc = flops_per_token(num_parameters, num_layers, channels, seq_len) * t.tokens_per_s / per_gpu;
    t.mfu_palm = flops_per_token_palm(num_parameters, num_layers, channels, seq_len) * t.tokens_per_s / per_gpu;
    return t;
}

inline std::string throughput_line(const char* label, const StepThroughput& t) {
    char line[256];
    std::snprintf(line, sizeof line, "%s: %.3f s/step, %s tokens/step, %s tokens/s, MFU %.1f%% (llm.c 6N+6LCT), %.1f%% (PaLM 6N+12LCT)\n",
                  label, t.step_s, with_thousands(std::llround(t.tokens_per_step)).c_str(),
                  with_thousands(std::llround(t.tokens_per_s)).c_str(), 100 * t.mfu_llmc, 100 * t.mfu_palm);
    return line;
}

// ---------------------------------------------------------------------------------------------
// `train_gpt --profile-step`: the timed records of one step beside their H100 roofline estimate.

// Runs `step` once to warm up (cuBLASLt heuristics, caches, clocks), then once more with every launch
// recorded and timed: that step's wall time, and its records.
inline std::pair<double, std::vector<LaunchRecord>> record_one_step(const std::function<void()>& step) {
    step();
    launch_record::start(/*timing=*/true);
    const auto t0 = std::chrono::steady_clock::now();
    step();
    CUDA_CHECK(cudaDeviceSynchronize());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return {seconds, launch_record::stop()};
}

inline std::string profile_report(const std::vector<LaunchRecord>& records, double wall_s, double tokens_per_step,
                                  int world, int64_t num_parameters, int num_layers, int channels, int seq_len,
                                  const std::string& device_name, double device_peak_flops) {
#ifdef __CUDACC__
    const char* clock = "GPU", *how = "each launch timed with CUDA events on its stream";
#else
    const char* clock = "emu", *how = "each launch timed by the CPU emulator's wall clock: emulator time, not GPU time";
#endif
    std::string out = "profile: one training step of rank 0 on " + device_name + " after a warm-up step; " + how + "\n";
    out += H100Model::assumptions() + "\n\n" + kernel_table(records, clock) + "\n";
    const StepTimeline estimate = replay_streams(records);
    char line[256];
    const StepThroughput measured =
        step_throughput(wall_s, tokens_per_step, world, num_parameters, num_layers, channels, seq_len,
                        device_peak_flops > 0 ? device_peak_flops : H100Model::kTensorFlops);
    if (device_peak_flops > 0) {
        out += throughput_line("measured (wall clock, with the per-launch events)", measured);
    } else {
        std::snprintf(line, sizeof line, "measured (wall clock): %.3f s/step, %s tokens/s, MFU n/a (no BF16 peak known for this device)\n",
                      wall_s, with_thousands(std::llround(measured.tokens_per_s)).c_str());
        out += line;
    }
    out += throughput_line("H100 SXM roofline estimate of the same launches",
                           step_throughput(estimate.step_s, tokens_per_step, world, num_parameters, num_layers, channels,
                                           seq_len));
    return out;
}
