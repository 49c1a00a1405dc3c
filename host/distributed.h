// Distributed setup: MPI starts the processes (one per GPU) and hands out the NCCL unique id; NCCL
// moves the tensors on a communication stream of its own. Works without mpirun too (one rank).
#pragma once

#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/cuda_common.h"

#define NCCL_CHECK(call)                                                                                 \
    do {                                                                                                 \
        ncclResult_t nccl_check_result_ = (call);                                                        \
        if (nccl_check_result_ != ncclSuccess) {                                                         \
            std::fprintf(stderr, "NCCL error at %s:%d: %s: %s\n", __FILE__, __LINE__, #call,              \
                         ncclGetErrorString(nccl_check_result_));                                        \
            std::exit(EXIT_FAILURE);                                                                     \
        }                                                                                                \
    } while (0)

#define MPI_CHECK(call)                                                                                  \
    do {                                                                                                 \
        int mpi_check_result_ = (call);                                                                  \
        if (mpi_check_result_ != MPI_SUCCESS) {                                                          \
            std::fprintf(stderr, "MPI error at %s:%d: %s: code %d\n", __FILE__, __LINE__, #call,          \
                         mpi_check_result_);                                                             \
            std::exit(EXIT_FAILURE);                                                                     \
        }                                                                                                \
    } while (0)

struct Distributed {
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

inline void distributed_finalize(Distributed& d) {
    if (d.nccl) NCCL_CHECK(ncclCommDestroy(d.nccl));
    if (d.comm_stream) CUDA_CHECK(cudaStreamDestroy(d.comm_stream));
    if (d.compute_done) CUDA_CHECK(cudaEventDestroy(d.compute_done));
    if (d.comm_done) CUDA_CHECK(cudaEventDestroy(d.comm_done));
    d = Distributed{};
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

// Sum of an int64 over all ranks (host side: token counts, known before the backward pass).
inline long long all_ranks_sum(long long value) {
    long long total = 0;
    MPI_CHECK(MPI_Allreduce(&value, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));
    return total;
}
