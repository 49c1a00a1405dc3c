// Process groups: the ranks of the run and their communicators. MPI starts the processes (one per
// GPU) and hands out the NCCL unique id; NCCL moves the tensors on a communication stream of its own.
// Works without mpirun too (one rank). Today every rank is a data-parallel rank (parallel/zero.h).
#pragma once

#define OMPI_SKIP_MPICXX 1  // the deprecated MPI C++ bindings: unused, and noisy under -Wextra
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/cuda_common.h"

// A failing NCCL or MPI call throws (kernels/cuda_common.h, "Errors") with the call, file and line.
[[noreturn]] inline void collective_fail(const char* library, const char* call, const char* file, int line,
                                         const std::string& status) {
    throw TrainGptError(std::string(library) + " error at " + file + ":" + std::to_string(line) + ": " + call + ": " +
                        status);
}
#define NCCL_CHECK(call)                                                                                          \
    do {                                                                                                          \
        ncclResult_t nccl_check_result_ = (call);                                                                 \
        if (nccl_check_result_ != ncclSuccess)                                                                    \
            collective_fail("NCCL", #call, __FILE__, __LINE__, ncclGetErrorString(nccl_check_result_));           \
    } while (0)
#define MPI_CHECK(call)                                                                                           \
    do {                                                                                                          \
        int mpi_check_result_ = (call);                                                                           \
        if (mpi_check_result_ != MPI_SUCCESS)                                                                     \
            collective_fail("MPI", #call, __FILE__, __LINE__, "code " + std::to_string(mpi_check_result_));        \
    } while (0)

struct Distributed {
    MPI_Comm mpi = MPI_COMM_WORLD;  // the ranks of this run (token counts and losses are summed over it)
    int rank = 0, world_size = 1;
    int local_rank = 0, local_size = 1;  // among the ranks of this node
    ncclComm_t nccl = nullptr;
    cudaStream_t comm_stream = nullptr;  // collectives run here, ordered against compute by events
    cudaEvent_t compute_done = nullptr, comm_done = nullptr;
};

// MPI_Init (if not done yet), pick this rank's GPU (local rank modulo the node's GPUs), create the
// NCCL communicator from a unique id broadcast by rank 0, and the communication stream and events.
inline Distributed distributed_init(int* argc, char*** argv) {
    Distributed d;
    int initialized = 0;
    MPI_CHECK(MPI_Initialized(&initialized));
    if (!initialized) MPI_CHECK(MPI_Init(argc, argv));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &d.rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &d.world_size));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d.rank, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &d.local_rank));
    MPI_CHECK(MPI_Comm_size(node, &d.local_size));
    MPI_CHECK(MPI_Comm_free(&node));
    int devices = 0;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    CUDA_CHECK(cudaSetDevice(d.local_rank % devices));

    ncclUniqueId id;
    if (d.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
    NCCL_CHECK(ncclCommInitRank(&d.nccl, d.world_size, id, d.rank));
    CUDA_CHECK(cudaStreamCreate(&d.comm_stream));
    CUDA_CHECK(cudaEventCreateWithFlags(&d.compute_done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&d.comm_done, cudaEventDisableTiming));
    return d;
}

// A one-rank "run" inside a larger one (tests compare a distributed run with a single-process run on
// every rank). Every rank of `world` must call it together (communicator creation is collective).
inline Distributed distributed_single(const Distributed& world) {
    Distributed d;
    d.mpi = MPI_COMM_SELF;
    d.local_rank = world.local_rank;
    ncclUniqueId id;
    NCCL_CHECK(ncclGetUniqueId(&id));
    NCCL_CHECK(ncclCommInitRank(&d.nccl, 1, id, 0));
    CUDA_CHECK(cudaStreamCreate(&d.comm_stream));
    CUDA_CHECK(cudaEventCreateWithFlags(&d.compute_done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&d.comm_done, cudaEventDisableTiming));
    return d;
}

// Releases the communicator, stream and events (not MPI: see distributed_finalize).
inline void distributed_release(Distributed& d) {
    if (d.nccl) NCCL_CHECK(ncclCommDestroy(d.nccl));
    if (d.comm_stream) CUDA_CHECK(cudaStreamDestroy(d.comm_stream));
    if (d.compute_done) CUDA_CHECK(cudaEventDestroy(d.compute_done));
    if (d.comm_done) CUDA_CHECK(cudaEventDestroy(d.comm_done));
    d = Distributed{};
}

inline void distributed_finalize(Distributed& d) {
    distributed_release(d);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

// Sums over the run's ranks, on the host (token counts known before the backward pass, losses).
inline long long all_ranks_sum(const Distributed& d, long long value) {
    long long total = 0;
    MPI_CHECK(MPI_Allreduce(&value, &total, 1, MPI_LONG_LONG, MPI_SUM, d.mpi));
    return total;
}
inline double all_ranks_sum(const Distributed& d, double value) {
    double total = 0;
    MPI_CHECK(MPI_Allreduce(&value, &total, 1, MPI_DOUBLE, MPI_SUM, d.mpi));
    return total;
}
