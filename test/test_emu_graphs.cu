// Stream capture and CUDA graphs in the emulator (emu/graph.cpp), and the training step replayed from
// them (train_gpt.cu, run_micro_step). The emulator must do what a GPU does with a capture: run
// nothing until the graph is launched, replay the captured arguments every launch, and refuse what
// CUDA refuses (a host wait on a capturing stream, an unjoined fork, a wait on an outside event), so
// that a step that captures here captures on the GPU. (No GPU build: these are the emulator's rules.)
// built into: test_emu_suite
#define TRAIN_GPT_NO_MAIN
#include "../train_gpt.cu"

#include "mpi_test_util.h"
#include "test_util.h"

namespace {

static __global__ void add_kernel(float* x, float value, int n) {
    const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) x[i] += value;
}

static __global__ void scale_kernel(float* x, float factor, int n) {
    const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) x[i] *= factor;
}

struct Streams {
    cudaStream_t main = nullptr, side = nullptr;
    cudaEvent_t fork = nullptr, join = nullptr;
    Streams() {
        CUDA_CHECK(cudaStreamCreateWithFlags(&main, cudaStreamNonBlocking));
        CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    }
    ~Streams() {
        cudaEventDestroy(fork);
        cudaEventDestroy(join);
        cudaStreamDestroy(side);
        cudaStreamDestroy(main);
    }
};

// Ends a capture that a test expects to have failed, and clears the recorded error.
cudaError_t end_failed_capture(cudaStream_t stream) {
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream, &graph);
    CHECK(graph == nullptr);
    (void)cudaGetLastError();
    return e;
}

}  // namespace

TEST_CASE("graphs: a capture runs nothing; each launch replays the captured work with the captured arguments") {
    constexpr int n = 300;
    DeviceBuffer<float> x(n), y(n);
    x.upload(std::vector<float>(n, 1.0f));
    y.upload(std::vector<float>(n, 5.0f));
    CUDA_CHECK(cudaDeviceSynchronize());  // the uploads ran on the legacy stream
    Streams s;
    float step = 2.0f;
    CUDA_CHECK(cudaStreamBeginCapture(s.main, cudaStreamCaptureModeThreadLocal));
    cudaStreamCaptureStatus status;
    CUDA_CHECK(cudaStreamIsCapturing(s.main, &status));
    CHECK(status == cudaStreamCaptureStatusActive);
    launch<add_kernel>(dim3(3), dim3(128), 0, s.main, x.ptr, step, n);
    // A fork: the side stream joins the capture by waiting on an event recorded in it, then rejoins.
    CUDA_CHECK(cudaEventRecord(s.fork, s.main));
    CUDA_CHECK(cudaStreamWaitEvent(s.side, s.fork, 0));
    launch<scale_kernel>(dim3(3), dim3(128), 0, s.side, y.ptr, 3.0f, n);
    CUDA_CHECK(cudaMemcpyAsync(y.ptr, x.ptr, 4 * sizeof(float), cudaMemcpyDeviceToDevice, s.side));
    CUDA_CHECK(cudaEventRecord(s.join, s.side));
    CUDA_CHECK(cudaStreamWaitEvent(s.main, s.join, 0));
    CUDA_CHECK(cudaMemsetAsync(x.ptr + n - 2, 0, 2 * sizeof(float), s.main));
    step = 100.0f;  // after the capture: the graph keeps 2
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(s.main, &graph));
    REQUIRE(graph != nullptr);
    CUDA_CHECK(cudaStreamIsCapturing(s.side, &status));
    CHECK(status == cudaStreamCaptureStatusNone);  // the forked stream left the capture with it
    size_t nodes = 0;
    CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    CHECK(nodes == 8);  // 2 kernels, a copy, a memset, 2 records, 2 waits
    // Nothing ran.
    CHECK(x.download() == std::vector<float>(n, 1.0f));
    CHECK(y.download() == std::vector<float>(n, 5.0f));

    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    for (int launch_number = 1; launch_number <= 2; ++launch_number) {
        INFO("launch " << launch_number);
        CUDA_CHECK(cudaGraphLaunch(exec, s.main));
        CUDA_CHECK(cudaStreamSynchronize(s.main));
        const std::vector<float> xs = x.download(), ys = y.download();
        const float x_now = 1.0f + 2.0f * launch_number;                // x += 2 per launch
        const float y_now = 5.0f * (launch_number == 1 ? 3.0f : 9.0f);  // y *= 3 per launch
        for (int i = 0; i < n; ++i) {
            CHECK(xs[i] == (i >= n - 2 ? 0.0f : x_now));
            CHECK(ys[i] == (i < 4 ? x_now : y_now));  // the copy of x's head follows the scale
        }
        x.upload(std::vector<float>(n, x_now));  // the memset's zeros back to x_now, so each launch adds 2 to it
        CUDA_CHECK(cudaDeviceSynchronize());
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
}

