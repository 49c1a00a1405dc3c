// The NCCL subset the project uses, for the CPU build: defined over MPI against the real nccl.h
// declarations. A communicator is an MPI communicator. The emulated device is host memory and
// runs synchronously, so each collective has completed when it returns and the stream argument
// is ignored. Collectives inside ncclGroupStart/End run at once: every rank issues them in the
// same order, as NCCL requires.
//
// Arithmetic is deterministic: a reduction sums in FP32 in rank order 0..n-1 and rounds to the
// data type once; ncclAvg divides that FP32 sum by nranks before the rounding. Real NCCL differs,
// so tests that compare it with this need a tolerance: it sums in ring or tree order (the
// starting rank differs per chunk), reduces in the data type (each bf16 partial sum is rounded
// to bf16 at every hop), and computes ncclAvg on floating types by scaling each input by
// 1/nranks before summing.
//
// Each collective first agrees on its arguments across ranks with one small MPI_Allreduce, so a
// bad argument on any rank, or ranks that disagree on the call, make it fail on every rank with
// a message instead of hanging.
//
// A communicator of one rank does no MPI work: its arguments are checked, and a collective is a
// copy of the send buffer into the receive buffer (or nothing, in place). That is exactly what the
// MPI path computes for one rank: a single FP32 term rounds back to the value it came from, and
// ncclAvg divides it by 1.
//
// Point to point (ncclSend, ncclRecv): as NCCL, a send waits for its matching receive (MPI_Issend,
// a rendezvous), messages between two ranks match in the order they were issued, and inside
// ncclGroupStart/End the operations are only issued at the outermost ncclGroupEnd, all at once, so
// their order within the group does not matter. Where NCCL would hang, this reports by name
// instead: a receive whose sender sends a different number of bytes, and operations still
// unmatched after CUEMU_NCCL_P2P_TIMEOUT seconds (default 300: a deadlock, or send/recv orders that
// do not match across ranks), listed with their peers and sizes. Sends to and receives from the
// rank itself pair up in order within one group (a copy); alone, outside a group, they could never
// complete and are an error.
//
// Recording (cuda_emu.h): every collective reports itself, with its stream and the bytes this rank
// moves, to the emulator's work observer. In record-only mode ncclCommInitRank makes a
// communicator of nranks with no MPI peers (MPI need not be initialized): its collectives check
// their arguments and report, but move nothing.
#include "parallel/mpi_api.h"
#include <nccl.h>

#include "cuda_emu.h"
#include "emu_internal.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

struct ncclComm {
    MPI_Comm mpi = MPI_COMM_NULL;  // MPI_COMM_NULL: a record-only communicator (no peers)
    int rank = 0;
    int nranks = 1;
    std::vector<unsigned char> outgoing, incoming, reduced;  // scratch, reused across calls
    std::vector<float> sums;
};

namespace {

// ---- errors: one line on stderr naming the call, and an ncclResult_t ----

// The last message of this thread, for ncclGetLastError.
std::string& last_error() {
    thread_local std::string message;
    return message;
}

[[gnu::format(printf, 3, 4)]] ncclResult_t fail(ncclResult_t status, const char* call, const char* format, ...) {
    char message[512];
    va_list args;
    va_start(args, format);
    std::vsnprintf(message, sizeof message, format, args);
    va_end(args);
    int world_rank = -1, initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    std::fprintf(stderr, "%s: %s (emulated NCCL, MPI rank %d)\n", call, message, world_rank);
    last_error() = std::string(call) + ": " + message;
    return status;
}

// A collective issued on a captured stream (emu/graph.cpp): recorded with its arguments and issued
// again at cudaGraphLaunch, where its checks and the ranks' agreement run, as every rank is there.
ncclResult_t captured(const char* call, cudaStream_t stream, std::function<ncclResult_t()> again) {
    const cudaError_t e = cuemu::capture(stream, call, [again] { return again() == ncclSuccess; });
    return e == cudaSuccess ? ncclSuccess : fail(ncclInvalidUsage, call, "stream capture: %s", cudaGetErrorString(e));
}

ncclResult_t mpi_failed(const char* call, const char* mpi_call, int code) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    return fail(ncclSystemError, call, "%s failed: %s", mpi_call, text);
}

#define MPI_TRY(call, mpi_name, expr)                                  \
    do {                                                               \
        int mpi_try_rc_ = (expr);                                      \
        if (mpi_try_rc_ != MPI_SUCCESS) return mpi_failed(call, mpi_name, mpi_try_rc_); \
    } while (0)

// ---- agreement across ranks ----

enum Collective : int64_t { kInit = 1, kAllReduce, kReduceScatter, kAllGather, kBroadcast, kReduce };

const char* collective_name(int64_t kind) {
    switch (kind) {
        case kInit: return "ncclCommInitRank";
        case kAllReduce: return "ncclAllReduce";
        case kReduceScatter: return "ncclReduceScatter";
        case kAllGather: return "ncclAllGather";
        case kBroadcast: return "ncclBroadcast";
        case kReduce: return "ncclReduce";
        default: return "?";
    }
}

struct Field {
    const char* name;
    int64_t value;
};
// Field 0 is always the collective, so that ranks making different calls are caught too.
using Signature = std::array<Field, 5>;

