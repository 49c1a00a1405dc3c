// MPI for a world of one process: the subset of the MPI C API this project calls, for builds without
// an MPI library (make MPI=0). A GPU machine without OpenMPI's headers and libraries (no Debian -dev
// packages, no network) still builds and runs the program on its one GPU; NCCL needs no MPI there
// (with one rank, its unique id goes to no one).
//
// Every communicator has one rank, so each collective is what MPI defines it to be for one rank:
// Allreduce, Allgather and Alltoall copy the send buffer to the receive buffer (nothing with
// MPI_IN_PLACE), Bcast, Ibcast and Barrier do nothing, Comm_split gives a communicator of the caller alone.
// A launcher that started more than one process (OpenMPI's mpirun, MPICH's mpiexec, srun) is refused at
// MPI_Init with one line naming the variable that says so: N copies of one rank would each train
// alone and overwrite one another's files.
//
// Included through parallel/mpi_api.h only, never beside <mpi.h>.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

using MPI_Comm = int;
using MPI_Datatype = int;
using MPI_Op = int;
using MPI_Info = int;
using MPI_Errhandler = int;

inline constexpr int MPI_SUCCESS = 0;
inline constexpr int MPI_ERR_OTHER = 16;  // the one error code used here: an unknown datatype, a bad count, a peer
inline constexpr int MPI_MAX_ERROR_STRING = 256;

inline constexpr MPI_Comm MPI_COMM_NULL = 0;
inline constexpr MPI_Comm MPI_COMM_WORLD = 1;
inline constexpr MPI_Comm MPI_COMM_SELF = 2;
inline constexpr MPI_Comm kSingleProcessSplitComm = 3;  // what Comm_split / Comm_split_type return

inline constexpr int MPI_COMM_TYPE_SHARED = 1;
inline constexpr MPI_Info MPI_INFO_NULL = 0;
inline constexpr MPI_Errhandler MPI_ERRORS_RETURN = 1;

// Datatypes: distinct values, their sizes from datatype_bytes; ops are never applied (one rank).
inline constexpr MPI_Datatype MPI_BYTE = 101, MPI_INT = 4, MPI_FLOAT = 104, MPI_DOUBLE = 8, MPI_LONG_LONG = 108,
                               MPI_INT64_T = 208, MPI_DATATYPE_NULL = 0;
inline constexpr MPI_Op MPI_SUM = 1, MPI_MIN = 2, MPI_MAX = 3;
// Point to point: a world of one has no peer (the emulated NCCL pairs a rank's messages to itself
// without MPI), so these only fail.
using MPI_Request = int;
inline constexpr MPI_Request MPI_REQUEST_NULL = 0;
struct MPI_Status {
    int MPI_SOURCE = 0, MPI_TAG = 0, MPI_ERROR = 0;
};
#define MPI_IN_PLACE (reinterpret_cast<void*>(static_cast<std::uintptr_t>(1)))
#define MPI_STATUS_IGNORE (static_cast<MPI_Status*>(nullptr))

namespace single_process_mpi {

inline int& state() {  // 0: not initialized, 1: initialized, 2: finalized
    static int s = 0;
    return s;
}

inline size_t datatype_bytes(MPI_Datatype t) {
    switch (t) {
        case MPI_BYTE: return 1;
        case MPI_INT: case MPI_FLOAT: return 4;
        case MPI_DOUBLE: case MPI_LONG_LONG: case MPI_INT64_T: return 8;
        default: return 0;
    }
}

// The copy a one-rank collective makes: `count` elements of `type` from send to recv.
inline int copy_to_receive(const void* send, void* recv, int count, MPI_Datatype type) {
    const size_t element = datatype_bytes(type);
    if (element == 0 || count < 0) return MPI_ERR_OTHER;
    if (send != MPI_IN_PLACE && send != recv && count > 0) std::memmove(recv, send, size_t(count) * element);
    return MPI_SUCCESS;
}

// The number of processes a launcher says it started, and the variable that says it (0 when none does).
inline int launcher_world_size(const char** variable) {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"}) {
        if (const char* value = std::getenv(name)) {
            *variable = name;
            return std::atoi(value);
        }
    }
    return 0;
}

}  // namespace single_process_mpi

inline int MPI_Initialized(int* flag) {
    *flag = single_process_mpi::state() != 0;
    return MPI_SUCCESS;
}
inline int MPI_Finalized(int* flag) {
    *flag = single_process_mpi::state() == 2;
    return MPI_SUCCESS;
}
inline int MPI_Init(int*, char***) {
    const char* variable = nullptr;
    const int launched = single_process_mpi::launcher_world_size(&variable);
    if (launched > 1) {
        std::fprintf(stderr,
                     "error: this build has no MPI (built with make MPI=0), so it runs one process alone, but the "
                     "launcher started %d (%s=%d): rebuild without MPI=0 for more ranks, or run one "
                     "process without mpirun\n",
                     launched, variable, launched);
        std::exit(EXIT_FAILURE);
    }
    single_process_mpi::state() = 1;
    return MPI_SUCCESS;
}
inline int MPI_Finalize() {
    single_process_mpi::state() = 2;
    return MPI_SUCCESS;
}
// MPI ends every process of the job; here there is one.
[[noreturn]] inline int MPI_Abort(MPI_Comm, int errorcode) {
    std::fflush(nullptr);
    std::_Exit(errorcode);
}

