// The roofline of one training step at full size, from the real code path.
//
// Runs ONE real train_step (train_gpt.cu) of the target model -- d12..d48 at the given B, T, ZeRO
// stage, world size and recompute mode -- in the emulator's record-only mode: the model is built
// (its device memory only reserved as address space, so a 1.5B-parameter plan costs nothing),
// and every kernel launch, cuBLASLt matmul, memset, copy and NCCL collective of the step is
// recorded with its FLOPs and bytes, and none executed. The process plays rank 0 of W: its NCCL
// communicator has W ranks and no peers. Weight initialization and trainer_start are skipped
// (they touch host copies of every parameter; nothing executes, so values do not matter).
//
// It prints, per kernel name: launches, GFLOP, GB, arithmetic intensity, the estimated time on an
// H100 SXM and what bounds it; then the step replayed on its streams (communication overlaps the
// backward pass as the event dependencies allow), one micro-step's time, tokens/s and MFU by
// llm.c's (6N + 6LCT) and PaLM's (6N + 12LCT) formulas, and llm.c's published 1.5B run beside it.
// With --target-mfu P: the step P% needs, today's replay by family, and what the GEMMs (at the
// calibrated rates, cuBLAS's own) leave of it to the kernels we write.
// The hardware peaks and the efficiency factors assumed are in dev/roofline.h (and printed).
//
//   make roofline && build/cpu/roofline -e d48 -b 16 -t 1024 -z 1 -w 8
//   build/cpu/roofline -e d12 -b 4 -t 1024 --launches-json launches.json   (kernel_report.py's input)
#define TRAIN_GPT_NO_MAIN
#include "../train_gpt.cu"

#include "dev/roofline.h"
#include "dev/roofline_fit.h"

#include <nlohmann/json.hpp>