// Every rank contributes whether its own arguments were valid and the fields that must match on
// all ranks; one MPI_Allreduce(MAX) over {bad, fields, -fields} yields each field's max and min.
ncclResult_t agree(MPI_Comm mpi, const char* call, ncclResult_t local, const Signature& fields) {
    if (mpi == MPI_COMM_NULL) return local;  // record-only: no other rank to agree with
    constexpr size_t n = std::tuple_size_v<Signature>;
    std::array<int64_t, 1 + 2 * n> v{};
    v[0] = local != ncclSuccess;
    for (size_t i = 0; i < n; ++i) {
        v[1 + i] = fields[i].value;
        v[1 + n + i] = -fields[i].value;
    }
    MPI_TRY(call, "MPI_Allreduce", MPI_Allreduce(MPI_IN_PLACE, v.data(), int(v.size()), MPI_INT64_T, MPI_MAX, mpi));
    if (local != ncclSuccess) return local;  // already reported
    if (v[0]) return fail(ncclInvalidArgument, call, "another rank passed an invalid argument (see its message)");
    for (size_t i = 0; i < n; ++i) {
        int64_t max = v[1 + i], min = -v[1 + n + i];
        if (min == max) continue;
        if (i == 0)
            return fail(ncclInvalidUsage, call, "ranks called different collectives (%s and %s); every rank must "
                        "issue the same collectives in the same order", collective_name(min), collective_name(max));
        return fail(ncclInvalidUsage, call, "ranks disagree on %s (from %lld to %lld); every rank must pass the same",
                    fields[i].name, (long long)min, (long long)max);
    }
    return ncclSuccess;
}
// A collective's agreement: a single rank has no other rank to agree with.
ncclResult_t agree(const ncclComm& comm, const char* call, ncclResult_t local, const Signature& fields) {
    return agree(comm.nranks == 1 ? MPI_COMM_NULL : comm.mpi, call, local, fields);
}

// ---- argument checks ----

size_t type_size(ncclDataType_t type) {
    switch (type) {
        case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
        case ncclFloat16: case ncclBfloat16: return 2;
        case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
        case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
        default: return 0;
    }
}

ncclResult_t check_type(const char* call, ncclDataType_t type) {
    if (type_size(type) == 0) return fail(ncclInvalidArgument, call, "datatype %d is not an ncclDataType_t", int(type));
    return ncclSuccess;
}

ncclResult_t check_reduction(const char* call, ncclDataType_t type, ncclRedOp_t op) {
    if (ncclResult_t r = check_type(call, type); r != ncclSuccess) return r;
    if (type != ncclFloat32 && type != ncclBfloat16)
        return fail(ncclInvalidArgument, call, "datatype %d: the emulated reductions support ncclFloat32 and "
                    "ncclBfloat16 only", int(type));
    if (op != ncclSum && op != ncclAvg)
        return fail(ncclInvalidArgument, call, "op %d: the emulation supports ncclSum and ncclAvg only", int(op));
    return ncclSuccess;
}

// Byte sizes of the buffers: count * elements * nranks must fit in size_t.
ncclResult_t check_count(const char* call, size_t count, size_t elem_size, int nranks) {
    if (count > SIZE_MAX / 2 / elem_size / size_t(nranks))
        return fail(ncclInvalidArgument, call, "count %zu is too large", count);
    return ncclSuccess;
}

ncclResult_t check_pointer(const char* call, const char* name, const void* p, size_t count) {
    if (count > 0 && p == nullptr) return fail(ncclInvalidArgument, call, "%s is NULL", name);
    return ncclSuccess;
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
    auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
    return a_bytes && b_bytes && pa < pb + b_bytes && pb < pa + a_bytes;
}

// In place is only the exact layout NCCL documents (NCCL User Guide, "In-place Operations");
// any other overlap of sendbuff and recvbuff is undefined there, so it is an error here.
// in_place_offset: how many bytes past recv the in-place sendbuff starts (negative: before).
ncclResult_t check_overlap(const char* call, const void* send, size_t send_bytes, const void* recv,
                           size_t recv_bytes, intptr_t in_place_offset, const char* in_place_rule) {
    auto offset = intptr_t(reinterpret_cast<uintptr_t>(send) - reinterpret_cast<uintptr_t>(recv));
    if (offset != in_place_offset && overlaps(send, send_bytes, recv, recv_bytes))
        return fail(ncclInvalidArgument, call, "sendbuff and recvbuff overlap, but in place requires %s", in_place_rule);
    return ncclSuccess;
}

// ---- data movement: rounds over bounded scratch buffers ----

// Per scratch buffer and round; keeps memory flat for any size and MPI counts within int.
constexpr size_t kScratchBytes = size_t(16) << 20;

// A buffer seen as nranks blocks: block j starts at element j*stride; elements at or past
// `total` do not exist (only all-reduce has short or empty last blocks).
struct Blocks {
    size_t stride, total;
    // How many elements of block j's range [begin, begin + len) exist.
    size_t present(int j, size_t begin, size_t len) const {
        size_t start = size_t(j) * stride + begin;
        return start >= total ? 0 : std::min(len, total - start);
    }
};

size_t round_length(size_t stride, size_t elem_size, int nranks) {
    return std::max<size_t>(1, std::min(stride, kScratchBytes / (elem_size * size_t(nranks))));
}

template <typename T> float load(const unsigned char* p) {
    T x;
    std::memcpy(&x, p, sizeof x);
    if constexpr (std::is_same_v<T, float>) return x;
    else return __bfloat162float(x);
}
template <typename T> void store(unsigned char* p, float value) {
    T x;
    if constexpr (std::is_same_v<T, float>) x = value;
    else x = __float2bfloat16(value);  // round to nearest even, once
    std::memcpy(p, &x, sizeof x);
}

