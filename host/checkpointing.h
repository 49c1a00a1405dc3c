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
    const Distributed& dist;   // every rank of the run: they agree, write and read together
    ShardedAdamW& optimizer;
    cudaStream_t stream;
    size_t num_parameters = 0;  // of the whole model (the files')
    size_t parameter_bytes = 0;  // per parameter in the model file
    // Collective (every rank calls it): the whole model's parameters brought to rank 0, and what then
    // writes them there as an llm.c model file.
    std::function<std::function<void(const std::string& path)>()> gather_model;
    std::function<void(const std::string& path)> load_model;  // this rank's parameters from a model file
    std::function<float()> parameter_norm;                     // over all ranks: not finite on NaN or Inf
    std::function<void(const char* what, int64_t step)> progress;  // for the watchdog
    // World rank r's optimizer range as pieces of the whole model's flat buffer (parallel/tensor.h).
    std::function<std::vector<StatePiece>(int rank)> state_pieces;
};

// The state file is written and read in the whole model's layout, in `world` equal contiguous ranges
// (the last shorter): rank k writes range k and, on resume, reads it. Whatever the ZeRO stage, data
// and tensor ranks, the ranks exchange the pieces of their optimizer ranges with the ranges' ranks.
struct StateRange {
    uint64_t begin = 0, count = 0;
};
inline StateRange state_range_of(uint64_t num_parameters, int world, int rank) {
    const uint64_t per = (num_parameters + uint64_t(world) - 1) / uint64_t(world);
    const uint64_t begin = std::min(num_parameters, per * uint64_t(rank));
    return {begin, std::min(num_parameters, begin + per) - begin};
}

namespace checkpoint_exchange {

// Calls f(piece part, begin within the piece) for each part of `pieces` (owned ones only when
// `owned_only`) that lies in range r, in the pieces' order.
template <typename F>
inline void for_each_in_range(const std::vector<StatePiece>& pieces, StateRange r, bool owned_only, F&& f) {
    for (const StatePiece& p : pieces) {
        if (owned_only && !p.owned) continue;
        const uint64_t begin = std::max(p.whole, r.begin), end = std::min(p.whole + p.count, r.begin + r.count);
        if (begin < end) f(StatePiece{begin, p.local + (begin - p.whole), end - begin, p.owned});
    }
}

inline int mpi_count(uint64_t n) {
    if (n > uint64_t(INT32_MAX))
        throw std::runtime_error("checkpoint: " + std::to_string(n) + " floats to exchange with one rank, more than MPI's "
                                 "int counts allow; use more ranks");
    return int(n);
}

// One all-to-all of the three arrays: send[r] holds what goes to rank r (counts[r] floats each).
inline void all_to_all(const Distributed& d, const std::vector<std::vector<float>>& send, std::vector<std::vector<float>>& receive,
                       int arrays) {
    const int W = d.world_size;
    std::vector<int> send_counts(W), send_displs(W), receive_counts(W), receive_displs(W);
    for (int a = 0; a < arrays; ++a) {
        std::vector<float> out, in;
        uint64_t total_out = 0, total_in = 0;
        for (int r = 0; r < W; ++r) {
            const uint64_t n_out = send[r].size() / arrays, n_in = receive[r].size() / arrays;
            send_counts[r] = mpi_count(n_out), receive_counts[r] = mpi_count(n_in);
            send_displs[r] = mpi_count(total_out), receive_displs[r] = mpi_count(total_in);
            total_out += n_out, total_in += n_in;
        }
        out.reserve(total_out);
        for (int r = 0; r < W; ++r) {
            const uint64_t n = send[r].size() / arrays;
            out.insert(out.end(), send[r].begin() + ptrdiff_t(a * n), send[r].begin() + ptrdiff_t((a + 1) * n));
        }
        in.resize(total_in);
        MPI_CHECK(MPI_Alltoallv(out.data(), send_counts.data(), send_displs.data(), MPI_FLOAT, in.data(), receive_counts.data(),
                                receive_displs.data(), MPI_FLOAT, d.mpi));
        for (int r = 0; r < W; ++r) {
            const uint64_t n = receive[r].size() / arrays;
            std::copy(in.begin() + receive_displs[r], in.begin() + receive_displs[r] + ptrdiff_t(n),
                      receive[r].begin() + ptrdiff_t(a * n));
        }
    }
}

}  // namespace checkpoint_exchange

