"""GPT-2 reference in PyTorch that writes the test fixtures the C++/CUDA trainer is checked against.

    python dev/gpt2_reference.py --out test/fixtures

The model (written for this project from the published GPT-2 architecture):
  x = wte[inputs] + wpe[:T]
  L times:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))     (pre-LayerNorm blocks)
    attn: qkv = h @ qkvw^T + qkvb, columns [q | k | v], each split into NH contiguous heads of
          size C/NH; causal softmax(q k^T / sqrt(C/NH)) v; heads concatenated; @ attprojw^T + attprojb
    mlp:  gelu_tanh(h @ fcw^T + fcb) @ fcprojw^T + fcprojb
  x = ln_f(x);  logits = x @ wte[:V]^T  (tied head; only the real vocabulary's columns)
  loss = mean over targets != -1 of cross_entropy(logits, target)
With documents (the docmask fixture; the trainer's --doc-mask --doc-positions): a row is documents
packed back to back, each starting at an EOT token (the fixture's documents.eot) or at the row's start.
doc[t] = the number of EOTs in the row at positions <= t; query i attends to key j only when j <= i
and doc[j] == doc[i] (an explicit boolean mask), and position embeddings restart at each document:
x = wte[inputs] + wpe[pos] with pos[t] = 0 where t starts a document, else pos[t-1] + 1.
LayerNorm eps is 1e-5 everywhere (biased variance). wte has Vp = V rounded up to a multiple of 128
rows; rows >= V are zero, never reach the softmax, and so get a zero gradient.

Initialisation: GPT-2's (seeded): Linear weights and both embeddings N(0, 0.02), the residual
projections (attprojw, fcprojw) N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weight 1 and bias 0.
THEN, for testing only, every bias and LayerNorm weight/bias gets N(0, 0.02) noise added, so the
gradients that flow through them are exercised with non-trivial values.

Everything is computed in float64 (the exact side); tensors are stored as float32 (tokens int32).

AdamW (torch.optim.AdamW semantics, decoupled weight decay; at step t = 1, 2, ...:
  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
  p = p (1 - lr wd) - lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)):
lr 1e-3 constant, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on wte, wpe, qkvw, attprojw, fcw, fcprojw only (the weight matrices
and embeddings; never biases or LayerNorm parameters). Before each step the gradients are scaled
by min(1, grad_clip / norm), norm being the L2 norm over all gradients (no epsilon); grad_clip is
1.0, except 2.2 in the d2_c96 fixtures and 0.8 in d2_c64_docmask, so that only some of their steps
are clipped. Step s (0-based) trains on batch s % 2 of `adamw.inputs`/`adamw.targets`; batch 0 is
`inputs`/`targets`.

File format, version 1 (little-endian):
  header: 256 int32: [0] magic 20261121, [1] version 1, [2] number of tensors N,
          [3] byte length of the metadata JSON, the rest 0
  metadata JSON (UTF-8): {"config": {L, C, NH, V, Vp, maxT, B, T},
          "adamw": {lr, beta1, beta2, eps, weight_decay, grad_clip, steps},
          "script_sha256": SHA-256 (hex) of this file's bytes, "torch_version", "seed", "notes"}
          and, in the docmask fixture only, "documents": {"eot", "eots": [[EOT positions of row b]]}
  N tensor records: int32 name length, name (ASCII), int32 dtype (0 float32, 1 int32),
          int32 ndim, ndim x int64 dims, data (row-major); nothing after the last record.
Tensors, in file order:
  parameters (llm.c checkpoint order, Linear weights as (out, in)):
    wte (Vp,C) wpe (maxT,C) ln1w (L,C) ln1b (L,C) qkvw (L,3C,C) qkvb (L,3C) attprojw (L,C,C)
    attprojb (L,C) ln2w (L,C) ln2b (L,C) fcw (L,4C,C) fcb (L,4C) fcprojw (L,C,4C) fcprojb (L,C)
    lnfw (C) lnfb (C)
  inputs (B,T) int32, targets (B,T) int32 (-1 = ignored), logits (B,T,V), loss (scalar, ndim 0)
  grad.<name> for every parameter (same shape; wte's padded rows included)
  adamw.inputs (2,B,T) int32, adamw.targets (2,B,T) int32, adamw.loss (K,) loss before each step,
  adamw.grad_norm (K,) global gradient norm before clipping, final.<name> parameters after K steps
"""

