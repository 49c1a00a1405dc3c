// The NCCL subset the project uses, across MPI ranks: `mpirun -np N test_mpi_nccl`, or plainly
// (one rank, MPI singleton). Built against emu/ (g++) and against real NCCL (nvcc), where each
// rank needs a GPU of its own.
//
// Expected values are computed on the host from rank-dependent inputs. The emulation sums in
// FP32 in rank order 0..n-1 and rounds once, exactly as the host does here, so the CPU build
// compares exactly; real NCCL reduces in ring/tree order, rounds bf16 partial sums at each hop
// and premultiplies by 1/n for ncclAvg, so the GPU build allows the bound in `tolerance`.
#include "parallel/mpi_api.h"
#include <catch2/catch.hpp>
#include <nccl.h>

#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "mpi_test_util.h"
#include "parallel/process_groups.h"
#include "test_util.h"

namespace {

int world_rank = 0, world_size = 1;

#define CHECK_NCCL(call)                                        \
    do {                                                        \
        ncclResult_t check_nccl_r_ = (call);                    \
        INFO(#call << ": " << ncclGetErrorString(check_nccl_r_)); \
        CHECK(check_nccl_r_ == ncclSuccess);                    \
    } while (0)

// ---- element types ----

template <typename T> struct Elem;
template <> struct Elem<float> {
    static constexpr ncclDataType_t type = ncclFloat32;
    static constexpr const char* name = "fp32";
    static constexpr int significand_bits = 24;
    static float to_float(float x) { return x; }
    static float from_float(float x) { return x; }
};
template <> struct Elem<__nv_bfloat16> {
    static constexpr ncclDataType_t type = ncclBfloat16;
    static constexpr const char* name = "bf16";
    static constexpr int significand_bits = 8;
    static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __nv_bfloat16 from_float(float x) { return __float2bfloat16(x); }  // round to nearest even
};
template <> struct Elem<int32_t> {
    static constexpr ncclDataType_t type = ncclInt32;
    static constexpr const char* name = "int32";
};
template <> struct Elem<uint8_t> {
    static constexpr ncclDataType_t type = ncclUint8;
    static constexpr const char* name = "uint8";
};
using bf16 = __nv_bfloat16;

// ---- rank-dependent inputs ----

uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

// Element i of `rank`'s input: values in (-16, 16) spread over 9 binades, so that the order of
// a sum shows in its rounding.
template <typename T> T input_value(int rank, size_t i, int salt) {
    uint32_t h = mix(uint32_t(i) * 2654435761u ^ mix(uint32_t(rank) * 40503u + uint32_t(salt)));
    if constexpr (std::is_integral_v<T>) {
        return T(h);
    } else {
        float unit = float(h & 0xffffff) / float(1 << 24) * 2.0f - 1.0f;
        return Elem<T>::from_float(std::ldexp(unit, int((h >> 24) % 9) - 4));
    }
}

template <typename T> std::vector<T> input(int rank, size_t count, int salt) {
    std::vector<T> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = input_value<T>(rank, i, salt);
    return v;
}

// The reduction of every rank's input, as the emulation defines it: an FP32 sum in rank order,
// divided by nranks for ncclAvg, rounded to T once. magnitude[i] = sum over ranks of |x|.
template <typename T>
std::vector<T> expected_reduction(size_t count, int salt, ncclRedOp_t op, std::vector<float>& magnitude) {
    std::vector<float> sum(count, 0.0f);
    magnitude.assign(count, 0.0f);
    for (int r = 0; r < world_size; ++r) {
        std::vector<T> x = input<T>(r, count, salt);
        for (size_t i = 0; i < count; ++i) {
            float v = Elem<T>::to_float(x[i]);
            sum[i] = r == 0 ? v : sum[i] + v;
            magnitude[i] += std::fabs(v);
        }
    }
    std::vector<T> result(count);
    for (size_t i = 0; i < count; ++i)
        result[i] = Elem<T>::from_float(op == ncclAvg ? sum[i] / float(world_size) : sum[i]);
    return result;
}

// Allowed |got - expected| for a reduced element whose inputs sum to `magnitude` in absolute
// value.
template <typename T> double tolerance(double magnitude) {
#ifdef __CUDACC__
    // Real NCCL rounds up to n-1 partial sums (and for ncclAvg the 1/n premultiplication) to T;
    // with the final roundings of its result and of ours that is at most n+2 roundings, each
    // off by at most half an ulp of a value no larger than `magnitude`, i.e. magnitude*2^-p.
    return (world_size + 2) * std::ldexp(magnitude, -Elem<T>::significand_bits);
#else
    (void)magnitude;
    return 0.0;  // the emulation computes exactly what expected_reduction does
#endif
}

template <typename T>
void check_reduced(const std::vector<T>& got, const std::vector<T>& want, const std::vector<float>& magnitude,
                   size_t want_offset, const std::string& what) {
    size_t mismatches = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        double g = Elem<T>::to_float(got[i]), w = Elem<T>::to_float(want[want_offset + i]);
        if (!(std::fabs(g - w) <= tolerance<T>(magnitude[want_offset + i])) && mismatches++ == 0) first = i;
    }
    std::string detail;
    if (mismatches)
        detail = std::to_string(mismatches) + " of " + std::to_string(got.size()) + " wrong; first at " +
                 std::to_string(first) + ": got " + std::to_string(Elem<T>::to_float(got[first])) + ", want " +
                 std::to_string(Elem<T>::to_float(want[want_offset + first]));
    INFO(what << ": " << detail);
    CHECK(mismatches == 0);
}

template <typename T> void check_same_bytes(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
    REQUIRE(got.size() == want.size());
    size_t mismatches = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i)
        if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && mismatches++ == 0) first = i;
    INFO(what << ": " << mismatches << " of " << got.size() << " elements differ; first at " << first);
    CHECK(mismatches == 0);
}