// One round of a reduction: every rank sends elements [begin, begin+len) of each block j to
// rank j, which sums what it receives in rank order 0..n-1 in FP32 and rounds once into `out`
// (the elements of its own block that exist). Missing elements travel as zero padding.
template <typename T>
ncclResult_t reduce_round(ncclComm& comm, const char* call, const unsigned char* send, Blocks blocks, size_t begin,
                          size_t len, bool average, unsigned char* out) {
    const size_t bytes = len * sizeof(T);
    comm.outgoing.resize(comm.nranks * bytes);
    comm.incoming.resize(comm.nranks * bytes);
    for (int j = 0; j < comm.nranks; ++j) {
        size_t have = blocks.present(j, begin, len) * sizeof(T);
        unsigned char* dst = comm.outgoing.data() + j * bytes;
        if (have) std::memcpy(dst, send + (j * blocks.stride + begin) * sizeof(T), have);
        std::memset(dst + have, 0, bytes - have);
    }
    MPI_TRY(call, "MPI_Alltoall", MPI_Alltoall(comm.outgoing.data(), int(bytes), MPI_BYTE, comm.incoming.data(),
                                               int(bytes), MPI_BYTE, comm.mpi));
    std::vector<float>& sums = comm.sums;
    sums.resize(len);
    const unsigned char* rows = comm.incoming.data();
    for (size_t i = 0; i < len; ++i) sums[i] = load<T>(rows + i * sizeof(T));
    for (int r = 1; r < comm.nranks; ++r)
        for (size_t i = 0; i < len; ++i) sums[i] += load<T>(rows + (r * len + i) * sizeof(T));
    const float nranks = float(comm.nranks);
    size_t mine = blocks.present(comm.rank, begin, len);
    for (size_t i = 0; i < mine; ++i) store<T>(out + i * sizeof(T), average ? sums[i] / nranks : sums[i]);
    return ncclSuccess;
}

ncclResult_t reduce_round(ncclComm& comm, const char* call, ncclDataType_t type, const unsigned char* send,
                          Blocks blocks, size_t begin, size_t len, ncclRedOp_t op, unsigned char* out) {
    if (type == ncclFloat32) return reduce_round<float>(comm, call, send, blocks, begin, len, op == ncclAvg, out);
    return reduce_round<__nv_bfloat16>(comm, call, send, blocks, begin, len, op == ncclAvg, out);
}

// One round of a gather: every rank contributes `len` elements at `own`, which land at
// [begin, begin+len) of its block in every rank's recv (the elements that exist).
ncclResult_t gather_round(ncclComm& comm, const char* call, const unsigned char* own, size_t elem_size,
                          unsigned char* recv, Blocks blocks, size_t begin, size_t len) {
    const size_t bytes = len * elem_size;
    comm.incoming.resize(comm.nranks * bytes);
    MPI_TRY(call, "MPI_Allgather", MPI_Allgather(own, int(bytes), MPI_BYTE, comm.incoming.data(), int(bytes),
                                                 MPI_BYTE, comm.mpi));
    for (int j = 0; j < comm.nranks; ++j) {
        size_t have = blocks.present(j, begin, len) * elem_size;
        if (have) std::memcpy(recv + (j * blocks.stride + begin) * elem_size, comm.incoming.data() + j * bytes, have);
    }
    return ncclSuccess;
}

// Runs round(begin, len) over each block's elements in bounded rounds. A round's ranges are
// disjoint from later rounds' ones, and it reads all its input before writing its output, so
// the in-place layouts are safe.
template <typename Round>
ncclResult_t in_rounds(Blocks blocks, size_t elem_size, int nranks, Round round) {
    const size_t step = round_length(blocks.stride, elem_size, nranks);
    for (size_t begin = 0; begin < blocks.stride; begin += step)
        if (ncclResult_t r = round(begin, std::min(step, blocks.stride - begin)); r != ncclSuccess) return r;
    return ncclSuccess;
}

const unsigned char* bytes_of(const void* p) { return static_cast<const unsigned char*>(p); }
unsigned char* bytes_of(void* p) { return static_cast<unsigned char*>(p); }

thread_local int group_depth = 0;  // NCCL groups are per thread

