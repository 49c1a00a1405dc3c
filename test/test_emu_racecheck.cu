// The emulator's happens-before race detector (emu/racecheck.cpp; cuda_emu.h, "Race detection"):
// planted stream-ordering bugs are reported, naming both operations, their streams and the memory,
// and their correctly ordered twins are not. Work runs synchronously on the CPU, so every one of
// these programs computes the right numbers here; only the detector can tell them apart.
// (No GPU build: these test emu/ itself. The model is included for the sampling case.)
// built into: test_emu_suite
#define TRAIN_GPT_NO_MAIN
#include "../train_gpt.cu"

#include "mpi_test_util.h"
#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>

namespace {

// Collects reports for the test case and restores the suite's mode afterwards.
struct CollectRaces {
    cuemu::Racecheck saved = cuemu::racecheck();
    CollectRaces() { cuemu::set_racecheck(cuemu::Racecheck::collect); }
    ~CollectRaces() { cuemu::set_racecheck(saved); }
    std::vector<std::string> take() { return cuemu::take_race_reports(); }
};

struct Stream {
    cudaStream_t s = nullptr;
    explicit Stream(unsigned flags) { CUDA_CHECK(cudaStreamCreateWithFlags(&s, flags)); }
    ~Stream() { cudaStreamDestroy(s); }
    operator cudaStream_t() const { return s; }
};

struct Event {
    cudaEvent_t e = nullptr;
    Event() { CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); }
    ~Event() { cudaEventDestroy(e); }
    operator cudaEvent_t() const { return e; }
};

}  // namespace

// Kernels outside the anonymous namespace, so that reports name them plainly.
__global__ void fill_kernel(float* out, float value, int n) {
    const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) out[i] = value;
}

__global__ void copy_kernel(float* out, const float* in, int n) {
    const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) out[i] = in[i];
}

// A kernel that takes its buffers inside a struct: the detector scans it for device addresses.
struct Buffers {
    float* out;
    const float* in;
    int n;
};
__global__ void copy_struct_kernel(Buffers b) {
    const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < b.n) b.out[i] = b.in[i];
}

