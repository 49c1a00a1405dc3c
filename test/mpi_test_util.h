// MPI for the tests. mpi_init_once: for a test process that runs on its own (no mpirun: a singleton
// MPI), initialized on first use, finalized when the process exits (the tests that link the whole
// program, train_gpt.cu, and need a communicator or NCCL on one rank call it first).
// lone_rank: such a process's communicator of one. mpi_test_device_per_rank: for the main of a test
// run under mpirun.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "parallel/process_groups.h"

#ifdef CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

// The main of a test run under mpirun (CATCH_CONFIG_RUNNER): a rank that leaves a test case early (a
// failed REQUIRE, an unexpected exception, a fatal signal) has also left the collectives its peers
// are in, and they would wait for it forever. (Seen: rank 0's single-process baseline threw on an
// emulated cuBLASLt failure under memory pressure, and the np2 and np4 runs hung for 20 minutes.) So
// once Catch has reported such a test case, its rank aborts the job: mpirun ends every rank and exits
// non-zero. A failed CHECK goes on, as the ranks do.
struct AbortJobWhenARankLeaves : Catch::TestEventListenerBase {
    using TestEventListenerBase::TestEventListenerBase;
    bool left_early = false;
    bool assertionEnded(const Catch::AssertionStats& stats) override {
        const Catch::AssertionResult& r = stats.assertionResult;
        if (!r.isOk() && (r.getResultType() == Catch::ResultWas::ThrewException ||
                          r.getResultType() == Catch::ResultWas::FatalErrorCondition ||
                          !Catch::shouldContinueOnFailure(r.m_info.resultDisposition)))
            left_early = true;
        return true;
    }
    void testCaseEnded(const Catch::TestCaseStats& stats) override {
        if (!left_early) return;
        std::fflush(stdout);
        std::fprintf(stderr, "%s: this rank left the test case early (a failed REQUIRE or an exception, reported above); "
                             "aborting the job, whose other ranks would wait for it\n",
                     stats.testInfo.name.c_str());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, EXIT_FAILURE);
    }
};
CATCH_REGISTER_LISTENER(AbortJobWhenARankLeaves)
#endif

inline void mpi_init_once() {
    int initialized = 0;
    MPI_CHECK(MPI_Initialized(&initialized));
    if (initialized) return;
    MPI_CHECK(MPI_Init(nullptr, nullptr));
    std::atexit([] { MPI_Finalize(); });
}

// One rank on its own (parallel/process_groups.h; a singleton MPI needs no mpirun).
inline Distributed lone_rank() {
    mpi_init_once();
    return distributed_single(Distributed{});
}

// For the main of a test run under mpirun (MPI started): picks this rank's GPU by its index on its
// node and says whether every rank has a device of its own. NCCL refuses two ranks on one GPU, so on a
// node with fewer GPUs than ranks there is nothing to run on: rank 0 prints why, and every rank should
// exit with the skip code (tests.cmake: SKIP_RETURN_CODE 77), so CTest reports the test skipped, not
// passed. The emulator gives every process a device of its own.
inline bool mpi_test_device_per_rank(const char* test) {
    int world_rank = 0;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node));
    int local_rank = 0, local_size = 1, devices = 0;
    MPI_CHECK(MPI_Comm_rank(node, &local_rank));
    MPI_CHECK(MPI_Comm_size(node, &local_size));
    MPI_CHECK(MPI_Comm_free(&node));
    if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
    if (devices > 0) CUDA_CHECK(cudaSetDevice(local_rank % devices));
    int enough = kEmulatedDevice ? devices > 0 : local_size <= devices;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &enough, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (!enough && world_rank == 0)
        std::printf("%s: SKIPPED: %d rank(s) on a node with %d GPU(s); NCCL needs one GPU per rank\n", test, local_size,
                    devices);
    return enough != 0;
}
