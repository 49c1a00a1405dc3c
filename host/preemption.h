// Preemption: SIGTERM, or SIGUSR1 (what Slurm's --signal=USR1@SECONDS sends before a time limit, and
// what OpenMPI's mpirun forwards to its ranks), asks the training loop to stop. It finishes the step
// it is in, writes a checkpoint there (with -o), and exits with kPreemptedExitCode, so a wrapper can
// tell "preempted, resume me" (scripts/run_gpt2.sh, the sbatch script) from success and failure.
#pragma once

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <functional>

#include "parallel/process_groups.h"

constexpr int kPreemptedExitCode = 75;  // EX_TEMPFAIL (sysexits.h): temporary failure, try again later

namespace preemption_detail {
inline volatile std::sig_atomic_t stop_signal = 0;
extern "C" inline void record(int signal) { stop_signal = signal; }
}  // namespace preemption_detail

// SIGTERM and SIGUSR1 set the flag (and interrupt nothing: SA_RESTART).
inline void install_preemption_handlers() {
    struct sigaction action {};
    action.sa_handler = preemption_detail::record;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &action, nullptr);
    sigaction(SIGUSR1, &action, nullptr);
}

// The signal received so far (0: none).
inline int stop_signal_received() { return preemption_detail::stop_signal; }
inline const char* signal_name(int signal) { return signal == SIGTERM ? "SIGTERM" : signal == SIGUSR1 ? "SIGUSR1" : "a signal"; }

// After step `done`: whether the run stops there. The ranks agree (a signal may reach them at different
// moments), so all stop after the same step; then `save()` writes that step's checkpoint when there is
// an output dir and none was attempted after it yet (`attempted`; `saved`: it was written), and rank 0
// says why the run stops.
inline bool stop_requested(const Distributed& d, int64_t done, bool has_output, bool attempted, bool saved,
                           const std::function<bool()>& save) {
    if (all_ranks_sum(d, (long long)(stop_signal_received() != 0)) == 0) return false;
    if (has_output && !attempted) saved = save();
    if (d.rank == 0) {
        const int signal = stop_signal_received();
        std::fprintf(stderr, "train_gpt: %s: stopped after step %lld, %s; exit status %d (resume with -y)\n",
                     signal ? signal_name(signal) : "a stop signal on another rank", (long long)done,
                     !has_output ? "no checkpoint (no -o)"
                     : saved     ? "its checkpoint is written"
                                 : "its checkpoint could not be written (see above)",
                     kPreemptedExitCode);
    }
    return true;
}