TEST_CASE("graphs: a host wait on a capturing stream or a captured event invalidates the capture, as on a GPU") {
    DeviceBuffer<float> x(64);
    Streams s;
    SECTION("cudaStreamSynchronize") {
        CUDA_CHECK(cudaStreamBeginCapture(s.main, cudaStreamCaptureModeThreadLocal));
        launch<add_kernel>(dim3(1), dim3(64), 0, s.main, x.ptr, 1.0f, 64);
        CHECK(cudaStreamSynchronize(s.main) == cudaErrorStreamCaptureUnsupported);
        cudaStreamCaptureStatus status;
        CUDA_CHECK(cudaStreamIsCapturing(s.main, &status));
        CHECK(status == cudaStreamCaptureStatusInvalidated);
        CHECK(cudaMemsetAsync(x.ptr, 0, 4, s.main) == cudaErrorStreamCaptureInvalidated);
        CHECK(end_failed_capture(s.main) == cudaErrorStreamCaptureInvalidated);
    }
    SECTION("cudaEventSynchronize and cudaEventQuery on an event recorded in the capture") {
        CUDA_CHECK(cudaStreamBeginCapture(s.main, cudaStreamCaptureModeThreadLocal));
        CUDA_CHECK(cudaEventRecord(s.fork, s.main));
        CHECK(cudaEventSynchronize(s.fork) == cudaErrorStreamCaptureUnsupported);
        CHECK(cudaEventQuery(s.fork) == cudaErrorStreamCaptureUnsupported);
        CHECK(end_failed_capture(s.main) == cudaErrorStreamCaptureInvalidated);
        CUDA_CHECK(cudaEventQuery(s.fork));  // the capture is over: an ordinary event again
    }
    SECTION("cudaMalloc and a synchronous copy while capturing in the thread-local mode") {
        CUDA_CHECK(cudaStreamBeginCapture(s.main, cudaStreamCaptureModeThreadLocal));
        void* p = nullptr;
        CHECK(cudaMalloc(&p, 16) == cudaErrorStreamCaptureUnsupported);
        CHECK(p == nullptr);
        CHECK(end_failed_capture(s.main) == cudaErrorStreamCaptureInvalidated);
        CUDA_CHECK(cudaStreamBeginCapture(s.main, cudaStreamCaptureModeThreadLocal));
        float host = 0;
        CHECK(cudaMemcpy(&host, x.ptr, 4, cudaMemcpyDeviceToHost) != cudaSuccess);
        CHECK(end_failed_capture(s.main) == cudaErrorStreamCaptureInvalidated);
    }
    SECTION("the relaxed mode permits cudaMalloc") {
        CUDA_CHECK(cudaStreamBeginCapture(s.main, cudaStreamCaptureModeRelaxed));
        void* p = nullptr;
        CUDA_CHECK(cudaMalloc(&p, 16));
        CUDA_CHECK(cudaFree(p));
        cudaGraph_t graph = nullptr;
        CUDA_CHECK(cudaStreamEndCapture(s.main, &graph));
        CHECK(graph != nullptr);
        CUDA_CHECK(cudaGraphDestroy(graph));
    }
}

TEST_CASE("graphs: an unjoined fork, a wait on an outside event and a capture ended elsewhere are CUDA's errors") {
    DeviceBuffer<float> x(64);
    Streams s;
    SECTION("a forked stream with work the origin never waited for") {
        CUDA_CHECK(cudaStreamBeginCapture(s.main, cudaStreamCaptureModeThreadLocal));
        CUDA_CHECK(cudaEventRecord(s.fork, s.main));
        CUDA_CHECK(cudaStreamWaitEvent(s.side, s.fork, 0));
        CUDA_CHECK(cudaEventRecord(s.join, s.side));
        CUDA_CHECK(cudaStreamWaitEvent(s.main, s.join, 0));
        launch<add_kernel>(dim3(1), dim3(64), 0, s.side, x.ptr, 1.0f, 64);  // after the join
        CHECK(end_failed_capture(s.main) == cudaErrorStreamCaptureUnjoined);
        cudaStreamCaptureStatus status;
        CUDA_CHECK(cudaStreamIsCapturing(s.side, &status));
        CHECK(status == cudaStreamCaptureStatusNone);
    }
    SECTION("waiting on an event recorded before the capture") {
        CUDA_CHECK(cudaEventRecord(s.fork, s.side));
        CUDA_CHECK(cudaStreamBeginCapture(s.main, cudaStreamCaptureModeThreadLocal));
        CHECK(cudaStreamWaitEvent(s.main, s.fork, 0) == cudaErrorStreamCaptureIsolation);
        CHECK(end_failed_capture(s.main) == cudaErrorStreamCaptureInvalidated);
    }
    SECTION("ending the capture on the forked stream") {
        CUDA_CHECK(cudaStreamBeginCapture(s.main, cudaStreamCaptureModeThreadLocal));
        CUDA_CHECK(cudaEventRecord(s.fork, s.main));
        CUDA_CHECK(cudaStreamWaitEvent(s.side, s.fork, 0));
        cudaGraph_t graph = nullptr;
        CHECK(cudaStreamEndCapture(s.side, &graph) == cudaErrorStreamCaptureUnmatched);
        (void)cudaGetLastError();
        CUDA_CHECK(cudaEventRecord(s.join, s.side));
        CUDA_CHECK(cudaStreamWaitEvent(s.main, s.join, 0));
        CUDA_CHECK(cudaStreamEndCapture(s.main, &graph));
        CUDA_CHECK(cudaGraphDestroy(graph));
    }
    SECTION("the legacy stream cannot be captured") {
        CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeThreadLocal) == cudaErrorStreamCaptureUnsupported);
        (void)cudaGetLastError();
    }
}

