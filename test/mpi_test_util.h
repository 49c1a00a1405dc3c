// MPI for the tests. mpi_init_once: for a test process that runs on its own (no mpirun: a singleton
// MPI), initialized on first use, finalized when the process exits (the tests that link the whole
// program, train_gpt.cu, and need a communicator or NCCL on one rank call it first).
// lone_rank: such a process's communicator of one. mpi_test_device_per_rank and run_catch_session: for
// the main of a test run under mpirun.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "parallel/process_groups.h"

// Runs the test cases for the main of a test run under mpirun (test/mpi_catch_main.cpp, where Catch2's
// implementation is compiled once, with a listener that aborts the job when a rank leaves a test case
// early: its peers would wait for it in their collectives forever). `name` names the rank in failure
// reports. A test case that checks nothing fails, as in test/catch_main.cpp.
int run_catch_session(int argc, char** argv, const std::string& name);

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
