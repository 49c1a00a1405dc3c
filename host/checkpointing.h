// How a run writes a checkpoint across its ranks (the files themselves: host/checkpoint.h): check the
// free space for its known size, write in phases that every rank agrees on, and on any failure remove
// what was written and go on training, so a full disk costs a checkpoint, never the run or an older
// checkpoint.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "host/checkpoint.h"
#include "host/config.h"
#include "parallel/process_groups.h"

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