import argparse
import hashlib
import json
import math
import struct
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

MAGIC = 20261121
VERSION = 1
HEADER_INTS = 256
DTYPE_CODES = {np.dtype("<f4"): 0, np.dtype("<i4"): 1}

ADAMW = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, steps=10)  # + grad_clip
DECAYED = ("wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw")  # llm.c decays exactly these
LN_EPS = 1e-5

FIXTURES = {
    # name: (config, seed, masked targets?, grad_clip[, documents]). The grad norms here are 1.4-3,
    # so clip 1.0 scales every step; 2.2 scales only some, which exercises both branches of the rule.
    "d2_c64": (dict(L=2, C=64, NH=4, V=512, maxT=64, B=2, T=32), 1, False, 1.0),
    "d2_c96_odd": (dict(L=2, C=96, NH=3, V=301, maxT=40, B=3, T=37), 2, False, 2.2),
    # Same config and seed as d2_c96_odd, so the only difference is the ignored targets.
    "d2_c96_masked": (dict(L=2, C=96, NH=3, V=301, maxT=40, B=3, T=37), 2, True, 2.2),
    # Packed documents (document mask and restarted positions), EOT = V - 1 as in GPT-2. Row 0: EOTs
    # at 1 (make_batch's V - 1), 2, 31, 32, 50, 64, 65, 99: documents of length 1, boundaries on the
    # 32-token (SIMT) and 64-token (tensor-core) tile edges and inside tiles; row 1 without EOT; row 2
    # with EOTs at 40 and 96, so the last query tile skips three key tiles. Its grad norms are 0.6-1.1:
    # clip 0.8 scales some steps.
    "d2_c64_docmask": (dict(L=2, C=64, NH=4, V=512, maxT=128, B=3, T=100), 3, False, 0.8,
                       dict(eot=511, eots=[[1, 2, 31, 32, 50, 64, 65, 99], [], [40, 96]])),
}


def parameter_shapes(cfg):
    L, C, Vp, maxT = cfg["L"], cfg["C"], cfg["Vp"], cfg["maxT"]
    return {
        "wte": (Vp, C), "wpe": (maxT, C), "ln1w": (L, C), "ln1b": (L, C),
        "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C), "attprojw": (L, C, C), "attprojb": (L, C),
        "ln2w": (L, C), "ln2b": (L, C), "fcw": (L, 4 * C, C), "fcb": (L, 4 * C),
        "fcprojw": (L, C, 4 * C), "fcprojb": (L, C), "lnfw": (C,), "lnfb": (C,),
    }


def init_parameters(cfg, gen):
    """GPT-2 init, then test noise on biases and LayerNorm parameters (see module docstring)."""
    L, V = cfg["L"], cfg["V"]
    params = {}
    for name, shape in parameter_shapes(cfg).items():
        if name.startswith("ln") and name.endswith("w"):  # ln1w, ln2w, lnfw
            value = torch.ones(shape, dtype=torch.float64)
        elif name in ("attprojw", "fcprojw"):
            value = torch.randn(shape, generator=gen, dtype=torch.float64) * (0.02 / math.sqrt(2 * L))
        elif name in DECAYED:
            value = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.02
        else:
            value = torch.zeros(shape, dtype=torch.float64)
        if name == "wte":
            value[V:] = 0.0  # padded vocabulary rows
        params[name] = value
    for name in params:
        if name not in DECAYED:  # biases and LayerNorm weight/bias
            params[name] += torch.randn(params[name].shape, generator=gen, dtype=torch.float64) * 0.02
    return params


def document_mask_and_positions(inputs, eot):
    """(B, T, T) attention mask (query, key) and (B, T) positions of packed documents (docstring)."""
    B, T = inputs.shape
    doc = torch.cumsum((inputs == eot).long(), dim=1)  # document index of each token in its row
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    mask = causal & (doc[:, :, None] == doc[:, None, :])
    positions = torch.zeros(B, T, dtype=torch.long)
    for t in range(1, T):
        positions[:, t] = torch.where(inputs[:, t] == eot, 0, positions[:, t - 1] + 1)
    return mask, positions