template <typename T> std::vector<T> slice(const std::vector<T>& v, size_t begin, size_t count) {
    return std::vector<T>(v.begin() + begin, v.begin() + begin + count);
}

// ---- communicators ----

ncclUniqueId broadcast_new_id() {
    ncclUniqueId id{};
    if (world_rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    return id;
}

struct Comm {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    Comm(ncclUniqueId id, int nranks, int rank) {
        CHECK_NCCL(ncclCommInitRank(&comm, nranks, id, rank));
        CUDA_CHECK(cudaStreamCreate(&stream));
    }
    Comm() : Comm(broadcast_new_id(), world_size, world_rank) {}
    ~Comm() {
        cudaStreamDestroy(stream);
        ncclCommDestroy(comm);
    }
    Comm(const Comm&) = delete;
    Comm& operator=(const Comm&) = delete;
    void sync() const { CUDA_CHECK(cudaStreamSynchronize(stream)); }
};

// ---- one collective each: inputs and expectations, the call, the checks ----
// Split in three so that a group test can issue several calls between ncclGroupStart/End.

const char* op_name(ncclRedOp_t op) { return op == ncclAvg ? "avg" : "sum"; }
const char* placement(bool in_place) { return in_place ? "in place" : "out of place"; }

template <typename T> struct AllReduce {
    size_t count;
    ncclRedOp_t op;
    bool in_place;
    std::string what;
    std::vector<T> sent;
    std::vector<float> magnitude;
    std::vector<T> want;
    DeviceBuffer<T> send, separate_recv;

    AllReduce(size_t count_, ncclRedOp_t op_, bool in_place_, int salt)
        : count(count_), op(op_), in_place(in_place_),
          what(std::string("all-reduce ") + Elem<T>::name + " " + op_name(op) + " " + placement(in_place) + " count " +
               std::to_string(count)),
          sent(input<T>(world_rank, count, salt)), want(expected_reduction<T>(count, salt, op, magnitude)),
          send(sent), separate_recv(in_place ? 0 : count) {
        separate_recv.fill_bytes(0xff);  // NaN: an element never written cannot pass
    }
    T* recv() { return in_place ? send.ptr : separate_recv.ptr; }
    ncclResult_t launch(const Comm& c) { return ncclAllReduce(send.ptr, recv(), count, Elem<T>::type, op, c.comm, c.stream); }
    void check() {
        check_reduced((in_place ? send : separate_recv).download(), want, magnitude, 0, what);
        if (!in_place) check_same_bytes(send.download(), sent, what + ", sendbuff afterwards");
    }
};

template <typename T> struct Reduce {
    size_t count;
    ncclRedOp_t op;
    bool in_place;
    int root;
    std::string what;
    std::vector<T> sent;
    std::vector<float> magnitude;
    std::vector<T> want;
    DeviceBuffer<T> send, separate_recv;

    Reduce(size_t count_, ncclRedOp_t op_, bool in_place_, int root_, int salt)
        : count(count_), op(op_), in_place(in_place_), root(root_),
          what(std::string("reduce ") + Elem<T>::name + " " + op_name(op) + " " + placement(in_place) + " count " +
               std::to_string(count) + " root " + std::to_string(root)),
          sent(input<T>(world_rank, count, salt)), want(expected_reduction<T>(count, salt, op, magnitude)),
          send(sent), separate_recv(in_place ? 0 : count) {
        separate_recv.fill_bytes(0xff);
    }
    T* recv() { return in_place ? send.ptr : separate_recv.ptr; }
    ncclResult_t launch(const Comm& c) {
        return ncclReduce(send.ptr, recv(), count, Elem<T>::type, op, root, c.comm, c.stream);
    }
    void check() {
        if (world_rank == root) {
            check_reduced((in_place ? send : separate_recv).download(), want, magnitude, 0, what);
        } else if (in_place) {
            check_same_bytes(send.download(), sent, what + ", non-root buffer afterwards");  // only the root receives
        }
        if (!in_place) check_same_bytes(send.download(), sent, what + ", sendbuff afterwards");
    }
};

template <typename T> struct ReduceScatter {
    size_t recvcount;
    ncclRedOp_t op;
    bool in_place;
    std::string what;
    std::vector<T> sent;
    std::vector<float> magnitude;
    std::vector<T> want;  // the whole reduced array; this rank checks block `rank`
    DeviceBuffer<T> send, separate_recv;

    ReduceScatter(size_t recvcount_, ncclRedOp_t op_, bool in_place_, int salt)
        : recvcount(recvcount_), op(op_), in_place(in_place_),
          what(std::string("reduce-scatter ") + Elem<T>::name + " " + op_name(op) + " " + placement(in_place) +
               " recvcount " + std::to_string(recvcount)),
          sent(input<T>(world_rank, recvcount * world_size, salt)),
          want(expected_reduction<T>(recvcount * world_size, salt, op, magnitude)), send(sent),
          separate_recv(in_place ? 0 : recvcount) {
        separate_recv.fill_bytes(0xff);
    }
    // In place: recvbuff == sendbuff + rank * recvcount (NCCL User Guide, "In-place Operations").
    T* recv() { return in_place ? send.ptr + size_t(world_rank) * recvcount : separate_recv.ptr; }
    ncclResult_t launch(const Comm& c) {
        return ncclReduceScatter(send.ptr, recv(), recvcount, Elem<T>::type, op, c.comm, c.stream);
    }
    void check() {
        std::vector<T> got = in_place ? slice(send.download(), size_t(world_rank) * recvcount, recvcount)
                                      : separate_recv.download();
        check_reduced(got, want, magnitude, size_t(world_rank) * recvcount, what);
        if (!in_place) check_same_bytes(send.download(), sent, what + ", sendbuff afterwards");
    }
};

template <typename T> struct AllGather {
    size_t sendcount;
    bool in_place;
    std::string what;
    std::vector<T> own, want;
    DeviceBuffer<T> separate_send, recv;

    AllGather(size_t sendcount_, bool in_place_, int salt)
        : sendcount(sendcount_), in_place(in_place_),
          what(std::string("all-gather ") + Elem<T>::name + " " + placement(in_place) + " sendcount " +
               std::to_string(sendcount)),
          own(input<T>(world_rank, sendcount, salt)), separate_send(in_place ? std::vector<T>() : own),
          recv(sendcount * world_size) {
        for (int r = 0; r < world_size; ++r) {
            std::vector<T> block = input<T>(r, sendcount, salt);
            want.insert(want.end(), block.begin(), block.end());
        }
        recv.fill_bytes(0xff);
        if (in_place) CUDA_CHECK(cudaMemcpy(send(), own.data(), sendcount * sizeof(T), cudaMemcpyHostToDevice));
    }
    // In place: sendbuff == recvbuff + rank * sendcount (NCCL User Guide, "In-place Operations").
    T* send() { return in_place ? recv.ptr + size_t(world_rank) * sendcount : separate_send.ptr; }
    ncclResult_t launch(const Comm& c) { return ncclAllGather(send(), recv.ptr, sendcount, Elem<T>::type, c.comm, c.stream); }
    void check() {
        check_same_bytes(recv.download(), want, what);
        if (!in_place) check_same_bytes(separate_send.download(), own, what + ", sendbuff afterwards");
    }
};

template <typename T> struct Broadcast {
    size_t count;
    int root;
    bool in_place;
    std::string what;
    std::vector<T> sent, want;
    DeviceBuffer<T> send, separate_recv;

    // Non-root ranks pass their own data as sendbuff, which NCCL ignores there.
    Broadcast(size_t count_, int root_, bool in_place_, int salt)
        : count(count_), root(root_), in_place(in_place_),
          what(std::string("broadcast ") + Elem<T>::name + " " + placement(in_place) + " count " +
               std::to_string(count) + " root " + std::to_string(root)),
          sent(input<T>(world_rank, count, salt)), want(input<T>(root, count, salt)), send(sent),
          separate_recv(in_place ? 0 : count) {
        separate_recv.fill_bytes(0xff);
    }
    T* recv() { return in_place ? send.ptr : separate_recv.ptr; }
    ncclResult_t launch(const Comm& c) {
        return ncclBroadcast(send.ptr, recv(), count, Elem<T>::type, root, c.comm, c.stream);
    }
    void check() {
        check_same_bytes((in_place ? send : separate_recv).download(), want, what);
        if (!in_place) check_same_bytes(send.download(), sent, what + ", sendbuff afterwards");
    }
};

template <typename Collective> void run(const Comm& c, Collective&& collective) {
    INFO(collective.what);
    CHECK_NCCL(collective.launch(c));
    c.sync();
    collective.check();
}

const ncclRedOp_t kOps[] = {ncclSum, ncclAvg};
const bool kPlacements[] = {false, true};

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST_CASE("a communicator from a broadcast unique id spans every rank") {
    Comm c;
    int count = -1, rank = -1, device = -1, current_device = -2, version = 0;
    CHECK_NCCL(ncclCommCount(c.comm, &count));
    CHECK_NCCL(ncclCommUserRank(c.comm, &rank));
    CHECK_NCCL(ncclCommCuDevice(c.comm, &device));
    CUDA_CHECK(cudaGetDevice(&current_device));
    CHECK(count == world_size);
    CHECK(rank == world_rank);
    CHECK(device == current_device);
    CHECK_NCCL(ncclGetVersion(&version));
    CHECK(version / 10000 == NCCL_MAJOR);
    CHECK(std::string(ncclGetErrorString(ncclInvalidArgument)) != ncclGetErrorString(ncclSuccess));
}

TEST_CASE("all-reduce: fp32 and bf16, sum and avg, in place and out of place") {
    Comm c;
    int salt = 0;
    for (size_t count : {size_t(1), size_t(7), size_t(1001)})
        for (ncclRedOp_t op : kOps)
            for (bool in_place : kPlacements) {
                run(c, AllReduce<float>(count, op, in_place, ++salt));
                run(c, AllReduce<bf16>(count, op, in_place, ++salt));
            }
}

TEST_CASE("reduce to one root: fp32 and bf16, sum and avg, in place and out of place, every root") {
    Comm c;
    int salt = 500;
    for (size_t count : {size_t(1), size_t(7), size_t(1001)})
        for (ncclRedOp_t op : kOps)
            for (bool in_place : kPlacements)
                for (int root = 0; root < world_size; ++root) {
                    run(c, Reduce<float>(count, op, in_place, root, ++salt));
                    run(c, Reduce<bf16>(count, op, in_place, root, ++salt));
                }
}

TEST_CASE("reduce-scatter: fp32 and bf16, sum and avg, in place and out of place, odd counts") {
    Comm c;
    int salt = 100;
    for (size_t recvcount : {size_t(1), size_t(5), size_t(333)})
        for (ncclRedOp_t op : kOps)
            for (bool in_place : kPlacements) {
                run(c, ReduceScatter<float>(recvcount, op, in_place, ++salt));
                run(c, ReduceScatter<bf16>(recvcount, op, in_place, ++salt));
            }
}

TEST_CASE("all-gather: fp32, bf16, int32 and uint8, in place and out of place, odd counts") {
    Comm c;
    int salt = 200;
    for (size_t sendcount : {size_t(1), size_t(7), size_t(501)})
        for (bool in_place : kPlacements) {
            run(c, AllGather<float>(sendcount, in_place, ++salt));
            run(c, AllGather<bf16>(sendcount, in_place, ++salt));
            run(c, AllGather<int32_t>(sendcount, in_place, ++salt));
            run(c, AllGather<uint8_t>(sendcount, in_place, ++salt));
        }
}

TEST_CASE("broadcast: from rank 0 and from the last rank, every type, in place and out of place") {
    Comm c;
    int salt = 300;
    std::vector<int> roots = {0};
    if (world_size > 1) roots.push_back(world_size - 1);
    for (int root : roots)
        for (size_t count : {size_t(7), size_t(1001)})
            for (bool in_place : kPlacements) {
                run(c, Broadcast<float>(count, root, in_place, ++salt));
                run(c, Broadcast<bf16>(count, root, in_place, ++salt));
                run(c, Broadcast<int32_t>(count, root, in_place, ++salt));
                run(c, Broadcast<uint8_t>(count, root, in_place, ++salt));
            }
}

TEST_CASE("collectives larger than the emulation's 16 MiB scratch run in several rounds") {
    Comm c;
    // Sizes past 16 MiB per buffer (with 2+ ranks for the per-rank counts), not multiples of 2 or 3.
    run(c, AllReduce<float>(5'000'011, ncclSum, true, 401));
    run(c, ReduceScatter<bf16>(4'500'001, ncclAvg, true, 402));
    run(c, AllGather<uint8_t>(9'000'001, true, 403));
    run(c, Broadcast<float>(5'000'011, world_size - 1, false, 404));
}

TEST_CASE("group start/end around several collectives, nested") {
    Comm c;
    AllReduce<float> all_reduce(1001, ncclSum, false, 501);
    ReduceScatter<bf16> reduce_scatter(5, ncclAvg, true, 502);
    AllGather<int32_t> all_gather(7, false, 503);
    Broadcast<uint8_t> broadcast(1001, world_size - 1, true, 504);
    AllReduce<bf16> nested_all_reduce(7, ncclAvg, true, 505);
    CHECK_NCCL(ncclGroupStart());
    CHECK_NCCL(all_reduce.launch(c));
    CHECK_NCCL(reduce_scatter.launch(c));
    CHECK_NCCL(ncclGroupStart());
    CHECK_NCCL(nested_all_reduce.launch(c));
    CHECK_NCCL(ncclGroupEnd());
    CHECK_NCCL(all_gather.launch(c));
    CHECK_NCCL(broadcast.launch(c));
    CHECK_NCCL(ncclGroupEnd());
    c.sync();
    all_reduce.check();
    reduce_scatter.check();
    nested_all_reduce.check();
    all_gather.check();
    broadcast.check();
}

TEST_CASE("two communicators from two unique ids, used in turn") {
    ncclUniqueId ids[2] = {};
    if (world_rank == 0) {
        CHECK_NCCL(ncclGetUniqueId(&ids[0]));
        CHECK_NCCL(ncclGetUniqueId(&ids[1]));
        CHECK(std::memcmp(&ids[0], &ids[1], sizeof ids[0]) != 0);
    }
    MPI_Bcast(ids, sizeof ids, MPI_BYTE, 0, MPI_COMM_WORLD);
    Comm a(ids[0], world_size, world_rank), b(ids[1], world_size, world_rank);
    for (int round = 0; round < 2; ++round) {
        run(a, AllReduce<float>(1001, ncclSum, false, 600 + round));
        run(b, AllReduce<bf16>(7, ncclAvg, true, 610 + round));
        run(a, Broadcast<int32_t>(7, world_size - 1, false, 620 + round));
    }
}

TEST_CASE("communicators of disjoint rank subsets: even and odd ranks") {
    ncclUniqueId ids[2] = {};
    if (world_rank == 0) {
        CHECK_NCCL(ncclGetUniqueId(&ids[0]));
        CHECK_NCCL(ncclGetUniqueId(&ids[1]));
    }
    MPI_Bcast(ids, sizeof ids, MPI_BYTE, 0, MPI_COMM_WORLD);
    const int parity = world_rank % 2, group_size = (world_size + 1 - parity) / 2;
    Comm half(ids[parity], group_size, world_rank / 2);
    int count = -1, rank = -1;
    CHECK_NCCL(ncclCommCount(half.comm, &count));
    CHECK_NCCL(ncclCommUserRank(half.comm, &rank));
    CHECK(count == group_size);
    CHECK(rank == world_rank / 2);
    // Sum of (world rank + 1) over the group: small integers, exact in any order.
    DeviceBuffer<float> value(std::vector<float>(3, float(world_rank + 1)));
    CHECK_NCCL(ncclAllReduce(value.ptr, value.ptr, 3, ncclFloat32, ncclSum, half.comm, half.stream));
    half.sync();
    float want = 0;
    for (int r = parity; r < world_size; r += 2) want += float(r + 1);
    CHECK(value.download() == std::vector<float>(3, want));
}

TEST_CASE("process groups: along every axis of every grid shape, a collective reaches exactly the group") {
    // Every (tensor, context, pipeline, data) split of the world; at 4 ranks, two axes of 2 too.
    for (int t = 1; t <= world_size; ++t)
        for (int c = 1; c <= world_size; ++c)
            for (int p = 1; p <= world_size; ++p) {
                if (world_size % (t * c * p) != 0) continue;
                const GridCoordinates shape{t, c, p, world_size / (t * c * p)};
                for (Axis axis : kAxes) {
                    INFO("tp " << t << " cp " << c << " pp " << p << ", the " << axis_name(axis) << " group");
                    ProcessGroup g = make_process_group(shape, world_rank, axis);
                    CHECK(g.rank == grid_position(world_rank, shape)[axis]);
                    CHECK(g.size == shape[axis]);
                    int mpi_rank = -1;
                    MPI_Comm_rank(g.mpi, &mpi_rank);
                    CHECK(mpi_rank == g.rank);
                    // Sums of (world rank + 1) over the group, on the device (NCCL) and the host (MPI).
                    float want = 0;
                    for (int member : group_ranks(world_rank, shape, axis)) want += float(member + 1);
                    DeviceBuffer<float> value(std::vector<float>(2, float(world_rank + 1)));
                    cudaStream_t stream;
                    CUDA_CHECK(cudaStreamCreate(&stream));
                    CHECK_NCCL(ncclAllReduce(value.ptr, value.ptr, 2, ncclFloat32, ncclSum, g.nccl, stream));
                    CUDA_CHECK(cudaStreamSynchronize(stream));
                    CUDA_CHECK(cudaStreamDestroy(stream));
                    CHECK(value.download() == std::vector<float>(2, want));
                    float host = float(world_rank + 1), host_sum = 0;
                    MPI_Allreduce(&host, &host_sum, 1, MPI_FLOAT, MPI_SUM, g.mpi);
                    CHECK(host_sum == want);
                    release_process_group(g);
                }
            }
}

TEST_CASE("reductions sum in FP32 in rank order and round to the data type once") {
    Comm c;
    // bf16: rank 0 gives 1, the others 2^-8 (half a bf16 ulp at 1). The FP32 sum 1 + (n-1)*2^-8
    // is exact and rounds once to nearest even: 1 for n = 2 (a tie), 1 + 2^-7 for n = 3.
    // Rounding each partial sum to bf16 would give 1 for every n.
    const float small = std::ldexp(1.0f, -8);
    DeviceBuffer<bf16> half_ulps(std::vector<bf16>(5, __float2bfloat16(world_rank == 0 ? 1.0f : small)));
    CHECK_NCCL(ncclAllReduce(half_ulps.ptr, half_ulps.ptr, 5, ncclBfloat16, ncclSum, c.comm, c.stream));
    // fp32: rank 0 gives 2^24, the others 1. In rank order every +1 is a tie that rounds back to
    // 2^24; summing the ones first would give 2^24 + (n-1) for n = 3.
    const float big = std::ldexp(1.0f, 24);
    DeviceBuffer<float> ones_after_big(std::vector<float>(5, world_rank == 0 ? big : 1.0f));
    CHECK_NCCL(ncclAllReduce(ones_after_big.ptr, ones_after_big.ptr, 5, ncclFloat32, ncclSum, c.comm, c.stream));
    c.sync();
    std::vector<float> bf16_magnitude(5, 1.0f + (world_size - 1) * small);
    check_reduced(half_ulps.download(), std::vector<bf16>(5, __float2bfloat16(1.0f + (world_size - 1) * small)),
                  bf16_magnitude, 0, "bf16 sum rounded once");
    std::vector<float> fp32_magnitude(5, big + (world_size - 1));
    check_reduced(ones_after_big.download(), std::vector<float>(5, big), fp32_magnitude, 0, "fp32 sum in rank order");
}

TEST_CASE("invalid arguments are rejected, and the communicator still works afterwards") {
    Comm c;
    DeviceBuffer<float> buffer(8);
    buffer.fill_bytes(0);
    std::fprintf(stderr, "[rank %d] the error messages below are expected\n", world_rank);
    CHECK(ncclBroadcast(buffer.ptr, buffer.ptr, 8, ncclFloat32, world_size, c.comm, c.stream) == ncclInvalidArgument);
    CHECK(ncclBroadcast(buffer.ptr, buffer.ptr, 8, ncclFloat32, -1, c.comm, c.stream) == ncclInvalidArgument);
    CHECK(ncclAllReduce(buffer.ptr, buffer.ptr, 8, ncclDataType_t(ncclNumTypes), ncclSum, c.comm, c.stream) ==
          ncclInvalidArgument);
    CHECK(ncclAllReduce(buffer.ptr, buffer.ptr, 8, ncclFloat32, ncclSum, nullptr, c.stream) == ncclInvalidArgument);
    ncclComm_t unused = nullptr;
    ncclUniqueId id = broadcast_new_id();
    CHECK(ncclCommInitRank(&unused, world_size, id, world_size) == ncclInvalidArgument);
    CHECK(ncclCommInitRank(&unused, world_size, id, -1) == ncclInvalidArgument);
    std::fprintf(stderr, "[rank %d] end of expected error messages\n", world_rank);
    run(c, AllReduce<float>(7, ncclSum, false, 700));
}

// ---- point to point ----

TEST_CASE("point to point: a ring inside a group, several messages per pair in order, FP32 and BF16") {
    Comm c;
    const int next = (world_rank + 1) % world_size, prev = (world_rank + world_size - 1) % world_size;
    const std::vector<float> a = input<float>(world_rank, 1000, 900), b = input<float>(world_rank, 37, 901);
    const std::vector<__nv_bfloat16> h = input<__nv_bfloat16>(world_rank, 64, 902);
    DeviceBuffer<float> send_a(a), send_b(b), recv_a(1000), recv_b(37);
    DeviceBuffer<__nv_bfloat16> send_h(h), recv_h(64);
    recv_a.fill_bytes(0xff);
    recv_b.fill_bytes(0xff);
    recv_h.fill_bytes(0xff);
    auto sends = [&] {
        CHECK_NCCL(ncclSend(send_a.ptr, 1000, ncclFloat32, next, c.comm, c.stream));
        CHECK_NCCL(ncclSend(send_b.ptr, 37, ncclFloat32, next, c.comm, c.stream));
        CHECK_NCCL(ncclSend(send_h.ptr, 64, ncclBfloat16, next, c.comm, c.stream));
    };
    auto receives = [&] {
        CHECK_NCCL(ncclRecv(recv_a.ptr, 1000, ncclFloat32, prev, c.comm, c.stream));
        CHECK_NCCL(ncclRecv(recv_b.ptr, 37, ncclFloat32, prev, c.comm, c.stream));
        CHECK_NCCL(ncclRecv(recv_h.ptr, 64, ncclBfloat16, prev, c.comm, c.stream));
    };
    // Inside a group the order of sends and receives does not matter: odd ranks receive first.
    CHECK_NCCL(ncclGroupStart());
    if (world_rank % 2) {
        receives();
        sends();
    } else {
        sends();
        receives();
    }
    CHECK_NCCL(ncclGroupEnd());
    c.sync();
    check_same_bytes(recv_a.download(), input<float>(prev, 1000, 900), "ring: first message from rank " + std::to_string(prev));
    check_same_bytes(recv_b.download(), input<float>(prev, 37, 901), "ring: second message");
    check_same_bytes(recv_h.download(), input<__nv_bfloat16>(prev, 64, 902), "ring: third message (bf16)");
    check_same_bytes(send_a.download(), a, "ring: sendbuff afterwards");
}

TEST_CASE("point to point: pairs exchange outside a group, one side sending first") {
    Comm c;
    const int partner = world_rank ^ 1;
    if (partner >= world_size) {  // the last rank of an odd world has no partner
        CHECK(world_size % 2 == 1);
        return;
    }
    const std::vector<float> mine = input<float>(world_rank, 513, 910);
    DeviceBuffer<float> send(mine), recv(513);
    recv.fill_bytes(0xff);
    if (world_rank % 2 == 0) {
        CHECK_NCCL(ncclSend(send.ptr, 513, ncclFloat32, partner, c.comm, c.stream));
        CHECK_NCCL(ncclRecv(recv.ptr, 513, ncclFloat32, partner, c.comm, c.stream));
    } else {
        CHECK_NCCL(ncclRecv(recv.ptr, 513, ncclFloat32, partner, c.comm, c.stream));
        CHECK_NCCL(ncclSend(send.ptr, 513, ncclFloat32, partner, c.comm, c.stream));
    }
    c.sync();
    check_same_bytes(recv.download(), input<float>(partner, 513, 910), "pair exchange with rank " + std::to_string(partner));
}

// Captured into a CUDA graph (as --cuda-graphs captures the ring of --cp): the capture moves nothing;
// every launch of the graph runs the group again, with whatever the send buffer holds by then.
TEST_CASE("point to point captured into a CUDA graph: nothing moves at capture, every launch moves the data") {
    Comm c;
    const int next = (world_rank + 1) % world_size, prev = (world_rank + world_size - 1) % world_size;
    DeviceBuffer<float> send(input<float>(world_rank, 300, 930)), recv(300);
    recv.fill_bytes(0xff);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal));
    CHECK_NCCL(ncclGroupStart());
    CHECK_NCCL(ncclRecv(recv.ptr, 300, ncclFloat32, prev, c.comm, c.stream));
    CHECK_NCCL(ncclSend(send.ptr, 300, ncclFloat32, next, c.comm, c.stream));
    CHECK_NCCL(ncclGroupEnd());
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(c.stream, &graph));
    const std::vector<float> before = recv.download();
    CHECK(std::all_of(before.begin(), before.end(), [](float x) { return std::isnan(x); }));  // still the 0xff fill
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int launch = 0; launch < 2; ++launch) {
        send.upload(input<float>(world_rank, 300, 930 + launch));
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaGraphLaunch(exec, c.stream));
        c.sync();
        check_same_bytes(recv.download(), input<float>(prev, 300, 930 + launch),
                         "graph launch " + std::to_string(launch) + ": the message from rank " + std::to_string(prev));
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
}