TEST_CASE("graphs: training steps replayed from CUDA graphs equal eager ones bitwise") {
    const GPT2Config config{64, 512, 512, 2, 4, 64};
    const int B = 2, T = 32, steps = 3, micro_steps = 3;
    const ModelOptions documents{.doc_mask = true, .doc_positions = true, .eot_token = 5};
    struct Setup {
        int zero_stage;
        ModelOptions options;
    };
    const Setup setups[] = {{0, ModelOptions{}}, {1, ModelOptions{.recompute = Recompute::full}}, {2, documents}};
    for (const Setup& setup : setups) {
        INFO("ZeRO-" << setup.zero_stage << (setup.options.doc_mask ? ", documents" : "")
                     << (setup.options.recompute == Recompute::full ? ", full recompute" : ""));
        std::vector<std::vector<int>> tokens(size_t(steps) * micro_steps, std::vector<int>(size_t(B) * T));
        for (size_t m = 0; m < tokens.size(); ++m)
            for (size_t i = 0; i < tokens[m].size(); ++i) tokens[m][i] = int((i * 37 + m * 11 + i * i % 7) % 200);
        struct Run {
            std::vector<floatX> params;
            std::vector<float> master, adam_m, adam_v;
            std::vector<double> losses;
            size_t graph_nodes[2];
        };
        auto train = [&](bool graphs) {
            Distributed dist = lone_rank();
            Trainer tr;
            ModelOptions options = setup.options;
            options.cuda_graphs = graphs;
            trainer_build(tr, dist, config, B, T, setup.zero_stage, OptimizerConfig{}, options);
            gpt2_init_weights(tr.model, 7);
            trainer_start(tr);
            Run run;
            for (int step = 0; step < steps; ++step) {
                std::vector<const int*> inputs;
                for (int m = 0; m < micro_steps; ++m) inputs.push_back(tokens[size_t(step) * micro_steps + m].data());
                const StepResult r = train_step(tr, inputs, inputs, B, T, 1e-3f);
                REQUIRE(r.updated);
                run.losses.push_back(r.loss);
            }
            CUDA_CHECK(cudaStreamSynchronize(tr.model.stream));
            const size_t n = tr.optimizer.shard.optimizer_size();
            run.params.resize(tr.model.num_parameters);
            run.master.resize(n), run.adam_m.resize(n), run.adam_v.resize(n);
            CUDA_CHECK(cudaMemcpy(run.params.data(), tr.model.params_memory, run.params.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaMemcpy(run.master.data(), tr.optimizer.master, n * sizeof(float), cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaMemcpy(run.adam_m.data(), tr.optimizer.adam_m, n * sizeof(float), cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaMemcpy(run.adam_v.data(), tr.optimizer.adam_v, n * sizeof(float), cudaMemcpyDeviceToHost));
            run.graph_nodes[0] = tr.micro_step_graph_nodes[0];
            run.graph_nodes[1] = tr.micro_step_graph_nodes[1];
            trainer_free(tr);
            distributed_release(dist);
            return run;
        };
        const Run eager = train(false), replayed = train(true);
        CHECK(eager.graph_nodes[0] + eager.graph_nodes[1] == 0);
        // Stage 2 reduces after every micro-step (one graph); stages 0-1 only after the last (two).
        CHECK(replayed.graph_nodes[1] > 50);
        CHECK((replayed.graph_nodes[0] > 50) == (setup.zero_stage != 2));
        CHECK(replayed.losses == eager.losses);
        CHECK(bitwise_equal(replayed.params, eager.params));
        CHECK(bitwise_equal(replayed.master, eager.master));
        CHECK(bitwise_equal(replayed.adam_m, eager.adam_m));
        CHECK(bitwise_equal(replayed.adam_v, eager.adam_v));
        // The steps changed the model: equal results are not two untouched copies.
        CHECK(eager.losses.front() != eager.losses.back());
        CHECK(std::isfinite(eager.losses.back()));
    }
}