namespace {

struct Options {
    std::string model = "d12", recompute = "none", launches_json;
    std::string fit_dir;  // --fit: hold the model against a gpu_check run's files instead
    std::string attention = RunConfig{}.attention;  // train_gpt's default (host/config.h)
    std::string attention_backward = RunConfig{}.attention_backward;
    std::string bias_grad = RunConfig{}.bias_grad;
    int B = 4, T = 1024, zero_stage = 1, world_size = 8;
    int tp = 1, pp = 1, pp_virtual = 1;  // tensor and pipeline parallelism (world = data x pp x tp)
    int cp = 1;                          // context parallelism (world = data x pp x cp x tp)
    std::string pp_schedule = "1f1b";
    int layers = 0, heads = 0, channels = 0;  // a preset's shape changed, as train_gpt's flags (0 = keep)
    int64_t total_batch_tokens = 1048576;  // llm.c's GPT-2 1.5B run: 8 ranks x 16 x 1024 x 8 micro-steps
    double target_mfu = 0;  // --target-mfu: a fraction in (0, 1]; 0: no budget printed
};

const char* kUsage =
    "usage: roofline [-e d12|d24|d36|d48|tiny|mini] [-b B] [-t T] [-z ZERO_STAGE] [-w WORLD_SIZE]\n"
    "                [-r none|selective|full] [--attention auto|tc|simt] [--attention-backward split|fused]\n"
    "                [--bias-grad auto|epilogue|kernels]\n"
    "                [-d TOTAL_BATCH_TOKENS] [--target-mfu PERCENT]\n"
    "                [--layers L] [--heads NH] [--channels C] [--launches-json FILE]\n"
    "                [--tp N] [--pp N] [--pp-schedule afab|1f1b|interleaved] [--pp-virtual V] [--cp N]\n"
    "       roofline --fit DIR   (a scripts/gpu_check.sh output directory: its profile.json and train.json\n"
    "                against this model, GEMM shape by GEMM shape, and the constants they fit)\n"
    "defaults: -e d12 -b 4 -t 1024 -z 1 -w 8 -r none --attention auto (tc; simt in the FP32 build) -d 1048576\n"
    "with --pp the last stage's step is recorded (the classifier's: the busiest), and the step time is its\n"
    "busy time over 1 - the schedule's bubble; with --cp rank 0's (every context rank does the same work),\n"
    "the ring's transfers on their own stream; --target-mfu: the step that MFU (llm.c's count) needs, and what\n"
    "the GEMMs, at the calibrated rates, leave of it to attention and our other kernels\n";

[[noreturn]] void usage_error(const std::string& message) {
    std::fprintf(stderr, "roofline: %s\n%s", message.c_str(), kUsage);
    std::exit(EXIT_FAILURE);
}

int64_t parse_int(const std::string& flag, const char* text) {
    char* end = nullptr;
    const long long v = std::strtoll(text, &end, 10);
    if (end == text || *end != '\0') usage_error(flag + " expects an integer, got '" + text + "'");
    return v;
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (flag == "--help") {
            std::printf("%s", kUsage);
            std::exit(EXIT_SUCCESS);
        }
        if (i + 1 >= argc) usage_error(flag + " needs a value");
        const char* value = argv[++i];
        if (flag == "-e" || flag == "--model") o.model = value;
        else if (flag == "-b" || flag == "--batch-size") o.B = int(parse_int(flag, value));
        else if (flag == "-t" || flag == "--seq-len") o.T = int(parse_int(flag, value));
        else if (flag == "-z" || flag == "--zero-stage") o.zero_stage = int(parse_int(flag, value));
        else if (flag == "-w" || flag == "--world-size") o.world_size = int(parse_int(flag, value));
        else if (flag == "-d" || flag == "--total-batch-tokens") o.total_batch_tokens = parse_int(flag, value);
        else if (flag == "-r" || flag == "--recompute") o.recompute = value;
        else if (flag == "--attention") o.attention = value;
        else if (flag == "--attention-backward") o.attention_backward = value;
        else if (flag == "--bias-grad") o.bias_grad = value;
        else if (flag == "--layers") o.layers = int(parse_int(flag, value));
        else if (flag == "--heads") o.heads = int(parse_int(flag, value));
        else if (flag == "--channels") o.channels = int(parse_int(flag, value));
        else if (flag == "--launches-json") o.launches_json = value;
        else if (flag == "--fit") o.fit_dir = value;
        else if (flag == "--tp") o.tp = int(parse_int(flag, value));
        else if (flag == "--pp") o.pp = int(parse_int(flag, value));
        else if (flag == "--pp-virtual") o.pp_virtual = int(parse_int(flag, value));
        else if (flag == "--pp-schedule") o.pp_schedule = value;
        else if (flag == "--cp") o.cp = int(parse_int(flag, value));
        else if (flag == "--target-mfu") {
            char* end = nullptr;
            const double percent = std::strtod(value, &end);
            if (end == value || *end != '\0' || !(percent > 0 && percent <= 100))
                usage_error("--target-mfu expects a percentage in (0, 100], got '" + std::string(value) + "'");
            o.target_mfu = percent / 100;
        }
        else usage_error("unknown flag " + flag);
    }
    if (o.world_size < 1) usage_error("-w: the world size must be at least 1");
    if (o.tp < 1 || o.pp < 1 || o.cp < 1 || o.world_size % (o.tp * o.pp * o.cp) != 0)
        usage_error("--tp " + std::to_string(o.tp) + " x --pp " + std::to_string(o.pp) + " x --cp " + std::to_string(o.cp) +
                    " must divide -w " + std::to_string(o.world_size));
    if (const std::string problem = context_parallel_problem(o.T, o.cp); !problem.empty()) usage_error(problem);
    if (o.B < 1 || o.T < 1) usage_error("-b, -t: B and T must be at least 1");
    return o;
}

// A record-only NCCL communicator of n ranks, this process rank `rank` of them (no peers).
ncclComm_t record_only_comm(int n, int rank = 0) {
    ncclComm_t comm = nullptr;
    ncclUniqueId id{};
    NCCL_CHECK(ncclCommInitRank(&comm, n, id, rank));
    return comm;
}

// A rank-0-of-W run with no peers: MPI only for this process (the step's host-side sums), and a
// record-only NCCL communicator of W ranks.
Distributed record_only_distributed(int world_size) {
    Distributed d;
    d.mpi = MPI_COMM_SELF;
    d.world_size = world_size;
    d.nccl = record_only_comm(world_size);
    CUDA_CHECK(cudaStreamCreate(&d.comm_stream));
    CUDA_CHECK(cudaEventCreateWithFlags(&d.compute_done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&d.comm_done, cudaEventDisableTiming));
    return d;
}