// Runs a collective's data movement (unless the communicator is record-only) and reports it to the
// emulator's work observer with the bytes each rank moves over the links: the buffer size times
// NCCL's bus-bandwidth factor (nccl-tests, doc/PERFORMANCE.md: 2(n-1)/n for all-reduce, (n-1)/n of
// the whole buffer for reduce-scatter and all-gather, 1 for broadcast and reduce).
// A single rank's result is its own data: `alone` is what it copies (send, recv, bytes).
struct SingleRankCopy {
    const void* send;
    void* recv;
    size_t bytes;
};
template <typename Move>
ncclResult_t run_reported(ncclComm& comm, const char* call, double bus_bytes, cudaStream_t stream, SingleRankCopy alone,
                          Move move) {
    const auto begin = std::chrono::steady_clock::now();
    ncclResult_t r = ncclSuccess;
    if (comm.mpi == MPI_COMM_NULL) {
        // record-only: nothing moves
    } else if (comm.nranks == 1) {
        if (alone.bytes && alone.send != alone.recv) std::memmove(alone.recv, alone.send, alone.bytes);
    } else {
        r = move();
    }
    if (r != ncclSuccess) return r;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
    cuemu::report_work({call, cuemu::WorkReport::communication, bus_bytes, stream, ms});
    return r;
}
// A collective is an operation on its stream that reads the send buffer and writes the receive
// buffer (the race detector's view; cuda_emu.h, "Race detection"). Null or zero-byte sides are skipped.
void enqueue_for_racecheck(const ncclComm& comm, const char* call, cudaStream_t stream, const void* send,
                           size_t send_bytes, const void* recv, size_t recv_bytes) {
    if (comm.mpi == MPI_COMM_NULL || !cuemu::race::enabled()) return;  // record-only communicators move nothing
    const cuemu::MemoryAccess accesses[] = {{send, send_bytes, false, false}, {recv, recv_bytes, true, false}};
    cuemu::race::operation(call, stream, accesses, 2);
}
double ring_share(const ncclComm& comm) { return double(comm.nranks - 1) / double(comm.nranks); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Communicators

ncclResult_t ncclGetVersion(int* version) {
    if (version == nullptr) return fail(ncclInvalidArgument, "ncclGetVersion", "version is NULL");
    *version = NCCL_VERSION_CODE;  // the API version of the header this emulation implements
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
    if (uniqueId == nullptr) return fail(ncclInvalidArgument, "ncclGetUniqueId", "uniqueId is NULL");
    std::random_device entropy;
    for (size_t i = 0; i < NCCL_UNIQUE_ID_BYTES; i += sizeof(unsigned)) {
        unsigned word = entropy();
        std::memcpy(uniqueId->internal + i, &word, std::min(sizeof word, NCCL_UNIQUE_ID_BYTES - i));
    }
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
    const char* call = "ncclCommInitRank";
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if ((!initialized || finalized) && !cuemu::record_only())
        return fail(ncclInvalidUsage, call, "MPI is not initialized; the emulated NCCL runs over MPI, so call MPI_Init first");
    if (comm) *comm = nullptr;
    ncclResult_t local = ncclSuccess;
    if (comm == nullptr) local = fail(ncclInvalidArgument, call, "comm is NULL");
    else if (nranks < 1) local = fail(ncclInvalidArgument, call, "nranks is %d; it must be at least 1", nranks);
    else if (rank < 0 || rank >= nranks)
        local = fail(ncclInvalidArgument, call, "rank %d is outside 0..%d (nranks %d)", rank, nranks - 1, nranks);
    if (cuemu::record_only()) {  // rank `rank` of nranks, alone: collectives are recorded, not run
        if (local != ncclSuccess) return local;
        ncclComm* created = new ncclComm;
        created->rank = rank;
        created->nranks = nranks;
        *comm = created;
        return ncclSuccess;
    }

    // Every world rank takes part in the split, as every rank of an NCCL job calls
    // ncclCommInitRank: ranks that pass the same id form one communicator, ordered by `rank`.
    uint64_t hash = 14695981039346656037ull;  // FNV-1a
    for (char c : commId.internal) hash = (hash ^ uint8_t(c)) * 1099511628211ull;
    MPI_Comm mpi = MPI_COMM_NULL;
    MPI_TRY(call, "MPI_Comm_split", MPI_Comm_split(MPI_COMM_WORLD, int(hash >> 33), rank, &mpi));
    MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);  // MPI failures become ncclSystemError
    int size = 0, my_rank = 0;
    MPI_Comm_size(mpi, &size);
    MPI_Comm_rank(mpi, &my_rank);
    if (local == ncclSuccess && size != nranks)
        local = fail(ncclInvalidArgument, call, "nranks is %d, but %d rank(s) called with this unique id "
                     "(was the id broadcast to every rank?)", nranks, size);
    else if (local == ncclSuccess && my_rank != rank)
        local = fail(ncclInvalidArgument, call, "rank %d is given twice or leaves a gap: the ranks of one "
                     "communicator must be 0..nranks-1, each once", rank);
    ncclResult_t agreed = agree(mpi, call, local, {{{"the collective", kInit}, {"nranks", nranks},
                                                    {"the unique id", int64_t(hash >> 32)},
                                                    {"the unique id", int64_t(hash & 0xffffffffu)},
                                                    {"nothing", 0}}});
    if (agreed != ncclSuccess) {
        MPI_Comm_free(&mpi);
        return agreed;
    }
    ncclComm* created = new ncclComm;
    created->mpi = mpi;
    created->rank = my_rank;
    created->nranks = size;
    *comm = created;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm == nullptr) return ncclSuccess;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm->mpi != MPI_COMM_NULL) MPI_Comm_free(&comm->mpi);
    delete comm;
    return ncclSuccess;
}

// Collectives here are blocking MPI calls that run to completion before they return, so no error is
// ever pending. An abort comes from another thread (a watchdog) while this rank may be blocked in
// such a call on the communicator: it cannot interrupt it, and freeing the communicator under it
// would be unsafe, so it leaves the communicator as it is; the caller ends the job next (MPI_Abort).
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
    if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommGetAsyncError", "comm is NULL");
    if (asyncError == nullptr) return fail(ncclInvalidArgument, "ncclCommGetAsyncError", "asyncError is NULL");
    *asyncError = ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    (void)comm;
    return ncclSuccess;
}

