#!/usr/bin/env python3
"""scripts/hf_convert.py against transformers' GPT2LMHeadModel (all on the CPU, no network):
  1. export: a model our trainer wrote (tiny, 3 steps, BF16) loads with from_pretrained, and its logits
     match our forward's (dev/forward_logits.cu, FP32 build) within 1e-5 of the largest logit; the BF16
     build's within 2e-2.
  2. import of that export: the very bytes of the trainer's file (BF16); as FP32, the same logits to the
     bit; the C++ reader verifies the CRC-32C the importer wrote (and refuses a flipped byte).
  3. a randomly initialised GPT2LMHeadModel (noise on every parameter), saved sharded by save_pretrained
     and rewritten in the hub's layout (no "transformer." prefix, attn.bias / attn.masked_bias buffers, a
     tied lm_head copy; transformers loads both to the same logits): imported, our forward matches within
     1e-5 (FP32 build) and 2e-2 (BF16 build); both folders import to the same bytes; export + import is
     bit-exact (FP32); --dtype bf16 rounds as torch does.
  4. fine-tuning: train_gpt -e on that import trains 8 steps on a repeated sentence, the loss finite and
     falling by more than 1.
  5. bad inputs: one-line "hf_convert: FILE: what" errors and exit status 1.
Skipped (77) when torch or transformers is missing: python3 -m pip install torch transformers safetensors

    test_hf_interop.py BUILD_DIR TRAIN_BINARY     (BUILD_DIR holds forward_logits and forward_logits_fp32)
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "scripts", "hf_convert.py")
FP32_TOLERANCE = 1e-5  # max |ours - transformers'| over max |transformers'| logit
BF16_TOLERANCE = 2e-2  # the BF16 build: parameters and activations rounded to 8 significant bits
SENTENCE = [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13] * 5  # "The quick brown fox ..."


def run(*args, expect_ok=True):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if expect_ok and p.returncode != 0:
        sys.exit(f"hf_interop: {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    return p


def convert(*args, expect_ok=True):
    return run(sys.executable, TOOL, *args, expect_ok=expect_ok)


def write_shards(directory, tokens):
    for name in ("train_000000.bin", "val_000000.bin"):
        with open(os.path.join(directory, name), "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
            f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    build, train = sys.argv[1], sys.argv[2]
    # Offline and quiet: nothing here may reach the network, and load reports would bury the results.
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", HF_HUB_DISABLE_PROGRESS_BARS="1")
    try:
        import numpy as np
        import safetensors  # noqa: F401 (the tool's dependency)
        import torch
        import transformers
    except ImportError as e:
        print(f"hf_interop: SKIPPED: {e.name} is not installed (python3 -m pip install torch transformers safetensors)")
        return 77
    from safetensors.numpy import load_file, save_file
    from safetensors.torch import load_file as load_torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    work = tempfile.mkdtemp(prefix="hf_interop.")
    try:
        return checks(np, torch, transformers, load_file, save_file, load_torch, rng, build, train, work)
    finally:
        shutil.rmtree(work)


def ours(np, build, binary, model, tokens, work):
    """Our forward's logits (B, T, V) for tokens (B, T), from the model file."""
    tokens.astype("<i4").tofile(os.path.join(work, "tokens.bin"))
    out = os.path.join(work, "logits.bin")
    run(os.path.join(build, binary), model, os.path.join(work, "tokens.bin"), tokens.shape[0], out)
    return np.fromfile(out, dtype="<f4").reshape(tokens.shape + (-1,))