// The records of one optimizer step over `micro_steps` micro-batches (token values are arbitrary:
// only the encoder's backward grid depends on them, through the number of distinct tokens).
std::vector<LaunchRecord> record_step(Trainer& tr, int micro_steps, int B, int T) {
    const int V = tr.model.config.vocab_size;
    std::vector<std::vector<int>> inputs(micro_steps, std::vector<int>(size_t(B) * T));
    std::vector<const int*> in_ptrs, tg_ptrs;
    for (int s = 0; s < micro_steps; ++s) {
        for (size_t i = 0; i < inputs[s].size(); ++i) inputs[s][i] = int((i * 7919 + size_t(s) * 104729) % size_t(V));
        in_ptrs.push_back(inputs[s].data());
        tg_ptrs.push_back(inputs[s].data());  // every target valid
    }
    launch_record::start(/*timing=*/false);
    train_step(tr, in_ptrs, tg_ptrs, B, T, 1e-4f);
    return launch_record::stop();
}

// One entry per distinct (kernel, block, dynamic shared memory) of our own kernels: what
// scripts/kernel_report.py needs for the occupancy of each kernel.
void write_launches_json(const std::string& path, const std::vector<LaunchRecord>& records, const Options& o) {
    std::map<std::tuple<std::string, unsigned, unsigned, unsigned, size_t>, nlohmann::json> launches;
    for (const LaunchRecord& r : records) {
        if (r.kind != WorkKind::cuda_cores && r.kind != WorkKind::tensor_cores) continue;
        nlohmann::json& j = launches[{r.name, r.block.x, r.block.y, r.block.z, r.dynamic_smem}];
        if (j.is_null())
            j = {{"name", r.name},
                 {"kind", work_kind_name(r.kind)},
                 {"grid", {r.grid.x, r.grid.y, r.grid.z}},
                 {"block", {r.block.x, r.block.y, r.block.z}},
                 {"dynamic_smem", r.dynamic_smem},
                 {"launches", 0}};
        j["launches"] = j["launches"].get<long long>() + 1;
    }
    nlohmann::json out = {{"model", o.model}, {"B", o.B}, {"T", o.T}, {"attention", o.attention}, {"zero_stage", o.zero_stage},
                          {"world_size", o.world_size}, {"precision", kPrecisionName}, {"launches", nlohmann::json::array()}};
    for (auto& [key, j] : launches) out["launches"].push_back(j);
    std::ofstream file(path);
    file << out.dump(2) << "\n";
    if (!file) usage_error("--launches-json: cannot write '" + path + "'");
}

}  // namespace

