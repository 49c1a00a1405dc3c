#!/usr/bin/env python3
"""The libraries' time for each kernel family of one GPT-2 training micro-step, beside which
`train_gpt --profile-step` puts ours (scripts/gpu_check.sh's `profile` stage runs both).

Per family, at the model's shapes, through PyTorch (on an H100: cuBLAS for the matmuls, FlashAttention-2
or cuDNN behind scaled_dot_product_attention, its fused LayerNorm, cross-entropy and AdamW kernels):

  matmul      every GEMM of the step: per layer qkv (C -> 3C), attproj (C -> C), fc (C -> 4C), fcproj
              (4C -> C), and the output head (C -> Vp); each forward, input gradient and weight gradient
  attention   causal scaled_dot_product_attention, forward + backward, per layer
  layernorm   layer_norm forward + backward, 2 per layer + the final one
  classifier  cross_entropy over the Vp logits, forward + backward
  adamw       one fused AdamW step over every parameter (FP32 master weights)

Prints one line per family and writes JSON (--json): milliseconds per micro-step (per optimizer step
for adamw), with FLOPs by the usual counts (2mnk per GEMM; attention 4 B NH T^2 hs forward halved for
the causal mask and x2.5 for the backward, FlashAttention's convention). BF16 on a GPU; FP32 on the CPU,
where it only checks that the script runs (test/test_library_baselines.sh).

  python3 dev/bench/library_baselines.py -e d12 -b 16 -t 1024 [--layers L --heads NH --channels C]
                                         [--device cuda|cpu] [--iters 20] [--json FILE]
"""
import argparse
import json
import math
import sys
import time

PRESETS = {"d12": (12, 12, 768), "d24": (24, 16, 1024), "d36": (36, 20, 1280), "d48": (48, 25, 1600),
           "tiny": (2, 4, 64), "mini": (4, 4, 128)}  # host/model_config.h: layers, heads, channels
VOCAB, PADDED_VOCAB = 50257, 50304


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-e", "--model", default="d12", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--heads", type=int, default=0)
    ap.add_argument("--channels", type=int, default=0)
    ap.add_argument("-b", "--batch-size", type=int, default=16)
    ap.add_argument("-t", "--seq-len", type=int, default=1024)
    ap.add_argument("--device", default=None, help="cuda when available, else cpu")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        sys.exit("library_baselines.py: PyTorch is not installed (pip install torch)")

    L, NH, C = PRESETS[args.model]
    L, NH, C = args.layers or L, args.heads or NH, args.channels or C
    if C % NH:
        sys.exit(f"library_baselines.py: --channels {C} is not a multiple of --heads {NH}")
    B, T, hs = args.batch_size, args.seq_len, C // NH
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(1337)
    BT = B * T

    def timed_ms(fn):
        """Median milliseconds of fn() over --iters runs after 3 warm-ups."""
        for _ in range(3):
            fn()
        times = []
        for _ in range(args.iters):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        times.sort()
        return times[len(times) // 2]

    def randn(*shape, requires_grad=False):
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=requires_grad)

    families = {}

    # matmul: forward y = x W^T, dx = dy W, dW = dy^T x for each GEMM shape of the step.
    shapes = [(C, 3 * C, L), (C, C, L), (C, 4 * C, L), (4 * C, C, L), (C, PADDED_VOCAB, 1)]
    matmul_ms, matmul_flops = 0.0, 0.0
    for c_in, c_out, count in shapes:
        x, w, dy = randn(BT, c_in), randn(c_out, c_in), randn(BT, c_out)
        ms = timed_ms(lambda: (x @ w.t(), dy @ w, dy.t() @ x))
        matmul_ms += ms * count
        matmul_flops += 6.0 * BT * c_in * c_out * count
    families["matmul"] = {"ms": matmul_ms, "flops": matmul_flops, "launches": 3 * (4 * L + 1)}

    # attention: causal SDPA forward + backward, one layer's, times L.
    q, k, v = (randn(B, NH, T, hs, requires_grad=True) for _ in range(3))
    dout = randn(B, NH, T, hs)

    def attention():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(dout)

    forward_flops = 4.0 * B * NH * T * T * hs / 2
    families["attention"] = {"ms": timed_ms(attention) * L, "flops": forward_flops * 3.5 * L, "launches": 2 * L}

    # layernorm: forward + backward over (BT, C), 2L + 1 of them.
    x = randn(BT, C, requires_grad=True)
    weight = torch.ones(C, device=device, dtype=dtype, requires_grad=True)
    bias = torch.zeros(C, device=device, dtype=dtype, requires_grad=True)
    dy = randn(BT, C)

    def layernorm():
        F.layer_norm(x, (C,), weight, bias, 1e-5).backward(dy)

    itemsize = torch.finfo(dtype).bits // 8
    families["layernorm"] = {"ms": timed_ms(layernorm) * (2 * L + 1), "bytes": 5.0 * BT * C * itemsize * (2 * L + 1),
                             "launches": 2 * (2 * L + 1)}

    # classifier: cross-entropy over the first V of Vp logits, forward + backward.
    logits = randn(BT, PADDED_VOCAB, requires_grad=True)
    targets = torch.randint(0, VOCAB, (BT,), device=device)

    def classifier():
        F.cross_entropy(logits[:, :VOCAB].float(), targets).backward()

    families["classifier"] = {"ms": timed_ms(classifier), "bytes": 2.0 * BT * PADDED_VOCAB * itemsize, "launches": 2}

    # adamw: one fused step over all parameters, FP32 master weights (once per optimizer step).
    n = PADDED_VOCAB * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C
    params = [torch.zeros(n, device=device, dtype=torch.float32, requires_grad=True)]
    params[0].grad = torch.randn(n, device=device, dtype=torch.float32)
    fused = {"fused": True} if device == "cuda" else {}
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, **fused)
    families["adamw"] = {"ms": timed_ms(opt.step), "bytes": 16.0 * n + 12.0 * n, "launches": 1, "parameters": n}

    for name, f in families.items():
        s = f["ms"] / 1e3
        f["tflops"] = f["flops"] / s / 1e12 if "flops" in f and s > 0 else None
        f["gbs"] = f["bytes"] / s / 1e9 if "bytes" in f and s > 0 else None
        if not math.isfinite(f["ms"]) or f["ms"] <= 0:
            sys.exit(f"library_baselines.py: {name} took {f['ms']} ms")
    result = {"model": args.model, "layers": L, "heads": NH, "channels": C, "B": B, "T": T, "device": device,
              "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu", "dtype": str(dtype),
              "torch": torch.__version__, "families": families,
              "micro_step_ms": sum(f["ms"] for k, f in families.items() if k != "adamw")}
    print(f"library baselines: {args.model} (L={L}, NH={NH}, C={C}), B={B} T={T}, {result['device_name']}, {dtype}, "
          f"torch {torch.__version__}")
    for name, f in families.items():
        rate = f"{f['tflops']:.1f} TFLOP/s" if f["tflops"] else f"{f['gbs']:.1f} GB/s"
        print(f"  {name:<11} {f['ms']:10.3f} ms  {rate}")
    print(f"  micro-step (without adamw): {result['micro_step_ms']:.3f} ms")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
