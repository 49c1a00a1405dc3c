// The memory plan against the seeds' accounting (DESIGN.md, "Memory"): the GPT-2 parameter count,
// 16 bytes per parameter of mixed-precision Adam state and what ZeRO divides, and the activations of
// recompute none item by item against Korthikanti et al. 2022 ("Reducing Activation Recomputation in
// Large Transformer Models", sec. 4.1): L * (34*s*b*h + 5*a*s^2*b) bytes. The emulator's peak memory
// during real steps is compared with the plan in test_mpi_train.cu.
// built into: test_model_suite
#define TRAIN_GPT_NO_MAIN
#include "../train_gpt.cu"

#include <catch2/catch.hpp>

#include "model_test_util.h"

namespace {

GPT2Config preset(const char* name) {
    GPT2Config c{};
    REQUIRE(gpt2_preset(name, &c));
    return c;
}

MemoryPlan plan_of(const GPT2Config& c, int B, int T, int world, int zero, Recompute r) {
    return gpt2_memory_plan(c, B, T, shard_layout(gpt2_num_parameters(c), 0, world, zero), ModelOptions{r});
}

}  // namespace

TEST_CASE("parameter count: N = V*C + maxT*C + L*(12C^2 + 13C) + 2C, V padded to a multiple of 128") {
    const GPT2Config odd{40, 301, pad_vocab(301), 3, 3, 96};
    for (const GPT2Config& c : {preset("d12"), preset("d24"), preset("d36"), preset("d48"), odd}) {
        const size_t V = c.padded_vocab_size, C = c.channels, L = c.num_layers, maxT = c.max_seq_len;
        CHECK(gpt2_num_parameters(c) == V * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C);
    }
    // The published sizes (with the padded vocabulary 50304): 124M and 1.5B.
    CHECK(gpt2_num_parameters(preset("d12")) == 124475904);
    CHECK(gpt2_num_parameters(preset("d48")) == 1557686400);
}

TEST_CASE("Adam state: 16 bytes per parameter in BF16 before sharding; ZeRO-1/2 divide the right parts") {
    const GPT2Config c = preset("d12");
    const size_t N = gpt2_num_parameters(c), X = sizeof(floatX);
    const MemoryPlan single = plan_of(c, 4, 64, 1, 0, Recompute::none);
    const size_t state = single.group_bytes("params") + single.group_bytes("grads") + single.group_bytes("master") +
                         single.group_bytes("adam_m") + single.group_bytes("adam_v");
    // BF16: params 2 + grads 2 + FP32 master 4 + moments 4 + 4. (The FP32 build: 4 + 4 + 4 + 8 = 20.)
    CHECK(state == N * (kFP32 ? 20 : 16));
    if (!kFP32) CHECK(state == 16 * N);

    const int W = 8;
    const ShardLayout sh = shard_layout(N, 0, W, 1);
    const size_t shard = sh.shard_size;
    CHECK(shard * W >= N);
    CHECK(shard * W - N < 8 * W);  // padding only to a multiple of 8 per shard
    for (int zero : {0, 1, 2}) {
        INFO("ZeRO-" << zero);
        const MemoryPlan p = plan_of(c, 4, 64, W, zero, Recompute::none);
        // Parameters are whole on every rank (the forward pass reads them all).
        CHECK(p.group_bytes("params") == sh.padded_size * X);
        // Master weights and moments: whole at stage 0, one shard from stage 1.
        const size_t optimizer = zero == 0 ? N : shard;
        CHECK(p.group_bytes("master") == optimizer * 4);
        CHECK(p.group_bytes("adam_m") == optimizer * 4);
        CHECK(p.group_bytes("adam_v") == optimizer * 4);
        // Gradients: whole up to stage 1, one shard at stage 2 (plus two layers' and the global
        // tensors' buffers to produce them, and one shard to receive reductions into).
        CHECK(p.group_bytes("grads") == (zero == 2 ? shard : sh.padded_size) * X);
        if (zero == 2) {
            const size_t C = c.channels, global = size_t(c.padded_vocab_size) * C + size_t(c.max_seq_len) * C + 2 * C;
            const size_t layer = 12 * C * C + 13 * C;
            CHECK(p.group_bytes("communication") == (2 * layer + global + shard) * X);
        } else {
            CHECK(p.group_bytes("communication") == 0);
        }
    }
}