namespace {

constexpr int kN = 256;

void fill(float* out, float value, cudaStream_t stream) { launch<fill_kernel>(dim3(1), dim3(kN), 0, stream, out, value, kN); }
void copy(float* out, const float* in, cudaStream_t stream) { launch<copy_kernel>(dim3(1), dim3(kN), 0, stream, out, in, kN); }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("racecheck: a missing cudaStreamWaitEvent between two non-blocking streams is a race; the wait orders them") {
    CollectRaces races;
    Stream producer(cudaStreamNonBlocking), consumer(cudaStreamNonBlocking);
    DeviceBuffer<float> a(kN), b(kN);
    label_device_memory(a.ptr, kN * sizeof(float), "produced");

    fill(a.ptr, 1.0f, producer);
    copy(b.ptr, a.ptr, consumer);  // reads what the producer wrote, with nothing ordering the two
    std::vector<std::string> reports = races.take();
    REQUIRE(reports.size() == 1);
    const std::string& r = reports[0];
    INFO(r);
    CHECK(contains(r, "read by copy_kernel"));
    CHECK(contains(r, "written by fill_kernel"));
    CHECK(contains(r, "\"produced\""));
    CHECK(contains(r, "(non-blocking)"));
    CHECK(contains(r, "of " + std::to_string(kN * sizeof(float)) + " bytes"));
    CUDA_CHECK(cudaStreamSynchronize(consumer));  // before the legacy stream's download
    CHECK(b.download() == std::vector<float>(kN, 1.0f));  // on the CPU the result is right all the same

    Event produced;
    fill(a.ptr, 2.0f, producer);
    CUDA_CHECK(cudaEventRecord(produced, producer));
    CUDA_CHECK(cudaStreamWaitEvent(consumer, produced, 0));
    copy(b.ptr, a.ptr, consumer);
    CHECK(races.take().empty());

    // The wait orders only what was recorded before it: a later write on the producer races again.
    CUDA_CHECK(cudaStreamSynchronize(consumer));  // (the producer's next write must not race with the read)
    fill(a.ptr, 3.0f, producer);
    copy(b.ptr, a.ptr, consumer);
    CHECK(races.take().size() == 1);
}

TEST_CASE("racecheck: a plain cudaMemcpy is ordered after a blocking stream's kernel, not after a non-blocking stream's") {
    CollectRaces races;
    DeviceBuffer<float> a(kN);
    std::vector<float> host(kN);
    {
        Stream blocking(cudaStreamDefault);
        fill(a.ptr, 1.0f, blocking);
        CUDA_CHECK(cudaMemcpy(host.data(), a.ptr, kN * sizeof(float), cudaMemcpyDeviceToHost));
        CHECK(races.take().empty());
        // ... and the other way: a blocking stream's kernel waits for the legacy stream's copy.
        CUDA_CHECK(cudaMemcpy(a.ptr, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice));
        fill(a.ptr, 2.0f, blocking);
        CHECK(races.take().empty());
    }
    CUDA_CHECK(cudaDeviceSynchronize());  // a non-blocking stream would not wait for the blocking one
    Stream non_blocking(cudaStreamNonBlocking);
    fill(a.ptr, 1.0f, non_blocking);
    CUDA_CHECK(cudaMemcpy(host.data(), a.ptr, kN * sizeof(float), cudaMemcpyDeviceToHost));
    std::vector<std::string> reports = races.take();
    REQUIRE(reports.size() == 1);
    INFO(reports[0]);
    CHECK(contains(reports[0], "read by cudaMemcpy (device to host)"));
    CHECK(contains(reports[0], "on the legacy default stream"));
    CHECK(contains(reports[0], "written by fill_kernel"));
    CHECK(contains(reports[0], "does not wait for a non-blocking stream"));

    // The synchronous device-to-host copy made the host wait for the legacy stream only; a host
    // write through the legacy stream (trainer_start's old pattern) does not order the non-blocking
    // stream's next kernel either.
    CUDA_CHECK(cudaStreamSynchronize(non_blocking));
    CUDA_CHECK(cudaMemcpy(a.ptr, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice));
    DeviceBuffer<float> b(kN);
    copy(b.ptr, a.ptr, non_blocking);
    reports = races.take();
    REQUIRE(reports.size() == 1);
    CHECK(contains(reports[0], "written by cudaMemcpy (host to device)"));
    CUDA_CHECK(cudaDeviceSynchronize());  // a clean slate: a race's operations are remembered too
    // The fix: the copy on the kernel's own stream.
    CUDA_CHECK(cudaMemcpyAsync(a.ptr, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice, non_blocking));
    copy(b.ptr, a.ptr, non_blocking);
    CHECK(races.take().empty());
}

TEST_CASE("racecheck: host synchronization orders a stream's work before what the host enqueues next") {
    CollectRaces races;
    Stream s1(cudaStreamNonBlocking), s2(cudaStreamNonBlocking);
    DeviceBuffer<float> a1(kN), a2(kN), a3(kN), a4(kN), b(kN);
    Event done;
    fill(a1.ptr, 1.0f, s1);
    CUDA_CHECK(cudaStreamSynchronize(s1));
    copy(b.ptr, a1.ptr, s2);
    fill(a2.ptr, 2.0f, s1);
    CUDA_CHECK(cudaEventRecord(done, s1));
    CUDA_CHECK(cudaEventSynchronize(done));
    copy(b.ptr, a2.ptr, s2);
    fill(a3.ptr, 3.0f, s1);
    CUDA_CHECK(cudaDeviceSynchronize());
    copy(b.ptr, a3.ptr, s2);
    CHECK(races.take().empty());
    // A synchronization of the wrong stream orders nothing.
    fill(a4.ptr, 4.0f, s1);
    CUDA_CHECK(cudaStreamSynchronize(s2));
    copy(b.ptr, a4.ptr, s2);
    CHECK(races.take().size() == 1);
}

TEST_CASE("racecheck: a write after another stream's read is a race") {
    CollectRaces races;
    Stream reader(cudaStreamNonBlocking), writer(cudaStreamNonBlocking);
    DeviceBuffer<float> a(kN), b(kN);
    fill(a.ptr, 1.0f, reader);
    CUDA_CHECK(cudaStreamSynchronize(reader));  // so that only the read below is unordered
    copy(b.ptr, a.ptr, reader);  // reads a
    fill(a.ptr, 2.0f, writer);   // overwrites it: the read may not have happened yet
    std::vector<std::string> reports = races.take();
    REQUIRE(reports.size() == 1);
    INFO(reports[0]);
    CHECK(contains(reports[0], "written by fill_kernel"));
    CHECK(contains(reports[0], "read by copy_kernel"));
    CUDA_CHECK(cudaDeviceSynchronize());  // a clean slate: a race's operations are remembered too

    Event read_done;
    copy(b.ptr, a.ptr, reader);
    CUDA_CHECK(cudaEventRecord(read_done, reader));
    CUDA_CHECK(cudaStreamWaitEvent(writer, read_done, 0));
    fill(a.ptr, 3.0f, writer);
    CHECK(races.take().empty());
}

TEST_CASE("racecheck: pointers inside a struct argument count as read and written") {
    CollectRaces races;
    Stream s1(cudaStreamNonBlocking), s2(cudaStreamNonBlocking);
    DeviceBuffer<float> a(kN), b(kN);
    fill(a.ptr, 1.0f, s1);
    launch<copy_struct_kernel>(dim3(1), dim3(kN), 0, s2, Buffers{b.ptr, a.ptr, kN});
    std::vector<std::string> reports = races.take();
    REQUIRE(reports.size() == 1);
    CHECK(contains(reports[0], "copy_struct_kernel"));
}

TEST_CASE("racecheck: labeled ranges of one allocation used by two streams at once are told apart") {
    CollectRaces races;
    Stream s1(cudaStreamNonBlocking), s2(cudaStreamNonBlocking);
    DeviceBuffer<float> halves(2 * kN), out(kN);
    // Unlabeled, a kernel's pointer reaches to the end of the allocation: the second half too.
    fill(halves.ptr + kN, 1.0f, s2);
    fill(halves.ptr, 1.0f, s1);
    CHECK(races.take().size() == 1);
    CUDA_CHECK(cudaDeviceSynchronize());

    label_device_memory(halves.ptr, kN * sizeof(float), "first half");
    label_device_memory(halves.ptr + kN, kN * sizeof(float), "second half");
    fill(halves.ptr + kN, 2.0f, s2);
    fill(halves.ptr, 2.0f, s1);
    CHECK(races.take().empty());
    copy(out.ptr, halves.ptr + kN, s1);  // but the second half is still s2's
    std::vector<std::string> reports = races.take();
    REQUIRE(reports.size() == 1);
    CHECK(contains(reports[0], "inside \"second half\""));
}

TEST_CASE("racecheck: NCCL on a communication stream without an event races with the compute stream") {
    mpi_init_once();
    CollectRaces races;
    ncclUniqueId id;
    NCCL_CHECK(ncclGetUniqueId(&id));
    ncclComm_t comm;
    NCCL_CHECK(ncclCommInitRank(&comm, 1, id, 0));
    Stream compute(cudaStreamNonBlocking), communication(cudaStreamDefault);
    DeviceBuffer<float> grads(kN);

    fill(grads.ptr, 1.0f, compute);
    NCCL_CHECK(ncclAllReduce(grads.ptr, grads.ptr, kN, ncclFloat32, ncclSum, comm, communication));
    std::vector<std::string> reports = races.take();
    REQUIRE(reports.size() == 1);
    INFO(reports[0]);
    CHECK(contains(reports[0], "by ncclAllReduce"));
    CHECK(contains(reports[0], "written by fill_kernel"));
    CHECK(contains(reports[0], "(blocking)"));
    CUDA_CHECK(cudaDeviceSynchronize());  // a clean slate: a race's operations are remembered too

    // The program's pattern: the communication stream waits for the compute stream's event, and
    // the compute stream for the communication stream's before it reuses the buffer.
    Event compute_done, comm_done;
    fill(grads.ptr, 2.0f, compute);
    CUDA_CHECK(cudaEventRecord(compute_done, compute));
    CUDA_CHECK(cudaStreamWaitEvent(communication, compute_done, 0));
    NCCL_CHECK(ncclAllReduce(grads.ptr, grads.ptr, kN, ncclFloat32, ncclSum, comm, communication));
    CUDA_CHECK(cudaEventRecord(comm_done, communication));
    CUDA_CHECK(cudaStreamWaitEvent(compute, comm_done, 0));
    fill(grads.ptr, 3.0f, compute);
    CHECK(races.take().empty());

    // Without the second wait, the compute stream overwrites what the all-reduce may still write.
    CUDA_CHECK(cudaEventRecord(compute_done, compute));
    CUDA_CHECK(cudaStreamWaitEvent(communication, compute_done, 0));
    NCCL_CHECK(ncclAllReduce(grads.ptr, grads.ptr, kN, ncclFloat32, ncclSum, comm, communication));
    fill(grads.ptr, 4.0f, compute);
    reports = races.take();
    REQUIRE(reports.size() == 1);
    CHECK(contains(reports[0], "written by ncclAllReduce"));
    NCCL_CHECK(ncclCommDestroy(comm));
}

TEST_CASE("racecheck: cuBLASLt matmuls write D and the GELU aux, and read their operands") {
    CollectRaces races;
    Stream s1(cudaStreamNonBlocking), s2(cudaStreamNonBlocking);
    const int N = 16, C = 64, OC = 128;
    DeviceBuffer<floatX> inp(size_t(N) * C), weight(size_t(OC) * C), bias(OC), out(size_t(N) * OC),
        pre_gelu(size_t(N) * OC), copy_out(size_t(N) * OC);
    DeviceBuffer<char> workspace(kMatmulWorkspaceBytes);
    Matmul mm = matmul_create(workspace.ptr);
    inp.fill_bytes(0);
    weight.fill_bytes(0);
    bias.fill_bytes(0);
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(races.take().empty());

    matmul_forward(mm, out.ptr, inp.ptr, weight.ptr, bias.ptr, N, C, OC, s1, pre_gelu.ptr);
    // The GELU input (aux) read on another stream with no event: a race on pre_gelu.
    CUDA_CHECK(cudaMemcpyAsync(copy_out.ptr, pre_gelu.ptr, pre_gelu.count * sizeof(floatX), cudaMemcpyDeviceToDevice, s2));
    std::vector<std::string> reports = races.take();
    REQUIRE(reports.size() == 1);
    INFO(reports[0]);
    CHECK(contains(reports[0], "written by cublasLtMatmul"));
    CHECK(contains(reports[0], "read by cudaMemcpyAsync (device to device)"));

    // An operand read by a matmul, then overwritten on another stream: a write after read.
    CUDA_CHECK(cudaStreamSynchronize(s1));
    matmul_forward(mm, out.ptr, inp.ptr, weight.ptr, bias.ptr, N, C, OC, s1);
    CUDA_CHECK(cudaMemsetAsync(weight.ptr, 0, weight.count * sizeof(floatX), s2));
    reports = races.take();
    REQUIRE(reports.size() == 1);
    CHECK(contains(reports[0], "read by cublasLtMatmul"));
    CUDA_CHECK(cudaDeviceSynchronize());
    matmul_destroy(mm);
}

TEST_CASE("racecheck: record-only mode tracks nothing") {
    CollectRaces races;
    Stream s1(cudaStreamNonBlocking);
    cuemu::set_record_only(true);
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, 1024));
    CUDA_CHECK(cudaMemsetAsync(p, 0, 1024, s1));
    CUDA_CHECK(cudaMemset(p, 0, 1024));
    cuemu::set_record_only(false);
    CHECK(races.take().empty());
    CUDA_CHECK(cudaFree(p));
}

