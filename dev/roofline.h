// Roofline estimates of recorded launches (dev/launch_record.h) on one H100 SXM, and the
// tables that the roofline tool (dev/roofline.cu) and `train_gpt --profile-step` print.
//
// Per launch: time = max(FLOPs / (e_c * P_c), bytes / (e_m * P_m)) + overhead, with the peak P of
// the unit that executes it and an efficiency e taken, where it can be, from the launch's own shape
// and from published or measured numbers (H100Model below names the source of each):
//   cublasLt  989 TFLOP/s BF16 dense: time = FLOPs / (989e12 * f * waves(m, n, k)) + a * bytes / 3.35 TB/s.
//     waves is the share of the GPU's 132 SMs that 128 x 256 output tiles keep busy over the waves a
//     GEMM takes (one tile more than a wave costs a whole wave), k split as cuBLAS splits it where that
//     fills the waves better (at least 1024 of k a split); a = 0.55 is the share of the GEMM's HBM
//     traffic its main loop does not hide (first loads, epilogue stores), fitted to the 15 GEMM shapes
//     of the first H100 profile (d12, B=64; docs/gpu_check_2026-11-27_h100/profile.json); f so that an
//     8192^3 product runs at the 798 TFLOP/s measured on this workplace's H100 SXM (device tool,
//     2026-11-13): f = 0.85.
//   tensor-core attention: our kernels' rates measured on the first H100 profile (d12, head size
//     64, T = 1024): forward 226 TFLOP/s, backward 204, on the FLOPs they execute (their backward
//     runs 7 products where FlashAttention-2 runs 5, charged in full; the fused backward's 5 at the
//     same rate). FlashAttention-2's published H100 SXM5 figures at that shape (Shah et al. 2024,
//     "FlashAttention-3", figures 5-6: causal forward 229, backward 238) stand beside them. llm.c's
//     configuration is modelled with cuDNN's figures from the same plots (288 and 348), the
//     attention llm.c ran, on FlashAttention's FLOP count. Those rates were measured on grids of
//     thousands of blocks; a kernel whose blocks all do the same work and fill few waves (the fused
//     backward: one block per (b, h), one an SM) gets them times its waves' use of the SMs
//     (blocks / (waves x 132 x blocks an SM), the last wave charged whole), and so does its memory.
//   simt (attention kernels) 67 TFLOP/s FP32 (non-tensor) x 0.25: two shared-memory float4 loads
//     per four FMAs, so shared memory bandwidth, not the FMA pipes, bounds them.
//   simt (the rest)  67 TFLOP/s x 0.50; memory 3.35 TB/s HBM3 x 0.80 (STREAM-like kernels reach
//     80-90%) x min(1, blocks / 132): a grid of fewer blocks than SMs leaves SMs, and their share
//     of the memory parallelism, idle.
//   overhead 3 us per launch: the gap between dependent launches on one stream without CUDA graphs.
//   nccl  450 GB/s per direction (NVLink 4: 18 links x 25 GB/s) x 0.80, 10 us per call: bytes are
//     NCCL's bus bytes per rank; nccl-tests reports ~360-480 GB/s bus bandwidth on 8x H100 SXM.
//     Collectives on the communication stream overlap compute.
//   memset, device copy: HBM at 0.80, 3 us.   pcie: 64 GB/s (Gen5 x16) at 0.40 (pageable host
//     memory), 10 us.
// Step time: the recorded work replayed on its streams in issue order, each stream serial, with
// the event dependencies the emulator records (cudaEventRecord / cudaStreamWaitEvent; the nvcc
// build records none, so there streams are treated as independent); the step ends when the last
// stream does; then x (1 + u) for what a roofline does not see (kernels below their roofs, tails,
// launch gaps past 3 us, the host). u is a property of an implementation, so each has its own,
// fitted on its own measured step:
//   ours   u = 0.117: the d12 B=64 step measured on one H100 (136.75 ms, CUDA graphs, median of steps
//          3-20; docs/gpu_check_2026-11-27_h100/train.json) over this model's replay of that step's
//          profiled launches (profile.json). test_roofline refits it from those files, and holds the
//          d48 B=8 step measured on the same GPU (190.9 ms) within 10%. No run of ours on 8 GPUs has
//          been measured: what NCCL adds there is only what the link model says.
//   llm.c  u = 0.245: its GPT-2 1.5B run (8x H100 SXM, B=16, T=1024, 1,048,576 tokens: its only
//          published end-to-end H100 figure, 2.75 s per step), modelled as our launches with the
//          attention llm.c ran; test_roofline holds it within 5%.
// MFU follows llm.c (6N + 6LCT FLOPs per token, host/metrics.h) and PaLM (Chowdhery et al. 2022,
// appendix B: 6N + 12LCT).
#pragma once

