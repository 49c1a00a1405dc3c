// How a run writes a checkpoint across its ranks (the files themselves: host/checkpoint.h): check the
// free space for its known size, write in phases that every rank agrees on, and on any failure remove
// what was written and go on training, so a full disk costs a checkpoint, never the run or an older
// checkpoint. And how a run resumes from the latest one, each rank reading its own optimizer range.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "host/checkpoint.h"
#include "host/config.h"
#include "host/dataloader.h"
#include "host/rng.h"
#include "host/run_identity.h"
#include "parallel/process_groups.h"
#include "parallel/zero.h"

// One phase of a checkpoint: `write` runs on the ranks where `mine` is true.
struct CheckpointPhase {
    bool mine;
    std::function<void()> write;
};

// Writes step `step`'s checkpoint into `dir`, phase after phase; returns false when it was skipped:
// less free space than `need_bytes` (judged on rank 0: ranks on other nodes write into the same shared
// directory), or a write that failed on any rank. After each phase the ranks agree (an all-reduce,
// also the barrier between phases). A skipped checkpoint leaves no file behind (warned on stderr);
// a written one retires all but the newest `keep_last`. `beat` is called before each phase (the
// watchdog's progress).
inline bool write_checkpoint_agreed(const Distributed& d, const std::string& dir, int64_t step, uint64_t need_bytes,
                                    int keep_last, const std::vector<CheckpointPhase>& phases,
                                    const std::function<void()>& beat) {
    long long no_space = 0;
    if (d.rank == 0) {
        std::error_code ec;
        const std::filesystem::space_info space = std::filesystem::space(dir, ec);
        if (!ec && space.available < need_bytes) {
            no_space = 1;
            std::fprintf(stderr, "warning: step %lld: checkpoint skipped: it needs %llu bytes, '%s' has %llu free\n",
                         (long long)step, (unsigned long long)need_bytes, dir.c_str(),
                         (unsigned long long)space.available);
        }
    }
    if (all_ranks_sum(d, no_space) > 0) return false;
    std::string error;
    bool ok = true;
    for (const CheckpointPhase& phase : phases) {
        if (beat) beat();
        if (phase.mine) try {
                phase.write();
            } catch (const std::exception& e) {
                error = e.what();
            }
        ok = all_ranks_sum(d, (long long)!error.empty()) == 0;
        if (!ok) break;
    }
    if (!ok) {
        if (!error.empty())
            std::fprintf(stderr, "warning: rank %d: step %lld: checkpoint not written: %s\n", d.rank, (long long)step,
                         error.c_str());
        if (d.rank == 0) {
            try {
                remove_checkpoint(dir, step);
            } catch (const std::exception& e) {
                std::fprintf(stderr, "warning: step %lld: %s\n", (long long)step, e.what());
            }
            std::fprintf(stderr, "warning: step %lld: checkpoint skipped, its files removed; training goes on\n",
                         (long long)step);
        }
        MPI_CHECK(MPI_Barrier(d.mpi));
        return false;
    }
    if (d.rank == 0) remove_old_checkpoints(dir, keep_last);
    MPI_CHECK(MPI_Barrier(d.mpi));
    return true;
}

// Every --checkpoint-every steps and after the last step, when there is an output dir.
inline bool checkpoint_due(const RunConfig& rc, int64_t done, int64_t total_steps) {
    return !rc.output_dir.empty() && rc.checkpoint_every > 0 && (done % rc.checkpoint_every == 0 || done == total_steps);
}

// One rank's training state as a checkpoint reads and writes it: the model's parameters, through the
// model (which holds them in its precision), and this rank's range of the sharded optimizer.
struct CheckpointedTraining {
    const Distributed& dist;
    ShardedAdamW& optimizer;
    cudaStream_t stream;
    size_t num_parameters = 0;
    size_t parameter_bytes = 0;                                // per parameter in the model file
    std::function<void(const std::string& path)> write_model;  // an llm.c model file of the parameters
    std::function<void(const std::string& path)> load_model;   // the parameters from one
    std::function<float()> parameter_norm;                     // over all ranks: not finite on NaN or Inf
    std::function<void(const char* what, int64_t step)> progress;  // for the watchdog
};

