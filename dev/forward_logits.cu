// Our forward pass's logits for given tokens, from an llm.c model file: what the Hugging Face interop
// test (test/test_hf_interop.py) compares with transformers' GPT2LMHeadModel. The model is loaded and
// run by train_gpt.cu's own code (load_model_parameters, gpt2_forward), nothing re-implemented here.
//
//   build/cpu/forward_logits_fp32 MODEL.bin TOKENS.bin B LOGITS.bin
//
// TOKENS.bin: B x T int32, little-endian (T = count / B, at most the model's maxT). LOGITS.bin: B x T x V
// float32 over the real vocabulary (the padded columns dropped), whatever the build's precision. The
// _fp32 build computes in FP32; the plain one in the build's PRECISION (BF16 by default).
#define TRAIN_GPT_NO_MAIN
#include "../train_gpt.cu"

#include <fstream>

namespace {

std::vector<int> read_tokens(const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    if (!file) throw std::runtime_error("cannot open tokens file '" + path + "'");
    std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    if (bytes.empty() || bytes.size() % sizeof(int32_t) != 0)
        throw std::runtime_error("tokens file '" + path + "' is " + std::to_string(bytes.size()) +
                                 " bytes, not a non-empty array of int32");
    std::vector<int> tokens(bytes.size() / sizeof(int32_t));
    std::memcpy(tokens.data(), bytes.data(), bytes.size());
    return tokens;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: forward_logits MODEL.bin TOKENS.bin B LOGITS.bin\n");
        return EXIT_FAILURE;
    }
    try {
        const std::string model_path = argv[1], out_path = argv[4];
        const std::vector<int> tokens = read_tokens(argv[2]);
        const int B = std::atoi(argv[3]);
        if (B < 1 || tokens.size() % size_t(B) != 0)
            throw std::runtime_error("B = " + std::string(argv[3]) + " does not divide the " +
                                     std::to_string(tokens.size()) + " tokens");
        const int T = int(tokens.size() / size_t(B));
        const GPT2Config config = read_model_header(model_path);
        // The attention kernels the program would pick on this device (train_gpt's --attention auto).
        const ModelOptions options{Recompute::none, attention_of("auto", kEmulatedDevice)};
        GPT2 model;
        gpt2_build(model, config, B, T, 0, 1, 0, options);
        load_model_parameters(model, model_path);
        gpt2_forward(model, tokens.data(), nullptr, B, T, 0.0f);
        const size_t V = size_t(config.vocab_size), Vp = size_t(config.padded_vocab_size), BT = size_t(B) * T;
        std::vector<floatX> padded(BT * Vp);
        copy_and_wait(model, padded.data(), model.acts.logits, padded.size() * sizeof(floatX), cudaMemcpyDeviceToHost);
        gpt2_free(model);
        std::vector<float> logits(BT * V);
        for (size_t i = 0; i < BT; ++i)
            for (size_t v = 0; v < V; ++v) logits[i * V + v] = to_float(padded[i * Vp + v]);
        std::ofstream out(out_path, std::ios::binary);
        out.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
        if (!out.flush()) throw std::runtime_error("cannot write '" + out_path + "'");
        std::printf("forward_logits: %s, %d x %d tokens, %s attention, %s\n", kPrecisionName, B, T,
                    attention_name(options.attention), out_path.c_str());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "forward_logits: %s\n", e.what());
        return EXIT_FAILURE;
    }
    return EXIT_SUCCESS;
}