#include <algorithm>
#include <cmath>
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
    double unhidden_bytes_s = 0;  // time the launch's memory traffic adds to its compute (GEMMs)
};

// Attention throughput: FLOPs per second of the forward and backward attention kernels, and the
// factor that turns the FLOPs our backward kernels execute into the count the rates are quoted on.
struct AttentionRates {
    double forward_flops, backward_flops, backward_flops_scale;
    double fused_backward_flops = 0;  // the fused backward kernel's (executed FLOPs); 0: backward_flops
};

struct H100Model {
    static constexpr double kTensorFlops = 989e12, kCudaCoreFlops = 67e12, kHbmBytes = 3.35e12;
    static constexpr double kNvlinkBytes = 450e9, kPcieBytes = 64e9;
    static constexpr int kSms = 132;
    // cuBLASLt GEMMs: output tiles of 128 x 256 (Hopper's large BF16 cuBLAS kernels), one per SM at a
    // time; k split into up to 64 pieces of at least 1024 where the output alone leaves SMs idle (the
    // first profile's 768 x 768 weight gradient, k = 65,536, ran at 629 TFLOP/s where one wave of its 18
    // tiles would give 112).
    static constexpr int kGemmTileM = 128, kGemmTileN = 256, kGemmMinSplitK = 1024, kGemmMaxSplits = 64;
    // Fitted: the share of a GEMM's HBM bytes (A, B, D, bias, aux: gemm_cost) its main loop does not
    // hide, least squares in log time over the 15 shapes of the first H100 profile (d12, B=64; within
    // -19%..+16% of each measured time, 1.6% over their sum; the wave model alone was off 0.6x..5.6x).
    static constexpr double kGemmUnhiddenBytes = 0.55;
    // Measured: an 8192 x 8192 x 8192 BF16 product through PyTorch (cuBLAS) on random data, on this
    // workplace's H100 SXM (the device tool's KINDS.md, 2026-11-13): 798 TFLOP/s.
    static constexpr double kMeasuredGemmFlops = 798e12;
    static constexpr int kMeasuredGemmSize = 8192;
    // Measured, our tensor-core kernels on the first H100 profile (d12, B=64, head size 64, T = 1024;
    // profile.json): the forward 1314.26 GFLOP in 5.814 ms, 226 TFLOP/s; dQ and dK/dV together
    // 4599.91 GFLOP in 22.587 ms, 204, on the FLOPs they execute (7 backward products where
    // FlashAttention-2 runs 5: charged in full). The fused backward (5 products, not yet measured)
    // is charged the split kernels' rate per executed FLOP: its own field is unset until a GPU run
    // measures it (`roofline --fit` prints the rate a run's fused_backward profile gives).
    static constexpr AttentionRates kOurAttention{226.05e12, 203.65e12, 1.0};
    // Published, H100 SXM5, head size 64, T = 1k (Shah et al. 2024, "FlashAttention-3", figure 5:
    // causal forward; figure 6: backward): FlashAttention-2's, the class our kernels are built in
    // (on their executed FLOPs, as the roofline charged ours before they were measured); cuDNN's for
    // llm.c's run (it used cuDNN's attention): on FlashAttention's count, backward = 2.5 x forward,
    // where our kernels execute 3.5 x (dK/dV 4 products, dQ 3, forward 2).
    static constexpr AttentionRates kFlashAttention2{229e12, 238e12, 1.0};
    static constexpr AttentionRates kCudnnAttention{288e12, 348e12, 2.5 / 3.5};
    static constexpr double kHbmEfficiency = 0.80;
    // Fitted: the step time's share a roofline does not see (top of this file), one per implementation.
    static constexpr double kUnmodeledShareOurs = 0.117, kUnmodeledShareLlmc = 0.245;
    // What they are fitted on: our d12 B=64 step on one H100 (docs/gpu_check_2026-11-27_h100/train.json,
    // graphs, median of steps 3-20) and llm.c's published GPT-2 1.5B step on 8.
    static constexpr double kMeasuredD12StepSeconds = 0.13675, kLlmcStepSeconds = 2.75;