TEST_CASE("racecheck: in abort mode a race ends the process with status 1 and the report on stderr") {
    // In a child process (no kernel launches there: the executor's worker threads are not forked).
    int pipe_fds[2];
    REQUIRE(pipe(pipe_fds) == 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        dup2(pipe_fds[1], STDERR_FILENO);
        cuemu::set_racecheck(cuemu::Racecheck::abort);
        cudaStream_t s;
        float* a;
        std::vector<float> host(kN);
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        cudaMalloc(&a, kN * sizeof(float));
        cudaMemsetAsync(a, 0, kN * sizeof(float), s);
        cudaMemcpy(host.data(), a, kN * sizeof(float), cudaMemcpyDeviceToHost);
        std::_Exit(0);  // not reached when the race is caught
    }
    close(pipe_fds[1]);
    std::string err;
    char buffer[4096];
    for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof buffer)) > 0;) err.append(buffer, size_t(n));
    close(pipe_fds[0]);
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    INFO(err);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 1);
    CHECK(contains(err, "cuemu racecheck: data race on device memory"));
    CHECK(contains(err, "written by cudaMemsetAsync"));
}

TEST_CASE("racecheck: sampling from the model's logits with a plain cudaMemcpy races; next_token_logits does not") {
    CollectRaces races;
    GPT2 model;
    CUDA_CHECK(cudaStreamCreateWithFlags(&model.stream, cudaStreamNonBlocking));  // as trainer_build does
    const GPT2Config config{64, 256, 256, 1, 4, 64};
    const int T = 8;
    gpt2_build(model, config, 1, T);
    gpt2_init_weights(model, 7);
    CHECK(races.take().empty());

    // The bug as it was: the forward pass without targets returns with the logits matmul queued on
    // the model's stream, and the legacy stream's copy does not wait for it.
    std::vector<int> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
    gpt2_forward(model, tokens.data(), nullptr, 1, T, 0.0f);
    std::vector<floatX> row(config.padded_vocab_size);
    CUDA_CHECK(cudaMemcpy(row.data(), model.acts.logits + size_t(T - 1) * config.padded_vocab_size,
                          row.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
    std::vector<std::string> reports = races.take();
    REQUIRE(reports.size() == 1);
    INFO(reports[0]);
    CHECK(contains(reports[0], "(\"logits\")"));
    CHECK(contains(reports[0], "read by cudaMemcpy (device to host)"));
    CHECK(contains(reports[0], "written by cublasLtMatmul"));

    // The fixed path: the copy on the model's stream, then a wait.
    CUDA_CHECK(cudaStreamSynchronize(model.stream));
    Rng rng(11);
    EvaluatedModel sampler;
    sampler.next_token_logits = [&](const int* t, int n) { return next_token_logits(model, t, n); };
    sampler.max_tokens = T;
    const std::vector<int> sampled = sample_tokens(sampler, 0, T - 1, SamplingSettings{}, rng);
    CHECK(sampled.size() == size_t(T - 1));
    CHECK(races.take().empty());

    gpt2_free(model);
    CUDA_CHECK(cudaStreamDestroy(model.stream));
}