// The last error's message on this thread (real NCCL keeps it per communicator or globally).
const char* ncclGetLastError(ncclComm_t) { return last_error().c_str(); }

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
    if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommCount", "comm is NULL");
    if (count == nullptr) return fail(ncclInvalidArgument, "ncclCommCount", "count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
    if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommUserRank", "comm is NULL");
    if (rank == nullptr) return fail(ncclInvalidArgument, "ncclCommUserRank", "rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
    if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommCuDevice", "comm is NULL");
    if (device == nullptr) return fail(ncclInvalidArgument, "ncclCommCuDevice", "device is NULL");
    *device = 0;  // each process emulates one device
    return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
    switch (result) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "a CUDA call failed";
        case ncclSystemError: return "a system or MPI call failed";
        case ncclInternalError: return "internal error";
        case ncclInvalidArgument: return "invalid argument";
        case ncclInvalidUsage: return "invalid usage";
        case ncclRemoteError: return "remote error";
        case ncclInProgress: return "operation in progress";
        default: return "unknown ncclResult_t";
    }
}

// ---------------------------------------------------------------------------------------------
// Collectives

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    const char* call = "ncclAllReduce";
    if (cuemu::capturing(stream))
        return captured(call, stream, [=] { return ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream); });
    if (comm == nullptr) return fail(ncclInvalidArgument, call, "comm is NULL");
    ncclResult_t local = check_reduction(call, datatype, op);
    const size_t elem = type_size(datatype);
    if (local == ncclSuccess) local = check_count(call, count, elem, comm->nranks);
    if (local == ncclSuccess) local = check_pointer(call, "sendbuff", sendbuff, count);
    if (local == ncclSuccess) local = check_pointer(call, "recvbuff", recvbuff, count);
    if (local == ncclSuccess)
        local = check_overlap(call, sendbuff, count * elem, recvbuff, count * elem, 0, "sendbuff == recvbuff");
    ncclResult_t agreed = agree(*comm, call, local, {{{"the collective", kAllReduce}, {"count", int64_t(count)},
                                                          {"datatype", datatype}, {"op", op}, {"nothing", 0}}});
    if (agreed != ncclSuccess) return agreed;
    // Block j of the result is reduced on rank j, then gathered everywhere.
    enqueue_for_racecheck(*comm, call, stream, sendbuff, count * elem, recvbuff, count * elem);
    const Blocks blocks{(count + comm->nranks - 1) / comm->nranks, count};
    return run_reported(*comm, call, 2 * ring_share(*comm) * double(count * elem), stream,
                        {sendbuff, recvbuff, count * elem}, [&] {
        return in_rounds(blocks, elem, comm->nranks, [&](size_t begin, size_t len) {
            comm->reduced.resize(len * elem);
            ncclResult_t r = reduce_round(*comm, call, datatype, bytes_of(sendbuff), blocks, begin, len, op,
                                          comm->reduced.data());
            if (r != ncclSuccess) return r;
            return gather_round(*comm, call, comm->reduced.data(), elem, bytes_of(recvbuff), blocks, begin, len);
        });
    });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    const char* call = "ncclReduceScatter";
    if (cuemu::capturing(stream))
        return captured(call, stream,
                        [=] { return ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream); });
    if (comm == nullptr) return fail(ncclInvalidArgument, call, "comm is NULL");
    ncclResult_t local = check_reduction(call, datatype, op);
    const size_t elem = type_size(datatype);
    if (local == ncclSuccess) local = check_count(call, recvcount, elem, comm->nranks);
    if (local == ncclSuccess) local = check_pointer(call, "sendbuff", sendbuff, recvcount);
    if (local == ncclSuccess) local = check_pointer(call, "recvbuff", recvbuff, recvcount);
    if (local == ncclSuccess) {
        const size_t block_bytes = recvcount * elem;
        local = check_overlap(call, sendbuff, comm->nranks * block_bytes, recvbuff, block_bytes,
                              -intptr_t(comm->rank * block_bytes), "recvbuff == sendbuff + rank * recvcount");
    }
    ncclResult_t agreed = agree(*comm, call, local, {{{"the collective", kReduceScatter},
                                                          {"recvcount", int64_t(recvcount)}, {"datatype", datatype},
                                                          {"op", op}, {"nothing", 0}}});
    if (agreed != ncclSuccess) return agreed;
    enqueue_for_racecheck(*comm, call, stream, sendbuff, comm->nranks * recvcount * elem, recvbuff, recvcount * elem);
    const Blocks blocks{recvcount, comm->nranks * recvcount};
    return run_reported(*comm, call, ring_share(*comm) * double(comm->nranks * recvcount * elem), stream,
                        {sendbuff, recvbuff, recvcount * elem}, [&] {
        return in_rounds(blocks, elem, comm->nranks, [&](size_t begin, size_t len) {
            return reduce_round(*comm, call, datatype, bytes_of(sendbuff), blocks, begin, len, op,
                                bytes_of(recvbuff) + begin * elem);
        });
    });
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    const char* call = "ncclAllGather";
    if (cuemu::capturing(stream))
        return captured(call, stream, [=] { return ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream); });
    if (comm == nullptr) return fail(ncclInvalidArgument, call, "comm is NULL");
    ncclResult_t local = check_type(call, datatype);
    const size_t elem = std::max<size_t>(1, type_size(datatype));
    if (local == ncclSuccess) local = check_count(call, sendcount, elem, comm->nranks);
    if (local == ncclSuccess) local = check_pointer(call, "sendbuff", sendbuff, sendcount);
    if (local == ncclSuccess) local = check_pointer(call, "recvbuff", recvbuff, sendcount);
    if (local == ncclSuccess) {
        const size_t block_bytes = sendcount * elem;
        local = check_overlap(call, sendbuff, block_bytes, recvbuff, comm->nranks * block_bytes,
                              intptr_t(comm->rank * block_bytes), "sendbuff == recvbuff + rank * sendcount");
    }
    ncclResult_t agreed = agree(*comm, call, local, {{{"the collective", kAllGather},
                                                          {"sendcount", int64_t(sendcount)}, {"datatype", datatype},
                                                          {"nothing", 0}, {"nothing", 0}}});
    if (agreed != ncclSuccess) return agreed;
    enqueue_for_racecheck(*comm, call, stream, sendbuff, sendcount * elem, recvbuff, comm->nranks * sendcount * elem);
    const Blocks blocks{sendcount, comm->nranks * sendcount};
    return run_reported(*comm, call, ring_share(*comm) * double(comm->nranks * sendcount * elem), stream,
                        {sendbuff, recvbuff, sendcount * elem}, [&] {
        return in_rounds(blocks, elem, comm->nranks, [&](size_t begin, size_t len) {
            return gather_round(*comm, call, bytes_of(sendbuff) + begin * elem, elem, bytes_of(recvbuff), blocks,
                                begin, len);
        });
    });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    const char* call = "ncclBroadcast";
    if (cuemu::capturing(stream))
        return captured(call, stream, [=] { return ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream); });
    if (comm == nullptr) return fail(ncclInvalidArgument, call, "comm is NULL");
    ncclResult_t local = check_type(call, datatype);
    const size_t elem = std::max<size_t>(1, type_size(datatype));
    const bool is_root = root == comm->rank;
    if (local == ncclSuccess && (root < 0 || root >= comm->nranks))
        local = fail(ncclInvalidArgument, call, "root %d is outside 0..%d", root, comm->nranks - 1);
    if (local == ncclSuccess) local = check_count(call, count, elem, 1);
    // sendbuff is only used on the root (NCCL User Guide, "ncclBroadcast").
    if (local == ncclSuccess && is_root) local = check_pointer(call, "sendbuff", sendbuff, count);
    if (local == ncclSuccess) local = check_pointer(call, "recvbuff", recvbuff, count);
    if (local == ncclSuccess && is_root)
        local = check_overlap(call, sendbuff, count * elem, recvbuff, count * elem, 0, "sendbuff == recvbuff");
    ncclResult_t agreed = agree(*comm, call, local, {{{"the collective", kBroadcast}, {"count", int64_t(count)},
                                                          {"datatype", datatype}, {"root", root}, {"nothing", 0}}});
    if (agreed != ncclSuccess) return agreed;
    const size_t bytes = count * elem;
    enqueue_for_racecheck(*comm, call, stream, is_root ? sendbuff : nullptr, bytes, recvbuff, bytes);
    return run_reported(*comm, call, comm->nranks > 1 ? double(bytes) : 0.0, stream, {sendbuff, recvbuff, bytes}, [&] {
        if (is_root && sendbuff != recvbuff && bytes) std::memcpy(recvbuff, sendbuff, bytes);
        constexpr size_t kMaxMessage = size_t(1) << 30;  // MPI counts are int
        for (size_t offset = 0; offset < bytes; offset += kMaxMessage)
            MPI_TRY(call, "MPI_Bcast", MPI_Bcast(bytes_of(recvbuff) + offset,
                                                 int(std::min(kMaxMessage, bytes - offset)), MPI_BYTE, root, comm->mpi));
        return ncclSuccess;
    });
}