// Writes step `step`'s checkpoint: the model (llm.c format, rank 0) and the training state (each rank
// its optimizer range; at stage 0 rank 0 the whole). With --keep-last, which retires older
// checkpoints, each rank then reads its part back and verifies it against its checksums: a checkpoint
// that does not verify is removed like a failed write, so the older ones are never deleted for a
// newer one that could not be resumed. Returns false when it was skipped (see
// write_checkpoint_agreed). Never from non-finite parameters: that throws.
inline bool save_checkpoint(const CheckpointedTraining& t, const RunConfig& rc, const RunInfo& run, int64_t step,
                            const DataLoaderPosition& loader, uint64_t sample_rng) {
    const ShardLayout& sh = t.optimizer.shard;
    const int rank = t.dist.rank;
    const std::string state_path = state_checkpoint_path(rc.output_dir, step);
    if (!std::isfinite(t.parameter_norm()))
        throw std::runtime_error("step " + std::to_string(step) + ": parameters are not finite (NaN or Inf); no checkpoint "
                                 "written");
    const std::string meta = run_metadata(rc, run.id, run.tokens_per_step);
    const size_t begin = sh.optimizer_begin(), count = sh.optimizer_real_size();
    const uint64_t writers = uint64_t(sh.world_size);  // one checksum record per rank (stage 0: rank 0's alone)
    auto write_model = [&] {  // and the state file's header
        t.write_model(model_checkpoint_path(rc.output_dir, step));
        begin_state_file(state_path, TrainingState{step, t.num_parameters, {uint64_t(rc.seed), sample_rng, 0, 0},
                                                   loader.epoch, loader.shard, loader.sample, meta, writers});
    };
    auto write_optimizer_range = [&] {
        const OptimizerState o = download_optimizer_state(t.optimizer, count, t.stream);
        write_state_range(state_path, t.num_parameters, uint64_t(rank), begin, o.master.data(), o.adam_m.data(),
                          o.adam_v.data(), count);
    };
    const bool writes_range = (sh.zero_stage > 0 || rank == 0) && count > 0;
    auto read_back = [&] {
        if (rank == 0) verify_model_checkpoint(model_checkpoint_path(rc.output_dir, step));
        if (!writes_range) return;
        std::vector<float> master(count), m(count), v(count);
        read_state_range(state_path, read_state_header(state_path), begin, count, master.data(), m.data(), v.data());
    };
    std::vector<CheckpointPhase> phases = {{rank == 0, write_model},
                                           {writes_range, write_optimizer_range},
                                           {rank == 0, [&] { finish_state_file(state_path); }}};
    if (rc.keep_last > 0) phases.push_back({rank == 0 || writes_range, read_back});
    return write_checkpoint_agreed(t.dist, rc.output_dir, step, checkpoint_bytes(t.num_parameters, t.parameter_bytes, meta.size(), writers),
                                   rc.keep_last, phases, [&] { t.progress("a checkpoint", step); });
}