def relative_error(np, a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def check_logits(np, build, model, tokens, theirs, work, what):
    """Our FP32 and BF16 builds' logits for a model file against transformers' (theirs), within bounds."""
    fp32 = relative_error(np, ours(np, build, "forward_logits_fp32", model, tokens, work), theirs)
    bf16 = relative_error(np, ours(np, build, "forward_logits", model, tokens, work), theirs)
    print(f"hf_interop: {what}: logits max |ours - transformers'| / max |logit|: FP32 build {fp32:.2e}, "
          f"BF16 build {bf16:.2e} (max logit {np.abs(theirs).max():.3f})")
    assert fp32 <= FP32_TOLERANCE, f"FP32 logits differ by {fp32:.2e} > {FP32_TOLERANCE}"
    assert bf16 <= BF16_TOLERANCE, f"BF16 logits differ by {bf16:.2e} > {BF16_TOLERANCE}"


def hf_logits(torch, model, tokens):
    with torch.no_grad():
        return model(torch.from_numpy(tokens).long()).logits.float().numpy()


def checks(np, torch, transformers, load_file, save_file, load_torch, rng, build, train, work):
    from transformers import GPT2Config, GPT2LMHeadModel

    def load(folder):
        return GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()

    # ---- 1. export of a model our trainer wrote ----
    data = os.path.join(work, "data")
    os.makedirs(data)
    write_shards(data, ([50256] + SENTENCE * 8) * 40)
    run(train, "-e", "tiny", "-b", "2", "-t", "32", "-x", "3", "-l", "1e-2", "-v", "0", "-s", "0", "-n", "3",
        "-i", os.path.join(data, "train_*.bin"), "-o", os.path.join(work, "run"))
    trained = os.path.join(work, "run", "model_00000003.bin")
    exported = os.path.join(work, "exported")
    convert("export", trained, exported)
    config = json.load(open(os.path.join(exported, "config.json")))
    expected_config = {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 64, "n_embd": 64, "n_layer": 2,
                       "n_head": 4, "activation_function": "gelu_new", "tie_word_embeddings": True,
                       "layer_norm_epsilon": 1e-5, "architectures": ["GPT2LMHeadModel"]}
    assert {k: config.get(k) for k in expected_config} == expected_config, f"config.json: {config}"
    tensors = load_torch(os.path.join(exported, "model.safetensors"))
    assert len(tensors) == 4 + 12 * 2 and "lm_head.weight" not in tensors, sorted(tensors)
    assert tensors["transformer.wte.weight"].shape == (50257, 64), "wte: the padded rows must be dropped"
    assert tensors["transformer.h.1.mlp.c_fc.weight"].shape == (64, 256), "Conv1D weights are (in, out)"
    assert all(t.dtype == torch.bfloat16 for t in tensors.values()), "a BF16 file exports as bfloat16"
    model = load(exported)
    tokens = rng.integers(0, 50257, size=(2, 64))  # every position of maxT = 64
    theirs = hf_logits(torch, model, tokens)
    check_logits(np, build, trained, tokens, theirs, work, "export")

    # ---- 2. import of the export ----
    back = os.path.join(work, "back.bin")
    convert("import", exported, back)
    assert open(back, "rb").read() == open(trained, "rb").read(), "import(export(file)) != file (BF16)"
    back32 = os.path.join(work, "back32.bin")
    convert("import", exported, back32, "--dtype", "fp32")
    header = np.fromfile(back32, dtype="<i4", count=256)
    assert header[1] == 3 and header[8] == 1, f"an FP32 file with our CRC-32C: header {header[:10]}"
    a = ours(np, build, "forward_logits_fp32", back32, tokens, work)
    b = ours(np, build, "forward_logits_fp32", trained, tokens, work)
    assert np.array_equal(a, b), "the FP32 import (bf16 widened exactly) must give the same logits to the bit"
    corrupt = os.path.join(work, "corrupt.bin")
    raw = bytearray(open(back32, "rb").read())
    raw[1024 + 4 * 1000] ^= 0x01
    open(corrupt, "wb").write(raw)
    p = run(os.path.join(build, "forward_logits_fp32"), corrupt, os.path.join(work, "tokens.bin"), 2,
            os.path.join(work, "x.bin"), expect_ok=False)
    assert p.returncode != 0 and "CRC-32C" in p.stderr and "corrupt file" in p.stderr, \
        f"train_gpt's reader must verify the importer's checksum: {p.stderr}"
    print("hf_interop: import of the export: the trainer's bytes (BF16); as FP32 the same logits; CRC-32C verified")

    # ---- 3. a randomly initialised transformers model, in save_pretrained's and the hub's layouts ----
    hub_config = GPT2Config(vocab_size=50257, n_positions=40, n_embd=64, n_layer=3, n_head=2)
    reference = GPT2LMHeadModel(hub_config).eval()
    with torch.no_grad():
        for p in reference.parameters():  # biases and LayerNorms away from 0 and 1
            p.add_(torch.randn_like(p) * 0.05)
    sharded = os.path.join(work, "sharded")
    reference.save_pretrained(sharded, max_shard_size="1MB")
    assert os.path.exists(os.path.join(sharded, "model.safetensors.index.json")), os.listdir(sharded)
    hub = os.path.join(work, "hub")
    os.makedirs(hub)
    shutil.copy(os.path.join(sharded, "config.json"), hub)
    state = {}
    for name in os.listdir(sharded):
        if name.endswith(".safetensors"):
            state.update(load_file(os.path.join(sharded, name)))
    state = {k.removeprefix("transformer."): v for k, v in state.items()}
    P = hub_config.n_positions
    for l in range(hub_config.n_layer):
        state[f"h.{l}.attn.bias"] = np.tril(np.ones((P, P), dtype=np.float32)).reshape(1, 1, P, P)
        state[f"h.{l}.attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
    state["lm_head.weight"] = state["wte.weight"].copy()
    save_file(state, os.path.join(hub, "model.safetensors"), metadata={"format": "pt"})
    tokens = rng.integers(0, 50257, size=(2, P))
    theirs = hf_logits(torch, reference, tokens)
    for folder in (sharded, hub):
        assert np.array_equal(hf_logits(torch, load(folder), tokens), theirs), f"transformers reloads {folder} differently"
    hub_bin = os.path.join(work, "hub.bin")
    convert("import", hub, hub_bin)
    check_logits(np, build, hub_bin, tokens, theirs, work, "import of transformers' model")
    sharded_bin = os.path.join(work, "sharded.bin")
    convert("import", sharded, sharded_bin)
    assert open(sharded_bin, "rb").read() == open(hub_bin, "rb").read(), "the two layouts import differently"
    roundtrip = os.path.join(work, "roundtrip")
    convert("export", hub_bin, roundtrip)
    roundtrip_bin = os.path.join(work, "roundtrip.bin")
    convert("import", roundtrip, roundtrip_bin)
    assert open(roundtrip_bin, "rb").read() == open(hub_bin, "rb").read(), "import(export(file)) != file (FP32)"
    hub_bf16 = os.path.join(work, "hub_bf16.bin")
    convert("import", hub, hub_bf16, "--dtype", "bf16")
    convert("export", hub_bf16, os.path.join(work, "hub_bf16"))
    rounded = load_torch(os.path.join(work, "hub_bf16", "model.safetensors"))
    for name, value in reference.state_dict().items():
        if name != "lm_head.weight":
            assert torch.equal(rounded[name], value.to(torch.bfloat16)), f"{name}: not rounded as torch rounds"
    print("hf_interop: hub layout and sharded folder import alike; FP32 export + import bit-exact; bf16 rounding as torch's")

    # ---- 4. fine-tuning from the imported model ----
    run_dir = os.path.join(work, "finetune")
    run(train, "-e", hub_bin, "-b", "4", "-t", "32", "-x", "8", "-l", "3e-3", "-v", "0", "-s", "0",
        "-i", os.path.join(data, "train_*.bin"), "-o", run_dir)
    losses = [json.loads(line)["loss"] for line in open(os.path.join(run_dir, "metrics.jsonl")) if '"loss"' in line]
    assert len(losses) == 8 and all(np.isfinite(losses)), f"fine-tuning losses: {losses}"
    assert losses[-1] < losses[0] - 1.0, f"fine-tuning did not learn the repeated sentence: {losses}"
    print(f"hf_interop: fine-tuning with -e on the import: loss {losses[0]:.3f} -> {losses[-1]:.3f} in 8 steps")

    # ---- 5. bad inputs: one line naming the file and the field, exit status 1 ----
    def variant(name, config_edit=None, tensor_edit=None):
        folder = os.path.join(work, name)
        os.makedirs(folder)
        config = json.load(open(os.path.join(hub, "config.json")))
        if config_edit:
            config_edit(config)
        json.dump(config, open(os.path.join(folder, "config.json"), "w"))
        tensors = dict(state)
        if tensor_edit:
            tensor_edit(tensors)
        save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        return folder

    def bad_file(name, edit):
        path = os.path.join(work, name)
        raw = bytearray(open(hub_bin, "rb").read())
        open(path, "wb").write(edit(raw))
        return path

    def set_int0(raw):
        raw[0:4] = struct.pack("<i", 1234)
        return raw

    def flip(raw):
        raw[2048] ^= 0x40
        return raw

    def nan(tensors):
        tensors["h.2.ln_2.weight"] = tensors["h.2.ln_2.weight"].copy()
        tensors["h.2.ln_2.weight"][5] = np.nan

    no_safetensors = os.path.join(work, "pt_only")
    os.makedirs(no_safetensors)
    shutil.copy(os.path.join(hub, "config.json"), no_safetensors)
    cases = [
        (["export", bad_file("magic.bin", set_int0), os.path.join(work, "x")], "magic.bin: bad magic 1234 in header int 0"),
        (["export", bad_file("flipped.bin", flip), os.path.join(work, "x")], "flipped.bin: the parameters' CRC-32C is"),
        (["export", bad_file("short.bin", lambda raw: raw[:-4]), os.path.join(work, "x")], "short.bin: file is"),
        (["import", os.path.join(work, "exported", "model.safetensors"), os.path.join(work, "x.bin")],
         "model.safetensors/config.json: missing"),
        (["import", no_safetensors, os.path.join(work, "x.bin")], "pt_only: no model.safetensors"),
        (["import", variant("relu", lambda c: c.update(activation_function="relu")), os.path.join(work, "x.bin")],
         "relu/config.json: unsupported activation_function \"relu\""),
        (["import", variant("untied_config", lambda c: c.update(tie_word_embeddings=False)), os.path.join(work, "x.bin")],
         "untied_config/config.json: unsupported tie_word_embeddings false"),
        (["import", variant("eps", lambda c: c.update(layer_norm_epsilon=1e-6)), os.path.join(work, "x.bin")],
         "eps/config.json: unsupported layer_norm_epsilon 1e-06"),
        (["import", variant("no_layers", lambda c: c.pop("n_layer")), os.path.join(work, "x.bin")],
         "no_layers/config.json: n_layer is null"),
        (["import", variant("untied", tensor_edit=lambda t: t.update({"lm_head.weight": t["wte.weight"] * 2})),
          os.path.join(work, "x.bin")], "untied/model.safetensors: lm_head.weight differs from wte.weight"),
        (["import", variant("missing", tensor_edit=lambda t: t.pop("h.1.mlp.c_fc.bias")), os.path.join(work, "x.bin")],
         "missing: missing tensor h.1.mlp.c_fc.bias"),
        (["import", variant("shape", tensor_edit=lambda t: t.update({"wpe.weight": t["wpe.weight"][:20]})),
          os.path.join(work, "x.bin")], "shape/model.safetensors: tensor wpe.weight has shape [20, 64], config.json implies [40, 64]"),
        (["import", variant("extra", tensor_edit=lambda t: t.update({"h.0.crossattention.c_attn.bias": t["h.0.attn.c_attn.bias"]})),
          os.path.join(work, "x.bin")], "extra/model.safetensors: unexpected tensor h.0.crossattention.c_attn.bias"),
        (["import", variant("nan", tensor_edit=nan), os.path.join(work, "x.bin")],
         "nan/model.safetensors: tensor h.2.ln_2.weight has 1 non-finite values"),
    ]
    for args, expected in cases:
        p = convert(*args, expect_ok=False)
        lines = p.stderr.splitlines()
        assert p.returncode == 1 and len(lines) == 1 and lines[0].startswith("hf_convert: ") and expected in lines[0], \
            f"{' '.join(args)}: expected exit 1 and one line with '{expected}', got {p.returncode}: {p.stderr!r}"
    assert not os.path.exists(os.path.join(work, "x.bin")) and not os.path.exists(os.path.join(work, "x")), \
        "a failed conversion must leave nothing behind"
    print(f"hf_interop: {len(cases)} bad inputs refused with one-line errors")
    print(f"hf_interop: passed (torch {torch.__version__}, transformers {transformers.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
