// MPI for a test process that runs on its own (no mpirun: a singleton MPI): initialized on first
// use, finalized when the process exits. The tests that link the whole program (train_gpt.cu) and
// need a communicator or NCCL on one rank call this first.
#pragma once

#include <cstdlib>

#include "parallel/process_groups.h"

inline void mpi_init_once() {
    int initialized = 0;
    MPI_CHECK(MPI_Initialized(&initialized));
    if (initialized) return;
    MPI_CHECK(MPI_Init(nullptr, nullptr));
    std::atexit([] { MPI_Finalize(); });
}
