// Run identity across resumes (-y). Every checkpoint's state carries its run's id and settings; a
// resume continues that run only if the settings that define it (kRunIdentityKeys in host/config.h:
// model, T, seed, training data, batch ramp, tokens per step) are the same, or --resume-override
// names the ones that changed. Other changed settings (learning rate, ZeRO stage, B with the same
// tokens per step, ...) are allowed and reported.
//
// State metadata (the JSON string in host/checkpoint.h's TrainingState): {"run_id": "<16 hex>",
// "tokens-per-step": N, "config": <to_json(RunConfig)>}. States written before it held the config
// alone; their run id is new and tokens per step is compared only through -d. The JSON work is in
// host/run_identity.cpp (the host library).
#pragma once

#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "host/checkpoint.h"
#include "host/config.h"

// The run a checkpoint belongs to: its id, and the tokens of a full step (resuming checks both).
struct RunInfo {
    std::string id;
    int64_t tokens_per_step = 0;
};

inline std::string new_run_id() {
    std::random_device entropy;
    const uint64_t id = (uint64_t(entropy()) << 32) ^ uint64_t(entropy());
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", (unsigned long long)id);
    return text;
}

// What a checkpoint's state records about its run (a JSON string).
std::string run_metadata(const RunConfig& rc, const std::string& run_id, int64_t tokens_per_step);

struct ResumedRun {
    std::string run_id;                // the checkpoint's (a new one for states that have none)
    std::vector<std::string> changed;  // allowed differences, "flag: X in the checkpoint, Y now", for the log
};

// Compares the metadata of the checkpoint at `state_path` with this run's settings. Throws, with one
// line per setting, when run-identity settings differ and --resume-override does not name them.
ResumedRun check_resume(const std::string& state_path, const std::string& meta_text, const RunConfig& rc,
                        int64_t tokens_per_step);

// A fresh run (no -y) must not mix with another run's checkpoints in its output dir (a later -y would
// resume those): refused, unless --overwrite, which deletes them (on rank 0). Incomplete ones cannot
// be resumed, so a fresh run may write over them (scripts/run_gpt2.sh restarts without -y until a
// first checkpoint is complete).
inline void prepare_output_dir(const RunConfig& rc, bool main_rank) {
    if (rc.resume || rc.output_dir.empty()) return;
    if (rc.overwrite) {
        if (main_rank) remove_all_checkpoints(rc.output_dir);
    } else if (const std::optional<int64_t> latest = latest_complete_checkpoint(rc.output_dir)) {
        throw std::runtime_error("output dir '" + rc.output_dir + "' holds checkpoints (newest: step " +
                                 std::to_string(*latest) + "): resume them with -y, or delete them with --overwrite");
    }
}

// The run's first line (model, device, precision, attention kernels, size, batch, steps, run id), and its configuration
// in <output dir>/config.json. Rank 0 calls it.
void announce_run(const RunConfig& rc, const char* device, int ranks, const char* precision, const char* attention,
                  size_t num_parameters, int64_t total_steps, const RunInfo& run, int64_t resumed_at);