// Reduce to one rank: the same arithmetic as ncclAllReduce (FP32 in rank order, one rounding), kept
// only on the root. recvbuff is only used on the root (NCCL User Guide, "ncclReduce").
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
    const char* call = "ncclReduce";
    if (cuemu::capturing(stream))
        return captured(call, stream, [=] { return ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream); });
    if (comm == nullptr) return fail(ncclInvalidArgument, call, "comm is NULL");
    ncclResult_t local = check_reduction(call, datatype, op);
    const size_t elem = type_size(datatype);
    const bool is_root = root == comm->rank;
    if (local == ncclSuccess && (root < 0 || root >= comm->nranks))
        local = fail(ncclInvalidArgument, call, "root %d is outside 0..%d", root, comm->nranks - 1);
    if (local == ncclSuccess) local = check_count(call, count, elem, comm->nranks);
    if (local == ncclSuccess) local = check_pointer(call, "sendbuff", sendbuff, count);
    if (local == ncclSuccess && is_root) local = check_pointer(call, "recvbuff", recvbuff, count);
    if (local == ncclSuccess && is_root)
        local = check_overlap(call, sendbuff, count * elem, recvbuff, count * elem, 0, "sendbuff == recvbuff");
    ncclResult_t agreed = agree(*comm, call, local, {{{"the collective", kReduce}, {"count", int64_t(count)},
                                                          {"datatype", datatype}, {"op", op}, {"root", root}}});
    if (agreed != ncclSuccess) return agreed;
    enqueue_for_racecheck(*comm, call, stream, sendbuff, count * elem, is_root ? recvbuff : nullptr, count * elem);
    return run_reported(*comm, call, comm->nranks > 1 ? double(count * elem) : 0.0, stream,
                        {sendbuff, recvbuff, count * elem}, [&] {
        std::vector<unsigned char> result(count * elem);
        const Blocks blocks{(count + comm->nranks - 1) / comm->nranks, count};
        ncclResult_t r = in_rounds(blocks, elem, comm->nranks, [&](size_t begin, size_t len) {
            comm->reduced.resize(len * elem);
            ncclResult_t rr = reduce_round(*comm, call, datatype, bytes_of(sendbuff), blocks, begin, len, op,
                                           comm->reduced.data());
            if (rr != ncclSuccess) return rr;
            return gather_round(*comm, call, comm->reduced.data(), elem, result.data(), blocks, begin, len);
        });
        if (r == ncclSuccess && is_root && count) std::memcpy(recvbuff, result.data(), count * elem);
        return r;
    });
}

