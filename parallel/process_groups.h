// Process groups: the ranks of the run and their communicators. MPI starts the processes (one per
// GPU) and hands out the NCCL unique id; NCCL moves the tensors on a communication stream of its own.
// Works without mpirun too (one rank). Today every rank is a data-parallel rank (parallel/zero.h).
#pragma once

#include "parallel/mpi_api.h"
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

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

// ---------------------------------------------------------------------------------------------
// The process grid, which tensor, context and pipeline parallelism build their groups from (the layout
// of picotron's process_group_manager and Megatron's parallel_state): the world's ranks arranged as
// data x pipeline x context x tensor, tensor-parallel ranks adjacent (they exchange the most, so they
// share a node), then context, pipeline, data. A rank's group along an axis: the ranks that differ
// from it in that coordinate only. Today every run is data x 1 x 1 x 1: its data group is the world.

enum class Axis { tensor, context, pipeline, data };
constexpr Axis kAxes[] = {Axis::tensor, Axis::context, Axis::pipeline, Axis::data};  // fastest-varying first
inline const char* axis_name(Axis a) {
    return a == Axis::tensor ? "tensor" : a == Axis::context ? "context" : a == Axis::pipeline ? "pipeline" : "data";
}

// Ranks along each axis (the grid's shape), or one rank's coordinates in it.
struct GridCoordinates {
    int tensor = 1, context = 1, pipeline = 1, data = 1;
    int& operator[](Axis a) { return a == Axis::tensor ? tensor : a == Axis::context ? context : a == Axis::pipeline ? pipeline : data; }
    int operator[](Axis a) const { return const_cast<GridCoordinates&>(*this)[a]; }
    int product() const { return tensor * context * pipeline * data; }
};

// "" when `shape` (every axis >= 1) spans exactly `world_size` ranks, else why not.
inline std::string grid_problem(const GridCoordinates& shape, int world_size) {
    for (Axis a : kAxes)
        if (shape[a] < 1) return std::string(axis_name(a)) + "-parallel size " + std::to_string(shape[a]) + " must be at least 1";
    if (shape.product() != world_size)
        return "tensor x context x pipeline x data = " + std::to_string(shape.tensor) + " x " + std::to_string(shape.context) +
               " x " + std::to_string(shape.pipeline) + " x " + std::to_string(shape.data) + " = " +
               std::to_string(shape.product()) + " ranks, but the world has " + std::to_string(world_size);
    return "";
}

// A rank's coordinates in the grid, and back.
inline GridCoordinates grid_position(int rank, const GridCoordinates& shape) {
    GridCoordinates at;
    for (Axis a : kAxes) {
        at[a] = rank % shape[a];
        rank /= shape[a];
    }
    return at;
}
inline int grid_rank(const GridCoordinates& at, const GridCoordinates& shape) {
    int rank = 0;
    for (int i = 3; i >= 0; --i) rank = rank * shape[kAxes[i]] + at[kAxes[i]];
    return rank;
}

// The world ranks of `rank`'s group along `axis`, in the order of that coordinate (group rank i is
// the i-th).
inline std::vector<int> group_ranks(int rank, const GridCoordinates& shape, Axis axis) {
    GridCoordinates at = grid_position(rank, shape);
    std::vector<int> ranks;
    for (int i = 0; i < shape[axis]; ++i) {
        at[axis] = i;
        ranks.push_back(grid_rank(at, shape));
    }
    return ranks;
}

// One group's communicators: MPI (host values) and NCCL (device tensors); rank and size within it.
struct ProcessGroup {
    MPI_Comm mpi = MPI_COMM_NULL;
    ncclComm_t nccl = nullptr;
    int rank = 0, size = 1;
};

// Creates this rank's group along `axis`, or over two axes: the ranks that differ from it in `axis` and
// `outer` only, group rank at[outer] x shape[axis] + at[axis] (context parallelism's gradients are
// reduced over the context and data axes together). Collective over the whole world: every rank calls
// it with the same shape and axes (each belongs to exactly one group). Group rank 0 makes the NCCL id
// and broadcasts it over the group's MPI communicator.
inline ProcessGroup make_process_group(const GridCoordinates& shape, int world_rank, Axis axis, Axis outer) {
    const GridCoordinates at = grid_position(world_rank, shape);
    GridCoordinates first = at;  // the group's rank 0 names it
    first[axis] = 0;
    const bool two_axes = outer != axis;
    if (two_axes) first[outer] = 0;
    ProcessGroup g;
    g.rank = two_axes ? at[outer] * shape[axis] + at[axis] : at[axis];
    g.size = two_axes ? shape[outer] * shape[axis] : shape[axis];
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, grid_rank(first, shape), g.rank, &g.mpi));
    ncclUniqueId id;
    if (g.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, g.mpi));
    NCCL_CHECK(ncclCommInitRank(&g.nccl, g.size, id, g.rank));
    return g;
}

inline ProcessGroup make_process_group(const GridCoordinates& shape, int world_rank, Axis axis) {
    return make_process_group(shape, world_rank, axis, axis);
}

inline void release_process_group(ProcessGroup& g) {
    if (g.nccl) NCCL_CHECK(ncclCommDestroy(g.nccl));
    if (g.mpi != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&g.mpi));
    g = ProcessGroup{};
}
