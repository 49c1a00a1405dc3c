// Preemption: SIGTERM, or SIGUSR1 (what Slurm's --signal=USR1@SECONDS sends before a time limit, and
// what OpenMPI's mpirun forwards to its ranks), asks the training loop to stop. It finishes the step
// it is in, writes a checkpoint there (with -o), and exits with kPreemptedExitCode, so a wrapper can
// tell "preempted, resume me" (scripts/run_gpt2.sh, the sbatch script) from success and failure.
#pragma once

#include <csignal>

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