#ifndef __CUDACC__
// Where real NCCL would hang or corrupt, the emulation names the mistake and returns an error.
TEST_CASE("emulation: point-to-point mistakes are reported, a deadlock after CUEMU_NCCL_P2P_TIMEOUT, not hung") {
    Comm c;
    DeviceBuffer<float> send(std::vector<float>(16, 1.0f)), recv(16);
    std::fprintf(stderr, "[rank %d] the error messages below are expected\n", world_rank);
    CHECK(ncclSend(send.ptr, 16, ncclFloat32, world_size, c.comm, c.stream) == ncclInvalidArgument);
    CHECK(ncclRecv(recv.ptr, 16, ncclFloat32, -1, c.comm, c.stream) == ncclInvalidArgument);
    // To itself outside a group: nothing could ever match it.
    CHECK(ncclSend(send.ptr, 16, ncclFloat32, world_rank, c.comm, c.stream) == ncclInvalidUsage);
    CHECK(std::string(ncclGetLastError(c.comm)).find("wait forever") != std::string::npos);
    // To itself inside a group with sizes that differ.
    CHECK_NCCL(ncclGroupStart());
    CHECK_NCCL(ncclSend(send.ptr, 8, ncclFloat32, world_rank, c.comm, c.stream));
    CHECK_NCCL(ncclRecv(recv.ptr, 16, ncclFloat32, world_rank, c.comm, c.stream));
    CHECK(ncclGroupEnd() == ncclInvalidUsage);
    // Pairs (0, 1), (2, 3), ...: the last rank of an odd world has no partner and only joins the barriers.
    const int partner = world_rank ^ 1;
    const bool paired = partner < world_size;
    DeviceBuffer<float> large(std::vector<float>(32, 2.0f));
    // The receiver (the odd rank) expects 16 floats: 8 arrive, then 32 do not fit.
    for (size_t sent : {size_t(8), size_t(32)}) {
        if (paired && world_rank % 2 == 0) {
            CHECK(ncclSend(large.ptr, sent, ncclFloat32, partner, c.comm, c.stream) == ncclSuccess);
        } else if (paired) {
            CHECK(ncclRecv(recv.ptr, 16, ncclFloat32, partner, c.comm, c.stream) == ncclInvalidUsage);
            CHECK(std::string(ncclGetLastError(c.comm)).find("must match in order and size") != std::string::npos);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
    // Both of a pair receive first, outside a group: a deadlock in NCCL; here an error on both after
    // the timeout, naming what is unmatched.
    if (paired) {
        setenv("CUEMU_NCCL_P2P_TIMEOUT", "1", 1);
        const auto begin = std::chrono::steady_clock::now();
        CHECK(ncclRecv(recv.ptr, 16, ncclFloat32, partner, c.comm, c.stream) == ncclInvalidUsage);
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
        unsetenv("CUEMU_NCCL_P2P_TIMEOUT");
        const std::string message = ncclGetLastError(c.comm);
        CHECK(message.find("deadlock") != std::string::npos);
        CHECK(message.find("ncclRecv of 64 bytes from rank " + std::to_string(partner)) != std::string::npos);
        CHECK(waited >= 1.0);
        CHECK(waited < 30.0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    std::fprintf(stderr, "[rank %d] end of expected error messages\n", world_rank);
    // The communicator still works: a ring inside a group.
    const int next = (world_rank + 1) % world_size, prev = (world_rank + world_size - 1) % world_size;
    DeviceBuffer<float> ring_send(input<float>(world_rank, 16, 920)), ring_recv(16);
    CHECK_NCCL(ncclGroupStart());
    CHECK_NCCL(ncclRecv(ring_recv.ptr, 16, ncclFloat32, prev, c.comm, c.stream));
    CHECK_NCCL(ncclSend(ring_send.ptr, 16, ncclFloat32, next, c.comm, c.stream));
    CHECK_NCCL(ncclGroupEnd());
    check_same_bytes(ring_recv.download(), input<float>(prev, 16, 920), "ring after the mistakes");
}

// What the emulation adds: real NCCL supports more ops and types, and hangs where ranks disagree.
TEST_CASE("emulation: unsupported or inconsistent calls fail on every rank instead of hanging") {
    Comm c;
    DeviceBuffer<float> buffer(8);
    buffer.fill_bytes(0);
    std::fprintf(stderr, "[rank %d] the error messages below are expected\n", world_rank);
    CHECK(ncclAllReduce(buffer.ptr, buffer.ptr, 8, ncclFloat32, ncclProd, c.comm, c.stream) == ncclInvalidArgument);
    CHECK(ncclAllReduce(buffer.ptr, buffer.ptr, 8, ncclInt32, ncclSum, c.comm, c.stream) == ncclInvalidArgument);
    CHECK(ncclGroupEnd() == ncclInvalidUsage);
    // Overlapping buffers that are not the documented in-place layout.
    CHECK(ncclAllReduce(buffer.ptr, buffer.ptr + 1, 4, ncclFloat32, ncclSum, c.comm, c.stream) == ncclInvalidArgument);
    // recvbuff == sendbuff is in place only on rank 0; the other ranks' error fails every rank.
    const ncclResult_t when_ranks_differ = world_size > 1 ? ncclInvalidArgument : ncclSuccess;
    CHECK(ncclReduceScatter(buffer.ptr, buffer.ptr, 2, ncclFloat32, ncclSum, c.comm, c.stream) == when_ranks_differ);
    // Ranks that disagree on the count, or call different collectives.
    const ncclResult_t when_ranks_disagree = world_size > 1 ? ncclInvalidUsage : ncclSuccess;
    CHECK(ncclAllReduce(buffer.ptr, buffer.ptr, 1 + world_rank, ncclFloat32, ncclSum, c.comm, c.stream) ==
          when_ranks_disagree);
    CHECK((world_rank == 0 ? ncclAllReduce(buffer.ptr, buffer.ptr, 1, ncclFloat32, ncclSum, c.comm, c.stream)
                           : ncclBroadcast(buffer.ptr, buffer.ptr, 1, ncclFloat32, 0, c.comm, c.stream)) ==
          when_ranks_disagree);
    // A communicator with a rank missing, or a rank given twice.
    ncclComm_t bad = nullptr;
    CHECK(ncclCommInitRank(&bad, world_size + 1, broadcast_new_id(), world_rank) == ncclInvalidArgument);
    CHECK(bad == nullptr);
    ncclResult_t same_rank = ncclCommInitRank(&bad, world_size, broadcast_new_id(), 0);
    CHECK(same_rank == when_ranks_differ);
    ncclCommDestroy(bad);
    std::fprintf(stderr, "[rank %d] end of expected error messages\n", world_rank);
    run(c, AllReduce<float>(7, ncclSum, false, 800));
}
#endif

// Hidden (tag [.]; CTest's mpi_rank_leaves runs it alone): rank 1 fails a REQUIRE while the others wait
// for it at a barrier. test/mpi_catch_main.cpp's listener must end the job, not leave them waiting.
TEST_CASE("a rank that fails a REQUIRE ends the job instead of leaving the others waiting", "[.rank-leaves]") {
    if (world_size > 1) REQUIRE(world_rank != 1);  // the planted failure
    MPI_Barrier(MPI_COMM_WORLD);                   // rank 0 would wait here forever
    CHECK(world_size == 1);                        // with 2 or more ranks never reached: the job is gone
}

// ---------------------------------------------------------------------------------------------

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);

    if (!mpi_test_device_per_rank("test_mpi_nccl")) {  // one GPU per rank, or skipped
        MPI_Finalize();
        return kSkipReturnCode;
    }

    const int failed = run_catch_session(
        argc, argv, "test_mpi_nccl rank " + std::to_string(world_rank) + " of " + std::to_string(world_size));
    int ranks_failed = failed != 0;
    MPI_Allreduce(MPI_IN_PLACE, &ranks_failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (world_rank == 0)
        std::printf("test_mpi_nccl: %d rank(s), %d with failures\n", world_size, ranks_failed);
    MPI_Finalize();
    return ranks_failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
