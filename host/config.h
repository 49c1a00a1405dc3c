// The run's configuration: command-line flags (cxxopts) and JSON config files (nlohmann/json),
// both driven by one table, so --help, --config keys and the written config.json always list the
// same settings. Precedence: defaults < --config FILE.json < flags given on the command line.
// One-letter flags follow llm.c's train_gpt2.cu where it has one (so -h is --hellaswag here and
// help is --help only). The parsing lives in host/config.cpp (compiled once, into the host library:
// cxxopts and the JSON parser are not recompiled in every file that needs a RunConfig).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "host/divergence.h"
#include "host/schedule.h"

// Bad or contradictory settings: one line naming the flag(s).
struct ConfigError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct RunConfig {
    // data and model
    std::string train_data = "data/shakespeare/train_*.bin";  // glob of token shards
    std::string val_data = "data/shakespeare/val_*.bin";
    std::string model = "d12";  // an llm.c model file, or a preset (host/model_config.h kPresetNames)
    int layers = 0, heads = 0, channels = 0;  // a preset's shape changed (host/model_config.h); 0 = the preset's
    std::string output_dir;     // "" = write nothing
    bool doc_mask = false;       // attend only within the document (host/documents.h)
    bool doc_positions = false;  // position embeddings restart at each document
    // batch and schedule
    int batch_size = 4;                // B: micro-batch per rank
    int seq_len = 1024;                // T
    int64_t total_batch_tokens = -1;   // tokens per optimizer step; -1 = B * T * world size
    std::string batch_ramp;            // "START:N1,N2,..." (host/schedule.h); "" = off
    int64_t max_steps = -1;            // -1 = one epoch
    double learning_rate = 3e-4;
    int64_t warmup_steps = 0;
    double final_lr_fraction = 1.0;
    std::string lr_schedule = "cosine";
    double wsd_decay_fraction = 0.2;
    // optimizer
    double weight_decay = 0.0;
    double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
    double grad_clip = 1.0;  // global-norm clip; 0 = off
    int64_t seed = 1337;
    // divergence (host/divergence.h)
    double skip_loss_z = DivergenceSettings{}.skip_loss_z;
    double skip_norm_z = DivergenceSettings{}.skip_norm_z;
    int64_t max_skipped_steps = DivergenceSettings{}.max_skipped_steps;
    std::string on_divergence = "stop";  // stop | rollback (to the last good checkpoint, skipping the window)
    int64_t max_rollbacks = 3;
    // parallelism and memory
    int zero_stage = 0;
    int tp = 1;                          // tensor-parallel ranks (parallel/tensor.h): world = data x tp
    std::string sequence_parallel = "auto";  // auto (on when tp > 1) | on | off (parallel/tensor.h)
    int pp = 1;                          // pipeline stages (host/pipeline_schedule.h)
    std::string pp_schedule = "1f1b";    // afab | 1f1b | interleaved
    int pp_virtual = 1;                  // model chunks per rank (interleaved)
    bool pp_print_schedule = false;      // print the pipeline schedule and exit
    int cp = 1;                          // context-parallel ranks (parallel/context.h): world = data x cp
    std::string recompute = "none";
    int world_size = 0;       // 0 = the launched ranks
    double max_memory = 0.0;  // GiB; 0 = the device's
    std::string attention = "auto";  // resolved by attention_of (host/model_config.h)
    std::string attention_backward = "split";  // split | fused: the tensor-core backward's kernels (kernels/attention_tc.cuh)
    bool matmul_autotune = false;    // time cuBLASLt's candidates per GEMM shape (kernels/matmul.cuh)
    std::string matmul_algos;        // autotune's picks (host/matmul_algos.h); "" = -o's matmul_algos.json, if -o
    std::string bias_grad = "auto";  // auto | epilogue | kernels: where the linears' bias gradients are summed (kernels/matmul.cuh)
    std::string cuda_graphs = "on";  // on | off: replay each micro-step from a CUDA graph (train_gpt.cu, run_micro_step)
    // checkpoints
    int64_t checkpoint_every = 0;  // 0 = never
    int keep_last = 0;             // 0 = keep all
    bool resume = false;
    bool overwrite = false;       // a fresh run may delete the checkpoints already in the output dir
    std::string resume_override;  // comma-separated run-identity settings a resume may change
    // evaluation and sampling
    int64_t val_every = 20;  // 0 = never
    int val_batches = 20;
    int final_val_batches = -1;  // the run's last validation: -1 = as val_batches, 0 = the whole split
    int64_t sample_every = 20;  // 0 = never
    int gen_tokens = 64;
    double temperature = 1.0;  // 0 = greedy (the most likely token)
    int top_k = 0;  // 0 = off
    std::string hellaswag;  // path; "" = off
    // generation (--generate: train_gpt.cu's generate(), host/generation.h)
    bool generate = false;
    std::string prompt;      // text, GPT-2 BPE-encoded by data/encode.py
    std::string prompt_ids;  // token ids "id,id,...", used as they are
    int max_tokens = 256;    // tokens to generate at most (fewer at an end-of-text token)
    double top_p = 1.0;      // nucleus sampling; 1 = off
    std::string kv_cache = "on";
    // run control
    bool dry_run = false;
    bool json = false;  // --dry-run output as JSON
    bool profile_step = false;
    int64_t log_every = 1;
    double collective_timeout = 300;  // seconds without progress before the watchdog ends the job; 0 = off