    // The share of the SMs that a GEMM's output tiles, k split s ways, keep busy over their waves:
    // m*n*s over the waves' capacity of whole tiles, for the better orientation and split.
    static double gemm_wave_utilization(int m, int n, int k) {
        const int max_splits = std::clamp(k / kGemmMinSplitK, 1, kGemmMaxSplits);
        double best = 0;
        for (const auto& [rows, cols] : {std::pair{m, n}, std::pair{n, m}}) {
            const double tiles = std::ceil(double(rows) / kGemmTileM) * std::ceil(double(cols) / kGemmTileN);
            for (int s = 1; s <= max_splits; ++s)
                best = std::max(best, double(rows) * cols * s / (std::ceil(tiles * s / kSms) * kSms * kGemmTileM * kGemmTileN));
        }
        return best;
    }
    // The time a GEMM's HBM traffic adds to its main loop's, `share` of it unhidden
    // (kGemmUnhiddenBytes, or a candidate of dev/roofline_fit.h's fit).
    static double gemm_unhidden_seconds(double bytes, double share = kGemmUnhiddenBytes) { return share * bytes / kHbmBytes; }
    // The fraction of the BF16 peak a large GEMM's main loop reaches: the measured product's, its own
    // wave quantization and unhidden traffic (A, B and D in BF16) taken out.
    static double gemm_peak_fraction(double unhidden_share = kGemmUnhiddenBytes) {
        const double n = kMeasuredGemmSize, flops = 2 * n * n * n, bytes = 3 * n * n * 2;
        const double main_loop_s = flops / kMeasuredGemmFlops - gemm_unhidden_seconds(bytes, unhidden_share);
        return flops / main_loop_s / kTensorFlops /
               gemm_wave_utilization(kMeasuredGemmSize, kMeasuredGemmSize, kMeasuredGemmSize);
    }
    // The fraction of the BF16 peak the main loop of a GEMM with this shape runs at.
    static double gemm_efficiency(int m, int n, int k, double unhidden_share = kGemmUnhiddenBytes) {
        return gemm_peak_fraction(unhidden_share) * gemm_wave_utilization(m, n, k);
    }
    // The share of the SMs a grid of `blocks` occupies (memory parallelism follows the busy SMs).
    static double sm_share(const dim3& grid) {
        const double blocks = double(grid.x) * grid.y * grid.z;
        return blocks > 0 ? std::min(1.0, blocks / kSms) : 1.0;
    }

    // The share of the SMs' block slots a grid of equal blocks keeps busy over its whole waves (`per_sm`
    // resident on an SM): the last wave, however few blocks it has, lasts as long as the others.
    static double equal_blocks_wave_use(const dim3& grid, int per_sm) {
        const double blocks = double(grid.x) * grid.y * grid.z, slots = double(kSms) * per_sm;
        return blocks > 0 ? blocks / (std::ceil(blocks / slots) * slots) : 1.0;
    }
    // The share of the GPU a launch keeps busy: whole waves for a grid of equal blocks, else the SMs its
    // blocks reach.
    static double busy_share(const LaunchRecord& r) {
        return r.equal_blocks_per_sm > 0 ? equal_blocks_wave_use(r.grid, r.equal_blocks_per_sm) : sm_share(r.grid);
    }
    // What a compute rate measured on grids of thousands of blocks is worth to this launch: its whole
    // waves' busy share for a grid of equal blocks, all of it otherwise.
    static double compute_wave_use(const LaunchRecord& r) { return r.equal_blocks_per_sm > 0 ? busy_share(r) : 1.0; }

    // Which tensor-core attention kernels the forward rate applies to (the rest are backward).
    static bool is_attention_forward(const std::string& kernel) { return kernel.find("forward") != std::string::npos; }
    // The fused backward kernel (--attention-backward fused), which has its own rate where one is known.
    static bool is_fused_attention_backward(const std::string& kernel) {
        return kernel.find("backward_fused") != std::string::npos;
    }
    static double backward_rate(const AttentionRates& a, const std::string& kernel) {
        return is_fused_attention_backward(kernel) && a.fused_backward_flops > 0 ? a.fused_backward_flops : a.backward_flops;
    }