TEST_CASE("activations of recompute none against L*(34sbh + 5as^2b), item by item") {
    // s = T, b = B, h = C, a = NH; bytes, 16-bit activations as in the paper (our BF16 build).
    for (const char* name : {"d12", "d48"}) {
        const GPT2Config c = preset(name);
        const size_t s = 1024, b = 16, h = c.channels, a = c.num_heads, L = c.num_layers, X = sizeof(floatX);
        const MemoryPlan p = plan_of(c, int(b), int(s), 8, 1, Recompute::none);
        const size_t sbh = s * b * h;
        // Per layer, the paper's 34sbh: QKV input (the LayerNorm output) 2, Q K V 6 [the paper: Q, K 4 for
        // the scores + V 2], attention output before the projection 2, the two dropout masks 1 + 1, MLP
        // input (LayerNorm output) 2, fc output 8, GELU output 8, the two LayerNorms' inputs 2 + 2.
        // Ours, in the same order (X = 2 bytes in BF16):
        CHECK(p.bytes_of("ln1") == L * sbh * X);            // QKV input: 2sbh
        CHECK(p.bytes_of("qkv") == L * 3 * sbh * X);        // Q, K, V: 6sbh
        CHECK(p.bytes_of("atty") == L * sbh * X);           // attention output: 2sbh
        CHECK(p.bytes_of("ln2") == L * sbh * X);            // MLP input: 2sbh
        CHECK(p.bytes_of("fch") == L * 4 * sbh * X);        // fc output: 8sbh
        CHECK(p.bytes_of("fch_gelu") == L * 4 * sbh * X);   // GELU output: 8sbh
        // The LayerNorms' inputs: residual2, and the block input = the previous block's residual3
        // (the last one's feeds lnf; `encoded` is block 0's input).
        CHECK(p.bytes_of("residual2") == L * sbh * X);      // 2sbh
        CHECK(p.bytes_of("residual3") == L * sbh * X);      // 2sbh
        // No dropout (GPT-2 pretraining at dropout 0): the paper's 2 x sbh of masks do not exist, so
        // the 34sbh becomes 32sbh. The 5as^2b (softmax output 2, its dropout mask 1, dropout output 2)
        // vanish with flash attention, which keeps one float logsumexp per query row instead: 4asb.
        // The paper leaves out the LayerNorm statistics: a float mean and rstd per row, 2 x 8sb.
        CHECK(p.bytes_of("att_lse") == L * 4 * a * s * b);
        CHECK(p.bytes_of("ln1_mean") + p.bytes_of("ln1_rstd") + p.bytes_of("ln2_mean") + p.bytes_of("ln2_rstd") ==
              L * 16 * s * b);
        const size_t per_layer_items = L * (32 * sbh * X / 2 + 4 * a * s * b + 16 * s * b);
        // Outside the layers: the embedding output, lnf and its statistics, per-token losses, the
        // logits (B*T*Vp, reused for dlogits), the projection output buffer `branch`.
        const size_t outside = p.bytes_of("encoded") + p.bytes_of("lnf") + p.bytes_of("lnf_mean") +
                               p.bytes_of("lnf_rstd") + p.bytes_of("losses") + p.bytes_of("logits") + p.bytes_of("branch");
        CHECK(outside == s * b * (2 * h * X + 4 + 4 + 4 + size_t(c.padded_vocab_size) * X + h * X));
        CHECK(p.group_bytes("activations") == per_layer_items + outside);
        if (!kFP32) {
            const double paper = double(L) * (34.0 * sbh + 5.0 * a * s * s * b);
            const double ours_layers = double(per_layer_items);
            std::printf("%s B=16 T=1024 [%s]: paper L*(34sbh+5as^2b) = %.2f GiB; ours per layer items %.2f GiB "
                        "(32sbh + 4asb + 16sb), outside the layers %.2f GiB\n",
                        name, kPrecisionName, paper / double(1 << 30), ours_layers / double(1 << 30),
                        double(outside) / double(1 << 30));
            CHECK(ours_layers < paper);
        }
    }
}