int main(int argc, char** argv) {
    Options o = parse(argc, argv);
    if (!o.fit_dir.empty()) {
        try {
            std::printf("%s", fit_report(o.fit_dir).c_str());
        } catch (const std::exception& e) {
            std::fprintf(stderr, "roofline: --fit %s: %s\n", o.fit_dir.c_str(), e.what());
            return EXIT_FAILURE;
        }
        return EXIT_SUCCESS;
    }
    std::string checkpoint;
    GPT2Config config;
    ModelOptions options;
    try {
        config = with_shape_flags(model_config_of(o.model, o.T, &checkpoint), o.layers, o.heads, o.channels, checkpoint);
        options = {recompute_of(o.recompute), attention_of(o.attention, false)};  // an H100's choice
        if (o.attention_backward != "split" && o.attention_backward != "fused")
            usage_error("--attention-backward must be one of split|fused, got '" + o.attention_backward + "'");
        options.fused_attention_backward = o.attention_backward == "fused";
        if (o.bias_grad != "auto" && o.bias_grad != "epilogue" && o.bias_grad != "kernels")
            usage_error("--bias-grad must be one of auto|epilogue|kernels, got '" + o.bias_grad + "'");
        options.fuse_bias_grad = o.bias_grad != "kernels";
        options.bias_grad_in_output_type = o.bias_grad == "epilogue";
        o.attention = attention_kernels_name(options);  // "auto" resolved, as printed and in the JSON
    } catch (const std::exception& e) {
        usage_error(e.what());
    }
    if (options.attention == Attention::tc)
        if (const std::string problem = attention_tc_requirements(o.B, o.T, config.channels, config.num_heads);
            !problem.empty())
            usage_error(problem);
    const int data_ranks = o.world_size / (o.tp * o.pp * o.cp), local_T = o.T / o.cp;
    // A rank's tokens per micro-step (T / cp of each sequence), and the step's (every data rank's B x T).
    const int64_t rank_tokens = int64_t(o.B) * local_T, step_tokens_per_micro = int64_t(o.B) * o.T * data_ranks;
    if (o.total_batch_tokens < step_tokens_per_micro || o.total_batch_tokens % step_tokens_per_micro != 0)
        usage_error("-d: " + std::to_string(o.total_batch_tokens) + " tokens per step is not a multiple of data ranks x B x T = " +
                    std::to_string(step_tokens_per_micro));
    const int micro_steps = int(o.total_batch_tokens / step_tokens_per_micro);

    MPI_Init(&argc, &argv);
    cuemu::set_record_only(true);
    Distributed dist = record_only_distributed(data_ranks * o.cp);  // gradients: over data x context
    // Tensor and pipeline groups of record-only communicators, MPI sums over this process alone; the
    // pipeline's last stage (the classifier's) is the one recorded.
    TensorParallel tensor{o.tp > 1 ? record_only_comm(o.tp) : nullptr, MPI_COMM_SELF, 0, o.tp};
    PipelineParallel pipeline;
    PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
    double bubble = 0;
    if (o.pp > 1) {
        try {
            schedule = pipeline_schedule_of(o.pp_schedule);
            if (const std::string problem = pipeline_problem(schedule, o.pp, micro_steps, o.pp_virtual); !problem.empty())
                usage_error(problem);
        } catch (const std::invalid_argument& e) {
            usage_error(e.what());
        }
        pipeline.nccl = record_only_comm(o.pp, o.pp - 1);
        pipeline.gradient_nccl = record_only_comm(o.pp, o.pp - 1);
        pipeline.embedding_nccl = record_only_comm(2, 1);
        pipeline.mpi = MPI_COMM_SELF;
        pipeline.rank = o.pp - 1;
        pipeline.size = o.pp;
        const int chunks = schedule == PipelineSchedule::interleaved ? o.pp_virtual : 1;
        options.pipeline_parallel = o.pp;
        options.pipeline_stage = o.pp - 1;
        options.pipeline_chunks = chunks;
        options.micro_batches_in_flight = simulate_pipeline(schedule, o.pp, micro_steps, chunks).max_in_flight[size_t(o.pp - 1)];
        bubble = pipeline_bubble_formula(schedule, o.pp, micro_steps, chunks);
    }
    if (o.tp > 1) {
        options.tensor_parallel = o.tp;
        options.sequence_parallel = local_T % o.tp == 0;
    }
    ProcessGroup context;  // rank 0 of a record-only ring of cp
    if (o.cp > 1) {
        context = {MPI_COMM_SELF, record_only_comm(o.cp), 0, o.cp};
        options.context_parallel = o.cp;
    }
    // What train_gpt refuses for this model and these options (e.g. --attention-backward fused without
    // --attention tc, or with --cp), with its message.
    if (const std::string problem = gpt2_check_build(config, o.B, local_T, o.zero_stage, options); !problem.empty())
        usage_error(problem);
    Trainer tr;
    tr.schedule = schedule;
    trainer_build(tr, dist, config, o.B, local_T, o.zero_stage, OptimizerConfig{}, options, tensor, pipeline, context);
    const GPT2& m = tr.model;

    const std::vector<LaunchRecord> one = record_step(tr, 1, o.B, local_T);
    const std::vector<LaunchRecord> step = micro_steps == 1 ? one : record_step(tr, micro_steps, o.B, local_T);
    if (!o.launches_json.empty()) write_launches_json(o.launches_json, step, o);

    const StepTimeline one_timeline = replay_streams(one), timeline = replay_streams(step);
    const int L = config.num_layers, C = config.channels;
    std::printf("roofline: %s (L=%d, NH=%d, C=%d), %s parameters, B=%d T=%d, ZeRO-%d on %d rank(s) = %d data x %d pipeline x "
                "%d context x %d tensor (recorded: %s), recompute %s, attention %s, %s\n",
                o.model.c_str(), config.num_layers, config.num_heads, config.channels,
                with_thousands(int64_t(gpt2_num_parameters(config))).c_str(), o.B, o.T, o.zero_stage, o.world_size, data_ranks, o.pp,
                o.cp, o.tp, o.pp > 1 ? "the last stage's rank 0" : "rank 0", recompute_name(options.recompute), o.attention.c_str(),
                kPrecisionName);
    std::printf("step: %d micro-step(s) x %d x %d tokens x %d data rank(s) = %s tokens; memory plan %.2f GiB per rank%s\n",
                micro_steps, o.B, o.T, data_ranks, with_thousands(o.total_batch_tokens).c_str(),
                double(m.plan.total()) / double(size_t(1) << 30), o.pp > 1 ? " (the recorded stage's)" : "");
    std::printf("%s\n\n", H100Model::assumptions().c_str());
    std::printf("per kernel, one optimizer step of rank 0 (estimated H100 SXM time):\n%s\n", kernel_table(step).c_str());

    // One micro-step (forward + backward) without the step's reduction and update: the difference
    // between the step and a one-micro-step step, per extra micro-step.
    const double micro_s = micro_steps > 1 ? (timeline.step_s - one_timeline.step_s) / (micro_steps - 1)
                                           : one_timeline.busiest_stream_s;
    std::printf("one micro-step (forward + backward, %d x %d tokens): %.2f ms%s\n", o.B, o.T, micro_s * 1e3,
                micro_steps > 1 ? "" : " (one micro-step: includes the reduction and the update)");
    std::printf("step: compute stream %.2f ms, other streams %.2f ms of which %.2f ms not overlapped -> %.2f ms%s; "
                "x %.3f for what a roofline misses -> %.2f ms\n",
                timeline.busiest_stream_s * 1e3, timeline.other_streams_s * 1e3, timeline.exposed_s * 1e3,
                timeline.step_s * 1e3, timeline.has_dependencies ? "" : " (no stream dependencies recorded)",
                1 + H100Model::kUnmodeledShareOurs, timeline.estimate_s() * 1e3);
    // A pipeline stage is busy 1 - bubble of the step (the schedule's formula, F and B alike long; the
    // last stage, recorded, is the slowest: it also runs the classifier).
    const double step_s = timeline.estimate_s() / (1.0 - bubble);
    if (o.pp > 1)
        std::printf("pipeline: %s over %d stages, %d micro-batches: bubble %.4f -> step %.2f ms\n", o.pp_schedule.c_str(), o.pp,
                    micro_steps, bubble, step_s * 1e3);
    const int64_t whole_parameters = int64_t(gpt2_num_parameters(config));
    const StepThroughput estimate = step_throughput(step_s, double(o.total_batch_tokens), o.world_size, whole_parameters, L, C, o.T);
    std::printf("%s", throughput_line("estimate", estimate).c_str());
    const StepFamilies families = step_families(step);
    if (o.target_mfu > 0)
        std::printf("%s", target_report(families, step_s / timeline.step_s, estimate.mfu_llmc, o.target_mfu).c_str());
    double recorded_flops = 0;
    for (const LaunchRecord& r : step) recorded_flops += r.flops;
    std::printf("recorded FLOPs per token: %.3g (6N + 6LCT = %.3g, 6N + 12LCT = %.3g)\n",
                recorded_flops / double(rank_tokens * micro_steps),
                flops_per_token(int64_t(m.num_parameters), L, C, o.T),
                flops_per_token_palm(int64_t(m.num_parameters), L, C, o.T));
    // One rank's attention is the whole model's here; tensor, pipeline and context parallelism divide it.
    if (o.tp == 1 && o.pp == 1 && o.cp == 1)
        std::printf("%s", attention_rate_line(families, flash_attention_flops(o.B, o.T, C, L) * micro_steps).c_str());
    // llm.c's published GPT-2 (1.5B) reproduction, as issue 7 quotes it: 8x H100 SXM, B=16, T=1024,
    // 1,048,576 tokens per step, 2.75 s per step, 47.3% MFU. Beside ours: the same launches with the
    // attention llm.c ran (cuDNN's published rates) and llm.c's share of what a roofline misses, the
    // model kUnmodeledShareLlmc is fitted on.
    constexpr double kLlmcStepSeconds = H100Model::kLlmcStepSeconds, kLlmcMfu = 0.473;
    const bool llmc_config =
        o.model == "d48" && o.B == 16 && o.T == 1024 && o.world_size == 8 && o.total_batch_tokens == 1048576;
    const double as_llmc_s = replay_streams(step, H100Model::kCudnnAttention).estimate_s(H100Model::kUnmodeledShareLlmc);
    std::printf("llm.c's published 1.5B run (8x H100 SXM, d48, B=16, T=1024, 1,048,576 tokens/step): %.2f s/step, "
                "%.1f%% MFU\n  this configuration as llm.c (cuDNN's attention rates, x %.3f): %.3f s/step (%.3fx llm.c's)%s\n"
                "  ours (FlashAttention-2-class kernels, x %.3f):              %.3f s/step (%.3fx)\n",
                kLlmcStepSeconds, 100 * kLlmcMfu, 1 + H100Model::kUnmodeledShareLlmc, as_llmc_s,
                as_llmc_s / kLlmcStepSeconds, llmc_config ? "" : " [not llm.c's configuration]",
                1 + H100Model::kUnmodeledShareOurs, step_s, step_s / kLlmcStepSeconds);

    trainer_free(tr);
    distributed_release(dist);
    MPI_Finalize();
    return 0;
}