    static Roof roof(const LaunchRecord& r, const AttentionRates& attention = kOurAttention,
                     double gemm_unhidden_share = kGemmUnhiddenBytes) {
        switch (r.kind) {
            case WorkKind::matmul: {
                const double s = gemm_unhidden_share;
                const double e = r.gemm_m > 0 ? gemm_efficiency(r.gemm_m, r.gemm_n, r.gemm_k, s) : gemm_peak_fraction(s);
                return {kTensorFlops, e, kHbmBytes, kHbmEfficiency, 3e-6, gemm_unhidden_seconds(r.bytes, s)};
            }
            case WorkKind::tensor_cores: {
                const bool forward = is_attention_forward(r.name);
                // time = executed FLOPs x scale / rate: the efficiency against the peak is rate / scale.
                const double e = forward ? attention.forward_flops / kTensorFlops
                                         : backward_rate(attention, r.name) / attention.backward_flops_scale / kTensorFlops;
                return {kTensorFlops, e * compute_wave_use(r), kHbmBytes, kHbmEfficiency * busy_share(r), 3e-6};
            }
            case WorkKind::cuda_cores: {
                const double e = r.name.find("attention") != std::string::npos ? 0.25 : 0.50;
                return {kCudaCoreFlops, e * compute_wave_use(r), kHbmBytes, kHbmEfficiency * busy_share(r), 3e-6};
            }
            case WorkKind::communication: return {0, 1, kNvlinkBytes, 0.80, 10e-6};
            case WorkKind::memset:
            case WorkKind::copy_device: return {0, 1, kHbmBytes, kHbmEfficiency, 3e-6};
            case WorkKind::copy_host: return {0, 1, kPcieBytes, 0.40, 10e-6};
            case WorkKind::event_record:
            case WorkKind::stream_wait: return {0, 1, 1, 1, 0};
        }
        return {0, 1, 1, 1, 0};
    }
    static std::string assumptions() {
        char line[1000];
        std::snprintf(line, sizeof line,
                      "H100 SXM roofline: cublasLt %.0f TFLOP/s x %.2f x wave use of %dx%d tiles on %d SMs, k split where "
                      "that fills them (%d^3 at the measured %.0f TFLOP/s), + %.2f of its bytes at HBM speed (fitted to the "
                      "first H100 profile's GEMMs); tensor-core attention at our kernels' measured %.0f (forward) / "
                      "%.0f (backward) TFLOP/s executed (FlashAttention-2's published %.0f / %.0f); SIMT attention %.0f "
                      "TFLOP/s FP32 x 0.25, other SIMT %.0f x 0.50; HBM %.2f TB/s x %.2f x min(1, blocks/%d), a grid of equal blocks in whole waves; NVLink %.0f GB/s/direction x 0.80 (NCCL bus bytes); PCIe %.0f GB/s "
                      "x 0.40; +3 us per launch, +10 us per collective or host copy; step x %.3f for what a roofline misses "
                      "(fitted to our d12 step measured on one H100; llm.c's x %.3f to its 2.75 s; dev/roofline.h)",
                      kTensorFlops / 1e12, gemm_peak_fraction(), kGemmTileM, kGemmTileN, kSms, kMeasuredGemmSize,
                      kMeasuredGemmFlops / 1e12, kGemmUnhiddenBytes, kOurAttention.forward_flops / 1e12,
                      kOurAttention.backward_flops / 1e12, kFlashAttention2.forward_flops / 1e12,
                      kFlashAttention2.backward_flops / 1e12, kCudaCoreFlops / 1e12, kCudaCoreFlops / 1e12, kHbmBytes / 1e12,
                      kHbmEfficiency, kSms, kNvlinkBytes / 1e9, kPcieBytes / 1e9, 1 + kUnmodeledShareOurs,
                      1 + kUnmodeledShareLlmc);
        return line;
    }
};

struct RooflineTime {
    double seconds = 0, compute_s = 0, memory_s = 0;
};

inline RooflineTime roofline_time(const LaunchRecord& r, const AttentionRates& attention = H100Model::kOurAttention,
                                  double gemm_unhidden_share = H100Model::kGemmUnhiddenBytes) {
    const Roof roof = H100Model::roof(r, attention, gemm_unhidden_share);
    RooflineTime t;
    if (r.kind == WorkKind::event_record || r.kind == WorkKind::stream_wait) return t;
    t.compute_s = (roof.peak_flops > 0 ? r.flops / (roof.peak_flops * roof.flops_efficiency) : 0.0) + roof.unhidden_bytes_s;
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
    // The step's estimate: the replay, and the share no roofline sees (ours by default; llm.c's for
    // its configuration).
    double estimate_s(double unmodeled_share = H100Model::kUnmodeledShareOurs) const {
        return step_s * (1 + unmodeled_share);
    }
};