// ---------------------------------------------------------------------------------------------
// Point to point

namespace {

struct PointToPoint {
    bool send;
    const char* call;  // "ncclSend" or "ncclRecv"
    void* buffer;      // the send buffer (read) or the receive buffer (written)
    size_t bytes;
    int peer;
    ncclComm* comm;
    cudaStream_t stream;
};
thread_local std::vector<PointToPoint> group_point_to_point;  // issued at the outermost ncclGroupEnd

// Point-to-point operations issued on a captured stream (CUDA graphs): each is recorded as the call
// again, with its arguments; inside a group, the group's calls are recorded as one node at the
// outermost ncclGroupEnd, which replays ncclGroupStart, the calls, ncclGroupEnd. At cudaGraphLaunch the
// replay runs them as the eager calls would (checks, race detection, matching, the transfer), in the
// order they were captured: the order every rank issued them.
struct CapturedPointToPoint {
    cudaStream_t stream;
    std::function<ncclResult_t()> again;
};
thread_local std::vector<CapturedPointToPoint> group_captured;

double point_to_point_timeout_s() {
    const char* v = std::getenv("CUEMU_NCCL_P2P_TIMEOUT");
    const double seconds = v ? std::atof(v) : 0.0;
    return seconds > 0 ? seconds : 300.0;
}

std::string describe(const PointToPoint& op) {
    char text[160];
    std::snprintf(text, sizeof text, "%s of %zu bytes %s rank %d", op.call, op.bytes, op.send ? "to" : "from", op.peer);
    return text;
}

void report(const PointToPoint& op, double ms) {
    cuemu::report_work({op.call, cuemu::WorkReport::communication, double(op.bytes), op.stream, ms});
}

// Issues `ops` (all of one thread's group, or one operation alone) and waits for all of them.
ncclResult_t run_point_to_point(std::vector<PointToPoint>& ops, const char* call) {
    const auto begin = std::chrono::steady_clock::now();
    // The rank's own: the k-th send to itself on a communicator feeds its k-th receive from itself.
    std::vector<bool> done(ops.size(), false);
    for (size_t i = 0; i < ops.size(); ++i) {
        const PointToPoint& op = ops[i];
        if (op.send || op.peer != op.comm->rank || op.comm->mpi == MPI_COMM_NULL) continue;
        size_t j = 0;
        while (j < ops.size() && (done[j] || !ops[j].send || ops[j].comm != op.comm || ops[j].peer != op.comm->rank)) ++j;
        if (j == ops.size())
            return fail(ncclInvalidUsage, call, "%s: no ncclSend to itself in the same group to match it (it would wait "
                        "forever)", describe(op).c_str());
        if (ops[j].bytes != op.bytes)
            return fail(ncclInvalidUsage, call, "%s: its matching ncclSend to itself sends %zu bytes",
                        describe(op).c_str(), ops[j].bytes);
        if (op.bytes) std::memmove(op.buffer, ops[j].buffer, op.bytes);
        done[i] = done[j] = true;
    }
    for (size_t i = 0; i < ops.size(); ++i)
        if (!done[i] && ops[i].peer == ops[i].comm->rank && ops[i].comm->mpi != MPI_COMM_NULL)
            return fail(ncclInvalidUsage, call, "%s: no ncclRecv from itself in the same group to match it (it would "
                        "wait forever)", describe(ops[i]).c_str());
    // The others over MPI: every receive posted first, then every send (MPI_Issend completes only once
    // the peer's receive has matched it, as an NCCL send waits for its receive).
    std::vector<MPI_Request> requests(ops.size(), MPI_REQUEST_NULL);
    // On an error: the operations still in flight are cancelled, so none completes into a buffer later.
    auto abandon = [&requests](ncclResult_t r) {
        for (MPI_Request& request : requests)
            if (request != MPI_REQUEST_NULL) {
                MPI_Cancel(&request);
                MPI_Request_free(&request);
            }
        return r;
    };
    for (int pass = 0; pass < 2; ++pass)
        for (size_t i = 0; i < ops.size(); ++i) {
            PointToPoint& op = ops[i];
            if (done[i] || op.comm->mpi == MPI_COMM_NULL || op.send != (pass == 1)) continue;
            const int rc = op.send ? MPI_Issend(op.buffer, int(op.bytes), MPI_BYTE, op.peer, 0, op.comm->mpi, &requests[i])
                                   : MPI_Irecv(op.buffer, int(op.bytes), MPI_BYTE, op.peer, 0, op.comm->mpi, &requests[i]);
            if (rc != MPI_SUCCESS) return abandon(mpi_failed(call, op.send ? "MPI_Issend" : "MPI_Irecv", rc));
        }
    const double timeout_s = point_to_point_timeout_s();
    int idle_us = 1;
    for (;;) {
        bool pending = false, progressed = false;
        for (size_t i = 0; i < ops.size(); ++i) {
            if (requests[i] == MPI_REQUEST_NULL) continue;
            int flag = 0;
            MPI_Status status;
            const int rc = MPI_Test(&requests[i], &flag, &status);
            const PointToPoint& op = ops[i];
            if (rc != MPI_SUCCESS)  // a larger message than the receive expects (MPI_ERR_TRUNCATE), or worse
                return abandon(fail(ncclInvalidUsage, call, "%s: the message from rank %d does not fit (its ncclSend sends "
                            "more bytes): sends and receives between two ranks must match in order and size",
                            describe(op).c_str(), op.peer));
            if (!flag) {
                pending = true;
                continue;
            }
            progressed = true;
            if (!op.send) {
                int received = 0;
                MPI_Get_count(&status, MPI_BYTE, &received);
                if (size_t(received) != op.bytes)
                    return abandon(fail(ncclInvalidUsage, call, "%s: rank %d's matching ncclSend sent %d bytes: sends "
                                        "and receives between two ranks must match in order and size",
                                        describe(op).c_str(), op.peer, received));
            }
        }
        if (!pending) break;
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
        if (waited > timeout_s) {
            std::string unmatched;
            for (size_t i = 0; i < ops.size(); ++i)
                if (requests[i] != MPI_REQUEST_NULL) unmatched += (unmatched.empty() ? "" : ", ") + describe(ops[i]);
            return abandon(fail(ncclInvalidUsage, call, "deadlock: after %g s (CUEMU_NCCL_P2P_TIMEOUT) still unmatched: "
                                "%s; every rank waiting, or send/recv orders that do not match across ranks", timeout_s,
                                unmatched.c_str()));
        }
        if (progressed) idle_us = 1;
        else {  // back off up to 1 ms between polls
            std::this_thread::sleep_for(std::chrono::microseconds(idle_us));
            idle_us = std::min(1000, idle_us * 2);
        }
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
    for (const PointToPoint& op : ops) report(op, ms);
    return ncclSuccess;
}

ncclResult_t point_to_point(bool send, const void* buffer, size_t count, ncclDataType_t datatype, int peer,
                            ncclComm_t comm, cudaStream_t stream) {
    const char* call = send ? "ncclSend" : "ncclRecv";
    if (cuemu::capturing(stream)) {  // recorded; everything else happens when the graph replays it
        auto again = [=] { return point_to_point(send, buffer, count, datatype, peer, comm, stream); };
        if (group_depth == 0) return captured(call, stream, again);
        group_captured.push_back({stream, again});
        return ncclSuccess;
    }
    if (comm == nullptr) return fail(ncclInvalidArgument, call, "comm is NULL");
    if (ncclResult_t r = check_type(call, datatype); r != ncclSuccess) return r;
    if (ncclResult_t r = check_count(call, count, type_size(datatype), 1); r != ncclSuccess) return r;
    if (ncclResult_t r = check_pointer(call, send ? "sendbuff" : "recvbuff", buffer, count); r != ncclSuccess) return r;
    if (peer < 0 || peer >= comm->nranks)
        return fail(ncclInvalidArgument, call, "peer %d is outside 0..%d", peer, comm->nranks - 1);
    const size_t bytes = count * type_size(datatype);
    if (bytes > size_t(INT32_MAX))
        return fail(ncclInvalidArgument, call, "%zu bytes: the emulation moves at most 2 GiB per call", bytes);
    PointToPoint op{send, call, const_cast<void*>(buffer), bytes, peer, comm, stream};
    if (comm->mpi != MPI_COMM_NULL && cuemu::race::enabled()) {
        const cuemu::MemoryAccess access{buffer, bytes, !send, false};
        cuemu::race::operation(call, stream, &access, 1);
    }
    if (comm->mpi == MPI_COMM_NULL) {  // record-only: nothing moves
        report(op, 0.0);
        return ncclSuccess;
    }
    if (group_depth > 0) {
        group_point_to_point.push_back(op);
        return ncclSuccess;
    }
    std::vector<PointToPoint> alone{op};
    return run_point_to_point(alone, call);
}

}  // namespace

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return point_to_point(true, sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return point_to_point(false, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart() {
    ++group_depth;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
    if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd", "no ncclGroupStart to end");
    if (--group_depth > 0) return ncclSuccess;
    if (!group_captured.empty()) {
        std::vector<CapturedPointToPoint> calls;
        calls.swap(group_captured);
        const cudaStream_t stream = calls.front().stream;
        const bool one_stream = std::all_of(calls.begin(), calls.end(), [&](const auto& c) { return c.stream == stream; });
        if (!group_point_to_point.empty() || !one_stream) {
            group_point_to_point.clear();
            return fail(ncclInvalidUsage, "ncclGroupEnd", "a group of point-to-point operations on a captured stream "
                        "and on other streams: its graph node would have to join them (not emulated)");
        }
        return captured("ncclGroupEnd", stream, [calls] {
            ncclGroupStart();
            ncclResult_t first_error = ncclSuccess;
            for (const CapturedPointToPoint& c : calls)
                if (const ncclResult_t r = c.again(); r != ncclSuccess && first_error == ncclSuccess) first_error = r;
            const ncclResult_t ended = ncclGroupEnd();
            return first_error != ncclSuccess ? first_error : ended;
        });
    }
    if (group_point_to_point.empty()) return ncclSuccess;
    std::vector<PointToPoint> ops;
    ops.swap(group_point_to_point);
    return run_point_to_point(ops, "ncclGroupEnd");
}