// Restores parameters, master weights, moments, step, data position and sampling RNG from the latest
// complete checkpoint in rc.output_dir (written by any number of ranks at any ZeRO stage), after
// checking that it is the same run (run->tokens_per_step in, run->id out); returns its step. A
// checkpoint whose model or state fails to read or verify (a checksum mismatch) on any rank is passed
// over with a warning for the previous complete one; all ranks take the same. A changed run-identity
// setting is an error, not a reason to fall back.
// (`newest`: none after that step is taken.)
inline int64_t resume_checkpoint(const CheckpointedTraining& t, const RunConfig& rc, DataLoader& loader, Rng& sample_rng,
                                 RunInfo* run, int64_t newest = INT64_MAX) {
    std::vector<int64_t> steps = complete_checkpoints(rc.output_dir);
    std::erase_if(steps, [&](int64_t step) { return step > newest; });
    if (steps.empty())
        throw std::runtime_error("--resume: no complete checkpoint in '" + rc.output_dir + "'" +
                                 (newest == INT64_MAX ? "" : " at step " + std::to_string(newest) + " or before"));
    const ShardLayout& sh = t.optimizer.shard;
    const size_t begin = sh.optimizer_begin(), count = sh.optimizer_real_size();
    for (int64_t step : steps) {
        t.progress("reading a checkpoint", step);  // a rollback reads one with the watchdog running
        const std::string state_path = state_checkpoint_path(rc.output_dir, step);
        const TrainingState st = read_state_header(state_path);
        const ResumedRun resumed = check_resume(state_path, st.meta_json, rc, run->tokens_per_step);
        if (st.num_parameters != t.num_parameters)
            throw std::runtime_error("state '" + state_path + "': num_parameters differs from the model");
        OptimizerState o{std::vector<float>(sh.optimizer_size()), std::vector<float>(sh.optimizer_size()),
                         std::vector<float>(sh.optimizer_size())};
        std::string problem;
        try {
            t.load_model(model_checkpoint_path(rc.output_dir, step));
            if (count > 0) read_state_range(state_path, st, begin, count, o.master.data(), o.adam_m.data(), o.adam_v.data());
        } catch (const std::exception& e) {
            problem = e.what();
        }
        const long long failed = all_ranks_sum(t.dist, (long long)!problem.empty());
        if (failed > 0) {
            if (!problem.empty()) std::fprintf(stderr, "warning: resume: rank %d: %s\n", t.dist.rank, problem.c_str());
            if (t.dist.rank == 0)
                std::fprintf(stderr, "warning: resume: the checkpoint of step %lld failed on %lld rank(s); trying an earlier one\n",
                             (long long)step, failed);
            continue;
        }
        run->id = resumed.run_id;
        if (t.dist.rank == 0)
            for (const std::string& change : resumed.changed)
                std::printf("resume: changed since step %lld: %s\n", (long long)step, change.c_str());
        upload_optimizer_state(t.optimizer, o, int(st.step), t.stream);
        loader.seek({st.loader_epoch, st.loader_shard, st.loader_sample});
        sample_rng.state = st.rng[1];
        return st.step;
    }
    throw std::runtime_error("--resume: no checkpoint in '" + rc.output_dir + "' reads and verifies (warnings above)");
}

// After step `done`: the divergence guard's count (host/divergence.h). When the run has diverged it
// stops (RunDiverged, thrown on), or with --on-divergence rollback, while rollbacks are left: reloads the
// newest complete checkpoint from before the step ahead of the first skipped one (that step's update
// may be what blew the run up), deletes the newer ones (the abandoned steps'), and leaves the data
// loader where it is, past the data the diverged steps read. Returns the step it rolled back to.
inline std::optional<int64_t> record_or_roll_back(const CheckpointedTraining& t, const RunConfig& rc, DivergenceGuard& guard,
                                                  int64_t done, double loss, float grad_norm, const std::string& skipped,
                                                  DataLoader& loader, Rng& sample_rng, RunInfo* run) {
    try {
        guard.record(done, loss, grad_norm, skipped);
        return std::nullopt;
    } catch (const RunDiverged& d) {
        if (rc.on_divergence != "rollback") throw;
        if (guard.rollbacks() >= rc.max_rollbacks)
            throw std::runtime_error(std::string(d.what()) + "; no rollback left (--max-rollbacks " +
                                     std::to_string(rc.max_rollbacks) + ")");
        const int64_t newest = d.first_skipped - 2;
        const std::vector<int64_t> complete = complete_checkpoints(rc.output_dir);
        if (std::none_of(complete.begin(), complete.end(), [&](int64_t step) { return step <= newest; }))
            throw std::runtime_error(std::string(d.what()) + "; no complete checkpoint at step " + std::to_string(newest) +
                                     " or before to roll back to");
        const DataLoaderPosition diverged_at = loader.position();
        const int64_t back = resume_checkpoint(t, rc, loader, sample_rng, run, newest);
        loader.seek(diverged_at);
        guard.rolled_back();
        if (t.dist.rank == 0) {
            for (int64_t step : complete_checkpoints(rc.output_dir))
                if (step > back) remove_checkpoint(rc.output_dir, step);
            std::fprintf(stderr, "train_gpt: step %lld: diverged (skips from step %lld on); rolled back to step %lld, skipping "
                                 "the data of steps %lld-%lld (rollback %lld of %lld)\n",
                         (long long)done, (long long)d.first_skipped, (long long)back, (long long)back + 1, (long long)done,
                         (long long)guard.rollbacks(), (long long)rc.max_rollbacks);
        }
        MPI_CHECK(MPI_Barrier(t.dist.mpi));
        return back;
    }
}