inline StepTimeline replay_streams(const std::vector<LaunchRecord>& records,
                                   const AttentionRates& attention = H100Model::kOurAttention) {
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
            const double s = roofline_time(r, attention).seconds;
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
// What an MFU target asks of a step.
//
// MFU is inverse to the step time, so a target fixes the step, and the replayed work behind it is
// that step over the estimate's multipliers (1 + u; a pipeline's 1 / (1 - bubble)). The replay is the
// busiest stream's work, split here by family, plus what the other streams add past its end. The
// GEMMs' part is cuBLAS's own speed (the calibrated rates are cuBLAS's measured ones, and PyTorch's
// GEMMs at the same shapes took the same time), so what they leave of the target's work is the
// budget of everything we write.

struct StepFamilies {
    double gemm_s = 0;       // cuBLASLt matmuls
    double attention_s = 0;  // our attention kernels (tensor-core or SIMT, the row-dot included)
    double kernels_s = 0;    // our other kernels
    double rest_s = 0;       // the busiest stream's memsets, copies and collectives; the other streams' exposed time
    double total_s() const { return gemm_s + attention_s + kernels_s + rest_s; }
};

inline bool is_attention_kernel(const LaunchRecord& r) {
    return (r.kind == WorkKind::tensor_cores || r.kind == WorkKind::cuda_cores) && r.name.rfind("attention", 0) == 0;
}

// The replayed step (replay_streams' step_s) by family.
inline StepFamilies step_families(const std::vector<LaunchRecord>& records,
                                  const AttentionRates& attention = H100Model::kOurAttention) {
    std::map<cudaStream_t, StepFamilies> per_stream;
    for (const LaunchRecord& r : records) {
        if (is_sync_record(r)) continue;
        StepFamilies& f = per_stream[r.stream];
        double& family = r.kind == WorkKind::matmul ? f.gemm_s
                         : is_attention_kernel(r)   ? f.attention_s
                         : r.kind == WorkKind::cuda_cores || r.kind == WorkKind::tensor_cores ? f.kernels_s
                                                                                              : f.rest_s;
        family += roofline_time(r, attention).seconds;
    }
    StepFamilies busiest;
    for (const auto& [stream, f] : per_stream)
        if (f.total_s() > busiest.total_s()) busiest = f;
    busiest.rest_s += replay_streams(records, attention).exposed_s;
    return busiest;
}

// Attention forward and backward on FlashAttention's count, the one published attention rates (and
// issue 16's 200 TFLOP/s) are quoted on: 4 B T^2 C L FLOPs a forward, halved by the causal mask, and
// 2.5 times that for the backward (its 5 products to the forward's 2). Our kernels record what they
// execute, which is more: the diagonal's live blocks, and the split backward's 7 products.
inline double flash_attention_flops(double B, double T, double C, double L) { return 3.5 * 2 * B * T * T * C * L; }
// The line the roofline tool prints: a step's `flops` on that count over our attention kernels' time.
inline std::string attention_rate_line(const StepFamilies& f, double flops) {
    char line[300];
    std::snprintf(line, sizeof line,
                  "attention forward + backward on FlashAttention's count (2 B T^2 C L FLOPs a causal forward, x 3.5 "
                  "with the backward): %.2f TFLOP a step in %.2f ms of our attention kernels: %.1f TFLOP/s\n",
                  flops / 1e12, f.attention_s * 1e3, flops / f.attention_s / 1e12);
    return line;
}

struct TargetBudget {
    double step_s = 0;              // the step that reaches the target
    double work_s = 0;              // the replayed work behind it
    double gemm_only_mfu = 0;       // the MFU if everything but the GEMMs took no time (infinite without GEMMs)
    double rest_budget_s = 0;       // what the GEMMs leave of work_s to the rest (<= 0: out of reach at their rates)
    double attention_budget_s = 0;  // what attention may take with every other family as today
};

// A step of `families`, estimated at `scale` x their total with `mfu` (any count: the target's is the same),
// against `target_mfu`.
inline TargetBudget target_budget(const StepFamilies& families, double scale, double mfu, double target_mfu) {
    TargetBudget b;
    b.step_s = families.total_s() * scale * mfu / target_mfu;
    b.work_s = b.step_s / scale;
    b.gemm_only_mfu = families.gemm_s > 0 ? mfu * families.total_s() / families.gemm_s : HUGE_VAL;
    b.rest_budget_s = b.work_s - families.gemm_s;
    b.attention_budget_s = b.rest_budget_s - families.kernels_s - families.rest_s;
    return b;
}

// The budget in words: the step, each family today, and what the GEMMs leave to the rest.
inline std::string target_report(const StepFamilies& f, double scale, double mfu, double target_mfu) {
    const TargetBudget b = target_budget(f, scale, mfu, target_mfu);
    const double rest_s = f.total_s() - f.gemm_s;
    std::string out;
    char line[512];
    std::snprintf(line, sizeof line,
                  "MFU target %.1f%%: a step of %.2f ms, %.2f ms of replayed work at x %.3f (today %.2f ms, %.1f%% MFU):\n",
                  100 * target_mfu, b.step_s * 1e3, b.work_s * 1e3, scale, f.total_s() * 1e3, 100 * mfu);
    out += line;
    std::snprintf(line, sizeof line, "  %-52s %9.2f ms (alone: %.1f%% MFU)\n", "cuBLASLt GEMMs, at the calibrated rates",
                  f.gemm_s * 1e3, 100 * b.gemm_only_mfu);
    out += line;
    std::snprintf(line, sizeof line, "  %-52s %9.2f ms\n  %-52s %9.2f ms\n  %-52s %9.2f ms\n", "attention kernels",
                  f.attention_s * 1e3, "our other kernels", f.kernels_s * 1e3,
                  "memsets, copies, collectives (what is not overlapped)", f.rest_s * 1e3);
    out += line;
    if (b.rest_budget_s <= 0) {
        std::snprintf(line, sizeof line, "  out of reach at these GEMM rates: the GEMMs alone take %.2f ms of the %.2f\n",
                      f.gemm_s * 1e3, b.work_s * 1e3);
    } else if (rest_s <= b.rest_budget_s) {
        std::snprintf(line, sizeof line, "  reached: the GEMMs leave %.2f ms to the rest, which takes %.2f\n",
                      b.rest_budget_s * 1e3, rest_s * 1e3);
    } else if (b.attention_budget_s <= 0) {
        std::snprintf(line, sizeof line,
                      "  the GEMMs leave %.2f ms to the rest, which takes %.2f (%.2fx faster needed); our other kernels "
                      "and the rest alone take %.2f: attention in no time would not be enough\n",
                      b.rest_budget_s * 1e3, rest_s * 1e3, rest_s / b.rest_budget_s, (f.kernels_s + f.rest_s) * 1e3);
    } else {
        std::snprintf(line, sizeof line,
                      "  the GEMMs leave %.2f ms to the rest, which takes %.2f (%.2fx faster needed); with our other kernels "
                      "and the rest as today, attention would have %.2f ms (%.2fx faster than today)\n",
                      b.rest_budget_s * 1e3, rest_s * 1e3, rest_s / b.rest_budget_s, b.attention_budget_s * 1e3,
                      f.attention_s / b.attention_budget_s);
    }
    return out + line;
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

// The host's time in the recorded step's batch uploads (train_gpt.cu's upload_micro_batch); seconds < 0: not known.
struct HostUploads {
    double seconds = -1;
    int micro_steps = 0;
};

inline std::string profile_report(const std::vector<LaunchRecord>& records, double wall_s, double tokens_per_step,
                                  int world, int64_t num_parameters, int num_layers, int channels, int seq_len,
                                  const std::string& device_name, double device_peak_flops, HostUploads uploads = {}) {
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
                           step_throughput(estimate.estimate_s(), tokens_per_step, world, num_parameters, num_layers,
                                           channels, seq_len));
    // Before a micro-step's launches the host checks its batch, copies it and groups its tokens: with
    // one micro-step the device has nothing else to run meanwhile, so this is idle device time.
    if (uploads.seconds >= 0) {
        std::snprintf(line, sizeof line,
                      "host: %.3f ms of the step in %d batch upload%s (checks, page-locked copies, encoder grouping)%s\n",
                      1e3 * uploads.seconds, uploads.micro_steps, uploads.micro_steps == 1 ? "" : "s",
                      uploads.micro_steps == 1 ? ", before the micro-step's launches" : "");
        out += line;
    }
    return out;
}