// Collective: this rank's state range (state_range_of) in the whole model's layout, from the ranks whose
// optimizer ranges own its pieces. Throws when the owned pieces do not tile the range exactly.
inline OptimizerState gather_state_range(const CheckpointedTraining& t, StateRange mine) {
    using namespace checkpoint_exchange;
    const int W = t.dist.world_size, me = t.dist.rank;
    const OptimizerState o = download_optimizer_state(t.optimizer, t.optimizer.shard.optimizer_size(), t.stream);
    const std::vector<StatePiece> my_pieces = t.state_pieces(me);
    std::vector<std::vector<float>> send(W), receive(W);
    for (int r = 0; r < W; ++r) {
        const StateRange theirs = state_range_of(t.num_parameters, W, r);
        std::vector<float>& out = send[r];
        for (const std::vector<float>* array : {&o.master, &o.adam_m, &o.adam_v})
            for_each_in_range(my_pieces, theirs, true, [&](const StatePiece& p) {
                out.insert(out.end(), array->begin() + ptrdiff_t(p.local), array->begin() + ptrdiff_t(p.local + p.count));
            });
    }
    std::vector<std::vector<StatePiece>> received_pieces(W);
    for (int r = 0; r < W; ++r) {
        uint64_t n = 0;
        for_each_in_range(t.state_pieces(r), mine, true, [&](const StatePiece& p) {
            received_pieces[r].push_back(p);
            n += p.count;
        });
        receive[r].resize(3 * n);
    }
    all_to_all(t.dist, send, receive, 3);
    OptimizerState s{std::vector<float>(mine.count), std::vector<float>(mine.count), std::vector<float>(mine.count)};
    uint64_t covered = 0;
    for (int r = 0; r < W; ++r) {
        const uint64_t n = receive[r].size() / 3;
        uint64_t at = 0;
        for (const StatePiece& p : received_pieces[r]) {
            const ptrdiff_t to = ptrdiff_t(p.whole - mine.begin);
            for (int a = 0; a < 3; ++a) {
                std::vector<float>& dst = a == 0 ? s.master : a == 1 ? s.adam_m : s.adam_v;
                std::copy(receive[r].begin() + ptrdiff_t(a * n + at), receive[r].begin() + ptrdiff_t(a * n + at + p.count),
                          dst.begin() + to);
            }
            at += p.count;
            covered += p.count;
        }
    }
    if (covered != mine.count)
        throw TrainGptError("checkpoint: the ranks' optimizer ranges cover " + std::to_string(covered) + " of the " +
                            std::to_string(mine.count) + " parameters of rank " + std::to_string(me) + "'s state range");
    return s;
}

// Collective, the inverse: every rank's optimizer range (optimizer_size() long, padding zero) from the
// state ranges the ranks read (`mine`, this rank's, in `range`).
inline OptimizerState scatter_state_range(const CheckpointedTraining& t, StateRange mine, const OptimizerState& range) {
    using namespace checkpoint_exchange;
    const int W = t.dist.world_size, me = t.dist.rank;
    std::vector<std::vector<float>> send(W), receive(W);
    for (int r = 0; r < W; ++r)
        for (const std::vector<float>* array : {&range.master, &range.adam_m, &range.adam_v})
            for_each_in_range(t.state_pieces(r), mine, false, [&](const StatePiece& p) {
                const ptrdiff_t from = ptrdiff_t(p.whole - mine.begin);
                send[r].insert(send[r].end(), array->begin() + from, array->begin() + from + ptrdiff_t(p.count));
            });
    const std::vector<StatePiece> my_pieces = t.state_pieces(me);
    for (int r = 0; r < W; ++r) {
        uint64_t n = 0;
        for_each_in_range(my_pieces, state_range_of(t.num_parameters, W, r), false, [&](const StatePiece& p) { n += p.count; });
        receive[r].resize(3 * n);
    }
    all_to_all(t.dist, send, receive, 3);
    const size_t size = t.optimizer.shard.optimizer_size();
    OptimizerState o{std::vector<float>(size), std::vector<float>(size), std::vector<float>(size)};
    for (int r = 0; r < W; ++r) {
        const uint64_t n = receive[r].size() / 3;
        uint64_t at = 0;
        for_each_in_range(my_pieces, state_range_of(t.num_parameters, W, r), false, [&](const StatePiece& p) {
            for (int a = 0; a < 3; ++a) {
                std::vector<float>& dst = a == 0 ? o.master : a == 1 ? o.adam_m : o.adam_v;
                std::copy(receive[r].begin() + ptrdiff_t(a * n + at), receive[r].begin() + ptrdiff_t(a * n + at + p.count),
                          dst.begin() + ptrdiff_t(p.local));
            }
            at += p.count;
        });
    }
    return o;
}