    bool help = false;  // --help was given: print help_text() and exit (not a setting)
    std::vector<std::string> given;  // long names of the settings a flag or --config set (not a setting)
    bool was_given(const std::string& long_name) const {
        for (const std::string& g : given)
            if (g == long_name) return true;
        return false;
    }
};

// -e as given, and the shape flags that changed it ("d12 --layers 24"), for the lines that name the model.
inline std::string model_label(const RunConfig& rc) {
    std::string label = rc.model;
    const std::pair<const char*, int> shape[] = {{"layers", rc.layers}, {"heads", rc.heads}, {"channels", rc.channels}};
    for (const auto& [flag, value] : shape)
        if (value) label += " --" + std::string(flag) + " " + std::to_string(value);
    return label;
}

// The settings that make a run the run it is: a resume (-y) must keep them, unless --resume-override
// names them (host/run_identity.h). tokens-per-step is -d resolved for the world size. doc-mask and
// doc-positions change what the model computes (and so what it learns), not only how.
inline constexpr const char* kRunIdentityKeys[] = {"model",      "layers",          "heads",    "channels",
                                                   "seq-len",    "seed",            "train-data", "batch-ramp",
                                                   "tokens-per-step", "doc-mask",   "doc-positions"};

// "a,b,,c" -> {"a", "b", "c"}
inline std::vector<std::string> split_list(const std::string& text) {
    std::vector<std::string> items;
    std::string item;
    std::istringstream in(text);
    while (std::getline(in, item, ','))
        if (!item.empty()) items.push_back(item);
    return items;
}

// Throws ConfigError (one line naming the flag) on bad or contradictory input. With --help, returns
// at once with help = true and nothing else checked.
RunConfig parse_config(int argc, char** argv);

// The settings of a --config file alone (over the defaults, no command line), validated as
// parse_config validates them; throws ConfigError naming the file and key.
RunConfig config_from_file(const std::string& path);

// The --help text, generated from the option table.
std::string help_text();

// The resolved configuration, keyed by long flag names: reading it back with --config gives the
// same RunConfig. to_json_text: the same, indented, as config.json holds it.
nlohmann::json to_json(const RunConfig& c);
std::string to_json_text(const RunConfig& c);

namespace config_detail {
// The flag of a setting for messages, "-b/--batch-size" (or "--beta1" for long-only flags); a long
// name missing from the option table throws std::logic_error.
std::string flag(const char* long_name);
inline void require(bool ok, const std::string& message) {
    if (!ok) throw ConfigError(message);
}
}  // namespace config_detail

// The learning-rate schedule of a validated config.
inline LrSchedule lr_schedule_of(const RunConfig& c) {
    return {lr_kind_from_name(c.lr_schedule), c.learning_rate, c.warmup_steps, c.final_lr_fraction,
            c.wsd_decay_fraction};
}

// -d for `world_size` ranks (each runs at least one micro-batch per step): -1 becomes B*T*world;
// otherwise -d, and the batch ramp's start, must be multiples of B*T*world.
inline int64_t total_batch_tokens_for(const RunConfig& c, int world_size) {
    using config_detail::flag;
    if (world_size < 1)
        throw std::invalid_argument("total_batch_tokens_for: world_size must be >= 1, got " + std::to_string(world_size));
    const int64_t per_micro_step = int64_t(c.batch_size) * c.seq_len * world_size;
    if (c.total_batch_tokens == -1) return per_micro_step;
    const std::string unit = flag("batch-size") + " * " + flag("seq-len") + " * world size " +
                             std::to_string(world_size) + " = " + std::to_string(per_micro_step);
    config_detail::require(c.total_batch_tokens % per_micro_step == 0,
                           flag("total-batch-tokens") + " " + std::to_string(c.total_batch_tokens) +
                               " must be a multiple of " + unit);
    const int64_t ramp_start = parse_batch_ramp(c.batch_ramp).start_tokens;
    config_detail::require(ramp_start % per_micro_step == 0, flag("batch-ramp") + " start " +
                                                                 std::to_string(ramp_start) + " must be a multiple of " + unit);
    return c.total_batch_tokens;
}

// The world size to plan for: the launched ranks, or --world-size, which may differ from them only
// with --dry-run (planning a run of another size).
inline int planned_world_size(const RunConfig& c, int launched_ranks) {
    using config_detail::flag;
    if (c.world_size == 0) return launched_ranks;
    config_detail::require(c.world_size == launched_ranks || c.dry_run || c.pp_print_schedule,
                           flag("world-size") + " " + std::to_string(c.world_size) + " but " +
                               std::to_string(launched_ranks) + " ranks were launched (another size needs " +
                               flag("dry-run") + " or " + flag("pp-print-schedule") + ")");
    return c.world_size;
}
