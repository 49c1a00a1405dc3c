// Run identity across resumes (-y). Every checkpoint's state carries its run's id and settings; a
// resume continues that run only if the settings that define it (kRunIdentityKeys in host/config.h:
// model, T, seed, training data, batch ramp, tokens per step) are the same, or --resume-override
// names the ones that changed. Other changed settings (learning rate, ZeRO stage, B with the same
// tokens per step, ...) are allowed and reported.
//
// State metadata (the JSON string in host/checkpoint.h's TrainingState): {"run_id": "<16 hex>",
// "tokens-per-step": N, "config": <to_json(RunConfig)>}. States written before it held the config
// alone; their run id is new and tokens per step is compared only through -d.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "host/checkpoint.h"
#include "host/config.h"

inline std::string new_run_id() {
    std::random_device entropy;
    const uint64_t id = (uint64_t(entropy()) << 32) ^ uint64_t(entropy());
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", (unsigned long long)id);
    return text;
}

// What a checkpoint's state records about its run.
inline std::string run_metadata(const RunConfig& rc, const std::string& run_id, int64_t tokens_per_step) {
    nlohmann::json meta = {{"run_id", run_id}, {"tokens-per-step", tokens_per_step}, {"config", to_json(rc)}};
    return meta.dump();
}

struct ResumedRun {
    std::string run_id;                // the checkpoint's (a new one for states that have none)
    std::vector<std::string> changed;  // allowed differences, "flag: X in the checkpoint, Y now", for the log
};

// Compares the metadata of the checkpoint at `state_path` with this run's settings. Throws, with one
// line per setting, when run-identity settings differ and --resume-override does not name them.
inline ResumedRun check_resume(const std::string& state_path, const std::string& meta_text, const RunConfig& rc,
                               int64_t tokens_per_step) {
    nlohmann::json meta;
    try {
        meta = nlohmann::json::parse(meta_text);
    } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error("state '" + state_path + "': its run metadata is not valid JSON: " + e.what());
    }
    if (!meta.is_object()) throw std::runtime_error("state '" + state_path + "': its run metadata is not a JSON object");
    const bool has_identity = meta.contains("config");
    nlohmann::json then = has_identity ? meta["config"] : meta, now = to_json(rc);
    if (has_identity) {
        then["tokens-per-step"] = meta.value("tokens-per-step", int64_t(-1));
        now["tokens-per-step"] = tokens_per_step;
    }
    const std::vector<std::string> overrides = split_list(rc.resume_override);
    auto overridden = [&](const std::string& key) {
        for (const std::string& o : overrides)
            if (o == key) return true;
        return false;
    };
    auto name_of = [](const std::string& key) {
        return key == "tokens-per-step" ? std::string("tokens per step (-d, resolved for the ranks)")
                                        : config_detail::flag_name(*config_detail::find_option(key));
    };
    // Settings of a run's control that say nothing about the run itself.
    const std::vector<std::string> not_compared = {"resume", "overwrite", "resume-override", "dry-run", "json",
                                                   "profile-step", "output-dir"};
    ResumedRun resumed;
    resumed.run_id = has_identity ? meta.value("run_id", std::string()) : std::string();
    if (resumed.run_id.empty()) resumed.run_id = new_run_id();
    std::vector<std::string> refused;
    for (const auto& item : now.items()) {
        const std::string& key = item.key();
        bool skip = false;
        for (const std::string& k : not_compared) skip |= key == k;
        if (skip || !then.contains(key) || then[key] == item.value()) continue;
        const std::string line = name_of(key) + ": " + then[key].dump() + " in the checkpoint, " + item.value().dump() + " now";
        bool identity = false;
        for (const char* k : kRunIdentityKeys) identity |= key == k;
        if (identity && !overridden(key)) refused.push_back(line);
        else resumed.changed.push_back(line);
    }
    if (!refused.empty()) {
        std::string message = "resume: '" + state_path + "' belongs to another run (run " + resumed.run_id +
                              "); these settings define a run and differ:";
        for (const std::string& line : refused) message += "\n  " + line;
        message += "\n(name them in --resume-override to resume anyway, or use another -o)";
        throw std::runtime_error(message);
    }
    return resumed;
}

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