def forward(params, inputs, targets, cfg, documents=None):
    L, C, NH, V = cfg["L"], cfg["C"], cfg["NH"], cfg["V"]
    B, T = inputs.shape
    hs = C // NH
    p = params
    if documents is None:
        x = p["wte"][inputs] + p["wpe"][:T]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
    else:
        mask, positions = document_mask_and_positions(inputs, documents["eot"])
        x = p["wte"][inputs] + p["wpe"][positions]
        causal = mask[:, None]  # (B, 1, T, T): the same for every head
    for l in range(L):
        h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], LN_EPS)
        qkv = h @ p["qkvw"][l].T + p["qkvb"][l]
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=-1))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        scores = scores.masked_fill(~causal, float("-inf"))
        y = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p["attprojw"][l].T + p["attprojb"][l]
        h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], LN_EPS)
        h = F.gelu(h @ p["fcw"][l].T + p["fcb"][l], approximate="tanh")
        x = x + h @ p["fcprojw"][l].T + p["fcprojb"][l]
    x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], LN_EPS)
    logits = x @ p["wte"][:V].T  # the padded rows never reach the softmax
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1).long(), ignore_index=-1)
    return logits, loss


def loss_and_grads(params, inputs, targets, cfg, documents=None):
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in params.items()}
    logits, loss = forward(leaves, inputs, targets, cfg, documents)
    loss.backward()
    return logits.detach(), loss.detach(), {n: t.grad for n, t in leaves.items()}


def make_batch(cfg, gen, masked, row_mask_fractions):
    """Random tokens; with `masked`, row b has about row_mask_fractions[b] of its targets = -1."""
    B, T, V = cfg["B"], cfg["T"], cfg["V"]
    inputs = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    inputs[0, 1] = V - 1  # exercise the last real vocabulary row in both lookups
    targets[B - 1, T - 2] = V - 1
    for b, fraction in enumerate(row_mask_fractions[:B]):
        # Drawn either way, so a masked fixture differs from its unmasked twin only in the -1s.
        positions = torch.randperm(T, generator=gen)[:round(fraction * T)]
        if masked:
            targets[b, positions] = -1
    return inputs, targets


def pack_documents(inputs, documents):
    """Places the EOTs of `documents` (and only those) in a batch's inputs."""
    eot = documents["eot"]
    inputs[inputs == eot] = eot - 1
    for b, row in enumerate(documents["eots"]):
        inputs[b, row] = eot


