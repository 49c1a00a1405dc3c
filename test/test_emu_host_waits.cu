// Where the host waits for the device (cuemu::host_waits, emu/cuda_emu.h): the emulator runs every
// stream synchronously, so a stall that would idle a GPU cannot show in timings here; the count of
// calls that make a real host wait can. A training step uploads each micro-batch and the encoder
// backward's grouping from page-locked memory and reads its micro-steps' losses once, after the last
// backward pass is queued, so its waits must not grow with the number of micro-steps.
// (No GPU build: the counter is the emulator's.)
// built into: test_emu_suite
#define TRAIN_GPT_NO_MAIN
#include "../train_gpt.cu"

#include "mpi_test_util.h"
#include "test_util.h"

TEST_CASE("host waits: synchronizations and copies into pageable memory count, copies into pinned memory do not") {
    DeviceBuffer<float> device(256);
    std::vector<float> pageable(256);
    float* pinned = nullptr;
    CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned), 256 * sizeof(float)));
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const uint64_t start = cuemu::host_waits();
    CUDA_CHECK(cudaMemcpyAsync(pinned + 10, device.ptr, 100 * sizeof(float), cudaMemcpyDeviceToHost, stream));  // inside the block
    CUDA_CHECK(cudaMemcpyAsync(device.ptr, pinned, 256 * sizeof(float), cudaMemcpyHostToDevice, stream));
    CHECK(cuemu::host_waits() == start);
    CUDA_CHECK(cudaMemcpyAsync(pageable.data(), device.ptr, 256 * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK(cuemu::host_waits() == start + 1);
    CUDA_CHECK(cudaMemcpyAsync(device.ptr, pageable.data(), 256 * sizeof(float), cudaMemcpyHostToDevice, stream));  // staged
    CHECK(cuemu::host_waits() == start + 2);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(pageable.data(), device.ptr, 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(cuemu::host_waits() == start + 5);
    CUDA_CHECK(cudaFreeHost(pinned));
    // Freed: the same address, now pageable (or reused by malloc), no longer counts as pinned.
    std::vector<float> after(256);
    CUDA_CHECK(cudaMemcpyAsync(after.data(), device.ptr, 256 * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK(cuemu::host_waits() == start + 6);
    CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST_CASE("host waits: a training step waits as often with 4 micro-steps as with 1, and its loss is the mean of all") {
    const GPT2Config config{64, 512, 512, 2, 4, 64};
    const int B = 2, T = 32;
    // Documents (token 5 ends one here): their starts are uploaded too, and the grouping is by
    // restarted position as well.
    const ModelOptions documents{.doc_mask = true, .doc_positions = true, .eot_token = 5};
    // With CUDA graphs the second step (4 micro-steps) is captured and replayed: no wait more.
    const std::pair<int, ModelOptions> setups[] = {{0, ModelOptions{}}, {2, ModelOptions{}}, {1, documents},
                                                   {1, ModelOptions{.cuda_graphs = true}}};
    for (const auto& [zero_stage, options] : setups) {
        INFO("ZeRO-" << zero_stage << (options.doc_mask ? ", documents" : "") << (options.cuda_graphs ? ", CUDA graphs" : ""));
        Distributed dist = lone_rank();
        Trainer tr;
        trainer_build(tr, dist, config, B, T, zero_stage, OptimizerConfig{}, options);
        gpt2_init_weights(tr.model, 7);
        trainer_start(tr);
        std::vector<std::vector<int>> tokens(4, std::vector<int>(size_t(B) * T));
        for (int m = 0; m < 4; ++m)
            for (size_t i = 0; i < tokens[m].size(); ++i) tokens[m][i] = int((i * 37 + size_t(m) * 11) % 200);
        std::vector<uint64_t> waits;
        std::vector<double> losses;
        for (int micro_steps : {1, 4}) {
            std::vector<const int*> inputs;
            for (int m = 0; m < micro_steps; ++m) inputs.push_back(tokens[m].data());
            // The step's loss from forward passes alone, before the step changes the parameters.
            double sum = 0;
            for (const int* in : inputs) sum += gpt2_forward(tr.model, in, in, B, T, 0.0f);
            const double want = sum / double(micro_steps * B * T);
            const uint64_t before = cuemu::host_waits();
            const StepResult r = train_step(tr, inputs, inputs, B, T, 1e-3f);
            waits.push_back(cuemu::host_waits() - before);
            REQUIRE(r.updated);
            CHECK(r.loss == want);  // the same per-micro-step sums, added in the same order
            losses.push_back(r.loss);
        }
        CHECK(waits[0] > 0);
        CHECK(waits[1] == waits[0]);
        CHECK(losses[0] != losses[1]);  // the step saw other tokens: the comparison above is not vacuous
        if (options.cuda_graphs) CHECK(tr.micro_step_graph_nodes[0] > 0);  // the 4-micro-step step was replayed
        trainer_free(tr);
        distributed_release(dist);
    }
}