TEST_CASE("recompute selective and full keep what they say") {
    const GPT2Config c = preset("d12");
    const size_t s = 256, b = 4, h = c.channels, L = c.num_layers, X = sizeof(floatX), a = c.num_heads;
    const size_t sbh = s * b * h;
    const MemoryPlan none = plan_of(c, int(b), int(s), 1, 0, Recompute::none);
    const MemoryPlan selective = plan_of(c, int(b), int(s), 1, 0, Recompute::selective);
    const MemoryPlan full = plan_of(c, int(b), int(s), 1, 0, Recompute::full);
    // Selective: ln1 + ln2 (one shared layer buffer) and fch, fch_gelu (one layer's) instead of L layers'.
    CHECK(selective.bytes_of("ln1") == sbh * X);  // ln2 lives in its buffer: no item of its own
    CHECK_THROWS(selective.bytes_of("ln2"));
    CHECK(selective.bytes_of("fch") == 4 * sbh * X);
    CHECK(selective.bytes_of("fch_gelu") == 4 * sbh * X);
    CHECK(none.group_bytes("activations") - selective.group_bytes("activations") == (L - 1) * 10 * sbh * X + sbh * X);
    // Full: residual3 for every layer; all other per-layer tensors for one layer.
    CHECK(full.bytes_of("residual3") == L * sbh * X);
    for (const char* item : {"qkv", "atty", "residual2"})
        CHECK(full.bytes_of(item) * L == none.bytes_of(item));
    CHECK(full.bytes_of("att_lse") == 4 * a * s * b);
    const size_t per_layer_none = 16 * sbh * X + 4 * a * s * b + 16 * s * b;
    const size_t per_layer_full = sbh * X;  // residual3
    const size_t one_layer_buffers = 15 * sbh * X - sbh * X + 4 * a * s * b + 16 * s * b;  // ln1 and ln2 share
    CHECK(full.group_bytes("activations") ==
          none.group_bytes("activations") - L * per_layer_none + L * per_layer_full + one_layer_buffers);
    // Nothing else changes.
    for (const char* group : {"params", "grads", "master", "adam_m", "adam_v", "workspace", "communication"}) {
        CHECK(selective.group_bytes(group) == none.group_bytes(group));
        CHECK(full.group_bytes(group) == none.group_bytes(group));
    }
}

// The largest micro-batch whose plan fits in `bytes` (0 if none), as --dry-run asks it.
int largest_batch(const GPT2Config& c, int T, const ShardLayout& sh, const ModelOptions& options, size_t bytes) {
    return largest_fitting_batch([&](int B) { return gpt2_memory_plan(c, B, T, sh, options).total(); }, bytes);
}

TEST_CASE("largest micro-batch per recompute mode: the largest B whose plan fits") {
    const GPT2Config c = preset("d48");
    const ShardLayout sh = shard_layout(gpt2_num_parameters(c), 0, 8, 1);
    const size_t budget = size_t(80) << 30;
    int previous = 0;
    for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
        const int best = largest_batch(c, 1024, sh, ModelOptions{r}, budget);
        INFO("recompute " << recompute_name(r) << ": B = " << best);
        REQUIRE(best >= 1);
        CHECK(gpt2_memory_plan(c, best, 1024, sh, ModelOptions{r}).total() <= budget);
        CHECK(gpt2_memory_plan(c, best + 1, 1024, sh, ModelOptions{r}).total() > budget);
        CHECK(best > previous);  // each mode keeps less, so fits more
        previous = best;
    }
    CHECK(largest_batch(c, 1024, sh, ModelOptions{Recompute::full}, 1 << 20) == 0);  // not even the parameters fit
}