inline int MPI_Comm_rank(MPI_Comm, int* rank) {
    *rank = 0;
    return MPI_SUCCESS;
}
inline int MPI_Comm_size(MPI_Comm, int* size) {
    *size = 1;
    return MPI_SUCCESS;
}
inline int MPI_Comm_split(MPI_Comm, int, int, MPI_Comm* out) {
    *out = kSingleProcessSplitComm;
    return MPI_SUCCESS;
}
inline int MPI_Comm_split_type(MPI_Comm, int, int, MPI_Info, MPI_Comm* out) {
    *out = kSingleProcessSplitComm;
    return MPI_SUCCESS;
}
inline int MPI_Comm_free(MPI_Comm* comm) {
    *comm = MPI_COMM_NULL;
    return MPI_SUCCESS;
}
inline int MPI_Comm_set_errhandler(MPI_Comm, MPI_Errhandler) { return MPI_SUCCESS; }
inline int MPI_Error_string(int code, char* text, int* length) {
    *length = std::snprintf(text, MPI_MAX_ERROR_STRING, "single-process MPI: error %d (an unknown datatype, a negative count, or a message to another rank in a world of one)", code);
    return MPI_SUCCESS;
}

inline int MPI_Barrier(MPI_Comm) { return MPI_SUCCESS; }
inline int MPI_Bcast(void*, int, MPI_Datatype type, int root, MPI_Comm) {
    return single_process_mpi::datatype_bytes(type) && root == 0 ? MPI_SUCCESS : MPI_ERR_OTHER;
}
// Complete at once, as a one-rank broadcast is (test_mpi_train shares rank 0's baseline this way).
inline int MPI_Ibcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm, MPI_Request* request) {
    *request = MPI_REQUEST_NULL;
    return MPI_Bcast(buffer, count, type, root, comm);
}
inline int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op, MPI_Comm) {
    return single_process_mpi::copy_to_receive(send, recv, count, type);
}
inline int MPI_Allgather(const void* send, int send_count, MPI_Datatype send_type, void* recv, int recv_count,
                         MPI_Datatype recv_type, MPI_Comm) {
    if (send == MPI_IN_PLACE) return MPI_SUCCESS;
    if (single_process_mpi::datatype_bytes(send_type) * send_count != single_process_mpi::datatype_bytes(recv_type) * recv_count)
        return MPI_ERR_OTHER;
    return single_process_mpi::copy_to_receive(send, recv, send_count, send_type);
}
// Rank 0's part from itself to its place (test_mpi_train gathers the model parts this way).
inline int MPI_Allgatherv(const void* send, int send_count, MPI_Datatype send_type, void* recv, const int* recv_counts,
                          const int* recv_displs, MPI_Datatype recv_type, MPI_Comm) {
    const size_t recv_bytes = single_process_mpi::datatype_bytes(recv_type);
    if (single_process_mpi::datatype_bytes(send_type) * size_t(send_count) != recv_bytes * size_t(recv_counts[0]))
        return MPI_ERR_OTHER;
    if (send == MPI_IN_PLACE) return MPI_SUCCESS;
    return single_process_mpi::copy_to_receive(send, static_cast<char*>(recv) + size_t(recv_displs[0]) * recv_bytes, send_count,
                                               send_type);
}
inline int MPI_Alltoall(const void* send, int send_count, MPI_Datatype send_type, void* recv, int recv_count,
                        MPI_Datatype recv_type, MPI_Comm comm) {
    return MPI_Allgather(send, send_count, send_type, recv, recv_count, recv_type, comm);
}
// Rank 0's block from itself to itself (the checkpoint state exchange on one rank).
inline int MPI_Alltoallv(const void* send, const int* send_counts, const int* send_displs, MPI_Datatype send_type, void* recv,
                         const int* recv_counts, const int* recv_displs, MPI_Datatype recv_type, MPI_Comm) {
    const size_t send_bytes = single_process_mpi::datatype_bytes(send_type), recv_bytes = single_process_mpi::datatype_bytes(recv_type);
    if (send_bytes * size_t(send_counts[0]) != recv_bytes * size_t(recv_counts[0])) return MPI_ERR_OTHER;
    return single_process_mpi::copy_to_receive(static_cast<const char*>(send) + size_t(send_displs[0]) * send_bytes,
                                               static_cast<char*>(recv) + size_t(recv_displs[0]) * recv_bytes, send_counts[0],
                                               send_type);
}
inline int MPI_Send(const void*, int, MPI_Datatype, int, int, MPI_Comm) { return MPI_ERR_OTHER; }
inline int MPI_Recv(void*, int, MPI_Datatype, int, int, MPI_Comm, MPI_Status*) { return MPI_ERR_OTHER; }
inline int MPI_Issend(const void*, int, MPI_Datatype, int, int, MPI_Comm, MPI_Request*) { return MPI_ERR_OTHER; }
inline int MPI_Irecv(void*, int, MPI_Datatype, int, int, MPI_Comm, MPI_Request*) { return MPI_ERR_OTHER; }
inline int MPI_Test(MPI_Request* request, int* flag, MPI_Status*) {
    *flag = 1;
    *request = MPI_REQUEST_NULL;
    return MPI_SUCCESS;
}
inline int MPI_Get_count(const MPI_Status*, MPI_Datatype, int* count) {
    *count = 0;
    return MPI_SUCCESS;
}
inline int MPI_Cancel(MPI_Request*) { return MPI_SUCCESS; }
inline int MPI_Request_free(MPI_Request* request) {
    *request = MPI_REQUEST_NULL;
    return MPI_SUCCESS;
}