def adamw_run(params, batches, cfg, a, documents=None):
    """K AdamW steps with global-norm clipping; returns per-step losses, norms, final params."""
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in params.items()}
    groups = [
        {"params": [leaves[n] for n in leaves if n in DECAYED], "weight_decay": a["weight_decay"]},
        {"params": [leaves[n] for n in leaves if n not in DECAYED], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"],
                            foreach=False, fused=False)
    losses, norms = [], []
    for step in range(a["steps"]):
        inputs, targets = batches[step % len(batches)]
        opt.zero_grad(set_to_none=True)
        _, loss = forward(leaves, inputs, targets, cfg, documents)
        loss.backward()
        norm = torch.sqrt(sum((t.grad ** 2).sum() for t in leaves.values()))
        scale = min(1.0, a["grad_clip"] / norm.item())
        for t in leaves.values():
            t.grad.mul_(scale)
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
    return losses, norms, {n: t.detach() for n, t in leaves.items()}


def as_f32(t):  # np.array keeps 0-d scalars 0-d (ascontiguousarray would make them 1-d)
    return np.array(torch.as_tensor(t, dtype=torch.float64).numpy(), dtype="<f4", order="C")


def as_i32(t):
    return np.array(torch.as_tensor(t).numpy(), dtype="<i4", order="C")


def write_fixture(path, meta, tensors):
    meta_bytes = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode("utf-8")
    header = [0] * HEADER_INTS
    header[0:4] = [MAGIC, VERSION, len(tensors), len(meta_bytes)]
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{HEADER_INTS}i", *header))
        f.write(meta_bytes)
        for name, array in tensors:
            name_bytes = name.encode("ascii")
            f.write(struct.pack("<i", len(name_bytes)) + name_bytes)
            f.write(struct.pack("<ii", DTYPE_CODES[array.dtype], array.ndim))
            f.write(struct.pack(f"<{array.ndim}q", *array.shape))
            f.write(array.tobytes(order="C"))


def fp32_differences(params, inputs, targets, cfg, logits64, loss64, grads64, documents=None):
    """How far a float32 run of the same model is from the float64 reference (printed only)."""
    p32 = {n: t.float() for n, t in params.items()}
    logits32, loss32, grads32 = loss_and_grads(p32, inputs, targets, cfg, documents)
    worst_grad = max(((grads32[n].double() - g).abs().max() / g.abs().max().clamp_min(1e-30)).item()
                     for n, g in grads64.items())
    return (abs(loss32.item() - loss64.item()), (logits32.double() - logits64).abs().max().item(),
            worst_grad)


def build(name, cfg, seed, masked, grad_clip, script_sha256, documents=None):
    cfg = dict(cfg, Vp=(cfg["V"] + 127) // 128 * 128)
    gen = torch.Generator().manual_seed(seed)
    params = init_parameters(cfg, gen)
    # Uneven masks: some rows with many ignored targets, one row with none (about 20% overall).
    batch0 = make_batch(cfg, gen, masked, [0.0, 0.4, 0.2])
    batch1 = make_batch(cfg, gen, masked, [0.35, 0.25, 0.0])
    if documents is not None:
        for batch in (batch0, batch1):
            pack_documents(batch[0], documents)
    logits, loss, grads = loss_and_grads(params, *batch0, cfg, documents)
    adamw = dict(ADAMW, grad_clip=grad_clip)
    losses, norms, final = adamw_run(params, [batch0, batch1], cfg, adamw, documents)
    assert losses[0] == loss.item() and all(final["wte"][cfg["V"]:].flatten() == 0)
    # A float32 implementation must take the same clip decision at every step.
    assert all(abs(n / grad_clip - 1) > 0.01 for n in norms), f"{name}: a grad norm is too near the clip {norms}"

    tensors = [(n, as_f32(t)) for n, t in params.items()]
    tensors += [("inputs", as_i32(batch0[0])), ("targets", as_i32(batch0[1])),
                ("logits", as_f32(logits)), ("loss", as_f32(loss))]
    tensors += [("grad." + n, as_f32(g)) for n, g in grads.items()]
    tensors += [("adamw.inputs", as_i32(torch.stack([batch0[0], batch1[0]]))),
                ("adamw.targets", as_i32(torch.stack([batch0[1], batch1[1]]))),
                ("adamw.loss", as_f32(losses)),
                ("adamw.grad_norm", as_f32(norms))]
    tensors += [("final." + n, as_f32(t)) for n, t in final.items()]
    meta = {
        "config": cfg, "adamw": adamw, "script_sha256": script_sha256,
        "torch_version": torch.__version__, "seed": seed,
        **({"documents": documents} if documents is not None else {}),
        "notes": "Computed in float64, stored as float32. Fixture " + name + ". Biases and LayerNorm "
                 "parameters carry N(0,0.02) test noise on top of GPT-2 init. AdamW step s uses "
                 "batch s % 2 of adamw.inputs/adamw.targets; gradients scaled by "
                 "min(1, grad_clip/norm) before each step; weight decay only on "
                 + ",".join(DECAYED) + "." +
                 (" Documents start at EOT token documents.eot, placed at documents.eots in both batches; "
                  "attention is masked to the query's document and position embeddings restart at each "
                  "document (--doc-mask --doc-positions)." if documents is not None else ""),
    }
    ignored = int((batch0[1] == -1).sum())
    diffs = fp32_differences(params, *batch0, cfg, logits, loss, grads, documents)
    summary = (f"{name}: loss {loss.item():.6f}, ignored targets {ignored}/{batch0[1].numel()}, "
               f"grad norms {norms[0]:.3f}..{norms[-1]:.3f} (clipped at {sum(n > grad_clip for n in norms)} "
               f"of {len(norms)} steps), final loss {losses[-1]:.6f}\n"
               f"  fp32 vs fp64: |loss| {diffs[0]:.2e}, max |logit| {diffs[1]:.2e}, "
               f"max grad diff / max |grad| {diffs[2]:.2e}")
    return meta, tensors, summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="test/fixtures", help="folder for the .bin fixtures")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one summation order, whatever the machine
    torch.use_deterministic_algorithms(True)
    script_sha256 = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, (cfg, seed, masked, grad_clip, *documents) in FIXTURES.items():
        meta, tensors, summary = build(name, cfg, seed, masked, grad_clip, script_sha256, *documents)
        path = out / f"{name}.bin"
        write_fixture(path, meta, tensors)
        print(summary)
        print(f"  wrote {path} ({path.stat().st_size} bytes, {len(tensors)} tensors)")


if __name__ == "__main__":
    main()
