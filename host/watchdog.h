// A watchdog per rank. The training loop reports progress (beat: what it is doing, at which step); if
// none comes for --collective-timeout seconds, a rank is stuck (stopped, a stalled file system, a hung
// GPU) and the others wait for it in a collective, forever. The watchdog then names this rank and the
// operation on stderr, aborts the NCCL communicator (ncclCommAbort, after ncclCommGetAsyncError, so a
// GPU collective in flight returns) and the MPI job (MPI_Abort: every rank exits non-zero).
#pragma once

#include "parallel/mpi_api.h"
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

class Watchdog {
  public:
    // timeout_seconds <= 0: no watchdog.
    // `nccl`: every communicator this rank's collectives run on (the data group's, the tensor group's).
    Watchdog(double timeout_seconds, int rank, std::vector<ncclComm_t> nccl)
        : timeout_(timeout_seconds), rank_(rank), nccl_(std::move(nccl)) {
        beat("start-up", 0);
        if (timeout_ > 0) thread_ = std::thread([this] { watch(); });
    }
    ~Watchdog() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stop_ = true;
        }
        wake_.notify_all();
        if (thread_.joinable()) thread_.join();
    }
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;

    // Progress: `what` must be a string literal (kept by pointer).
    void beat(const char* what, int64_t step) {
        what_.store(what);
        step_.store(step);
        last_.store(now());
    }

  private:
    static int64_t now() {
        return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
    }
    void watch() {
        std::unique_lock<std::mutex> lock(mutex_);
        const auto poll = std::chrono::milliseconds(timeout_ < 10 ? 100 : 1000);
        while (!wake_.wait_for(lock, poll, [this] { return stop_; })) {
            const double idle = double(now() - last_.load()) / 1000.0;
            if (idle < timeout_) continue;
            std::fprintf(stderr,
                         "train_gpt: rank %d: watchdog: no progress for %.0f s (--collective-timeout %g) in %s, step %lld: "
                         "a rank is stuck or a collective hangs; aborting the job\n",
                         rank_, idle, timeout_, what_.load(), (long long)step_.load());
            std::fflush(stderr);
            for (ncclComm_t comm : nccl_) {
                ncclResult_t async = ncclSuccess;
                if (comm && ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess)
                    std::fprintf(stderr, "train_gpt: rank %d: NCCL reports: %s\n", rank_, ncclGetErrorString(async));
                if (comm) ncclCommAbort(comm);
            }
            MPI_Abort(MPI_COMM_WORLD, EXIT_FAILURE);
            _exit(EXIT_FAILURE);  // should MPI_Abort return
        }
    }

    const double timeout_;
    const int rank_;
    const std::vector<ncclComm_t> nccl_;
    std::atomic<const char*> what_{""};
    std::atomic<int64_t> step_{0};
    std::atomic<int64_t> last_{0};
    std::mutex mutex_;
    std::condition_variable wake_;
    bool stop_ = false;
    std::thread thread_;
};