// Writes step `step`'s checkpoint: the model (llm.c format, rank 0, gathered from the tensor ranks'
// slices) and the training state (each rank its state range, gathered from the optimizer ranges that
// hold it). With --keep-last, which retires older
// checkpoints, each rank then reads its part back and verifies it against its checksums: a checkpoint
// that does not verify is removed like a failed write, so the older ones are never deleted for a
// newer one that could not be resumed. Returns false when it was skipped (see
// write_checkpoint_agreed). Never from non-finite parameters: that throws.
inline bool save_checkpoint(const CheckpointedTraining& t, const RunConfig& rc, const RunInfo& run, int64_t step,
                            const DataLoaderPosition& loader, uint64_t sample_rng) {
    const int rank = t.dist.rank;
    const std::string state_path = state_checkpoint_path(rc.output_dir, step);
    if (!std::isfinite(t.parameter_norm()))
        throw std::runtime_error("step " + std::to_string(step) + ": parameters are not finite (NaN or Inf); no checkpoint "
                                 "written");
    const std::string meta = run_metadata(rc, run.id, run.tokens_per_step);
    // Collective, before any file is touched: what each rank will write.
    const auto write_model_file = t.gather_model();
    const StateRange range = state_range_of(t.num_parameters, t.dist.world_size, rank);
    const OptimizerState state = gather_state_range(t, range);
    const size_t begin = range.begin, count = range.count;
    const uint64_t writers = uint64_t(t.dist.world_size);  // one checksum record per rank
    auto write_model = [&] {  // and the state file's header
        write_model_file(model_checkpoint_path(rc.output_dir, step));
        begin_state_file(state_path, TrainingState{step, t.num_parameters, {uint64_t(rc.seed), sample_rng, 0, 0},
                                                   loader.epoch, loader.shard, loader.sample, meta, writers});
    };
    auto write_optimizer_range = [&] {
        write_state_range(state_path, t.num_parameters, uint64_t(rank), begin, state.master.data(), state.adam_m.data(),
                          state.adam_v.data(), count);
    };
    const bool writes_range = count > 0;
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
    const StateRange range = state_range_of(t.num_parameters, t.dist.world_size, t.dist.rank);
    for (int64_t step : steps) {
        t.progress("reading a checkpoint", step);  // a rollback reads one with the watchdog running
        const std::string state_path = state_checkpoint_path(rc.output_dir, step);
        const TrainingState st = read_state_header(state_path);
        const ResumedRun resumed = check_resume(state_path, st.meta_json, rc, run->tokens_per_step);
        if (st.num_parameters != t.num_parameters)
            throw std::runtime_error("state '" + state_path + "': num_parameters differs from the model");
        // Each rank reads its state range (no collective here: a rank that fails must not leave the
        // others waiting); once all have read, the ranges are exchanged into the optimizer ranges.
        OptimizerState read{std::vector<float>(range.count), std::vector<float>(range.count), std::vector<float>(range.count)};
        std::string problem;
        try {
            t.load_model(model_checkpoint_path(rc.output_dir, step));
            if (range.count > 0)
                read_state_range(state_path, st, range.begin, range.count, read.master.data(), read.adam_m.data(),
                                 read.adam_v.data());
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
        upload_optimizer_state(t.optimizer, scatter_state_range(t, range, read), int(st.step), t.stream);
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
