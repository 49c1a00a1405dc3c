// Run identity across resumes (host/run_identity.h): the JSON of a checkpoint's run metadata.
#include "host/run_identity.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

// What a checkpoint's state records about its run.
std::string run_metadata(const RunConfig& rc, const std::string& run_id, int64_t tokens_per_step) {
    nlohmann::json meta = {{"run_id", run_id}, {"tokens-per-step", tokens_per_step}, {"config", to_json(rc)}};
    return meta.dump();
}

// Compares the metadata of the checkpoint at `state_path` with this run's settings. Throws, with one
// line per setting, when run-identity settings differ and --resume-override does not name them.
ResumedRun check_resume(const std::string& state_path, const std::string& meta_text, const RunConfig& rc,
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
                                        : config_detail::flag(key.c_str());
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

void announce_run(const RunConfig& rc, const char* device, int ranks, const char* precision, const char* attention,
                  size_t num_parameters, int64_t total_steps, const RunInfo& run, int64_t resumed_at) {
    const std::string model = model_label(rc);
    std::string grid;
    if (rc.tp > 1 || rc.pp > 1) {
        grid = " (" + std::to_string(ranks / (rc.tp * rc.pp)) + " data";
        if (rc.pp > 1) grid += " x " + std::to_string(rc.pp) + " pipeline";
        if (rc.tp > 1) grid += " x " + std::to_string(rc.tp) + " tensor";
        grid += ")";
    }
    std::printf("train_gpt: %s on %s x %d%s, %s, attention %s%s%s, %zu parameters, B=%d T=%d, %lld tokens/step, %lld steps, "
                "run %s%s\n",
                model.c_str(), device, ranks, grid.c_str(), precision, attention, rc.doc_mask ? " + doc-mask" : "",
                rc.doc_positions ? ", doc-positions" : "", num_parameters, rc.batch_size, rc.seq_len,
                (long long)run.tokens_per_step, (long long)total_steps, run.id.c_str(),
                rc.resume ? (", resumed at step " + std::to_string(resumed_at)).c_str() : "");
    if (rc.output_dir.empty()) return;
    std::filesystem::create_directories(rc.output_dir);
    std::ofstream(std::filesystem::path(rc.output_dir) / "config.json") << to_json_text(rc) << "\n";
}
