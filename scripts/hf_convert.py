#!/usr/bin/env python3
"""Converts between llm.c model files (what train_gpt writes and reads with -e) and Hugging Face GPT-2
folders (config.json + model.safetensors, what transformers.GPT2LMHeadModel.from_pretrained loads).

    python3 scripts/hf_convert.py export MODEL.bin OUT_DIR
    python3 scripts/hf_convert.py import HF_DIR OUT.bin [--dtype fp32|bf16]

export: the file's parameters in its own precision (version 3: float32, version 5: bfloat16), the
  padded vocabulary rows of wte dropped, the head tied to wte (no lm_head.weight), the Conv1D weights
  transposed to Hugging Face's (in, out). A file with our CRC-32C (header int 8 = 1) is verified first.
import: config.json and model.safetensors (or a sharded model.safetensors.index.json), keys with or
  without the "transformer." prefix (the hub's GPT-2 files have none), the attention-mask buffers
  (attn.bias, attn.masked_bias) ignored, an lm_head.weight accepted only when equal to wte. wte is
  padded to a multiple of 128 rows with zeros; the file gets our CRC-32C, so train_gpt verifies it.
  --dtype: the llm.c file's precision; default bf16 when every tensor is bfloat16, else fp32.
  fp32 -> bf16 rounds to nearest even (as train_gpt's BF16 build does); every other way is exact.

Needs numpy and safetensors (dev/requirements.txt); never the network, torch or transformers. Errors
are one line, "hf_convert: FILE: what", and exit status 1.
"""
import argparse
import contextlib
import json
import os
import sys
from collections import namedtuple

import numpy as np

TOOL = "hf_convert"

# llm.c model file (host/checkpoint.h): 256 int32 header, then the parameters.
MAGIC = 20240326
VERSION_FP32, VERSION_BF16 = 3, 5
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
CHECKSUM_KIND_INT, CHECKSUM_INT, CHECKSUM_CRC32C = 8, 9, 1

# The model's shape as the header stores it (host/model_config.h's GPT2Config).
Shape = namedtuple("Shape", "max_seq_len vocab_size padded_vocab_size num_layers num_heads channels")

# The 16 parameter tensors in llm.c's file order (host/model_config.h's kParameterNames, which defines
# the order and the shapes below), each with its Hugging Face name ({l}: the layer) and whether Hugging
# Face stores it transposed: its Conv1D keeps weights (in, out), ours are (out, in).
PARAMETERS = [
    ("wte", "wte.weight", False),
    ("wpe", "wpe.weight", False),
    ("ln1w", "h.{l}.ln_1.weight", False),
    ("ln1b", "h.{l}.ln_1.bias", False),
    ("qkvw", "h.{l}.attn.c_attn.weight", True),
    ("qkvb", "h.{l}.attn.c_attn.bias", False),
    ("attprojw", "h.{l}.attn.c_proj.weight", True),
    ("attprojb", "h.{l}.attn.c_proj.bias", False),
    ("ln2w", "h.{l}.ln_2.weight", False),
    ("ln2b", "h.{l}.ln_2.bias", False),
    ("fcw", "h.{l}.mlp.c_fc.weight", True),
    ("fcb", "h.{l}.mlp.c_fc.bias", False),
    ("fcprojw", "h.{l}.mlp.c_proj.weight", True),
    ("fcprojb", "h.{l}.mlp.c_proj.bias", False),
    ("lnfw", "ln_f.weight", False),
    ("lnfb", "ln_f.bias", False),
]
# Buffers, not parameters: the causal mask and its fill value that older transformers saved per layer.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
HF_PREFIX = "transformer."


class ConvertError(Exception):
    pass


def fail(message):
    raise ConvertError(message)


def pad_vocab(vocab_size):  # host/model_config.h's pad_vocab: the classifier's and matmuls' tiles
    return (vocab_size + 127) // 128 * 128


def parameter_shapes(s):
    """Each tensor's llm.c shape, the per-layer ones with a leading L."""
    L, C = s.num_layers, s.channels
    per_layer = {"ln1w": (C,), "ln1b": (C,), "qkvw": (3 * C, C), "qkvb": (3 * C,), "attprojw": (C, C),
                 "attprojb": (C,), "ln2w": (C,), "ln2b": (C,), "fcw": (4 * C, C), "fcb": (4 * C,),
                 "fcprojw": (C, 4 * C), "fcprojb": (C,)}
    shapes = {"wte": (s.padded_vocab_size, C), "wpe": (s.max_seq_len, C), "lnfw": (C,), "lnfb": (C,)}
    shapes.update({name: (L,) + shape for name, shape in per_layer.items()})
    return [shapes[name] for name, _, _ in PARAMETERS]


def shape_problem(s):
    """host/model_config.h's shape_problem: '' when consistent, else the first field that is not."""
    for field in ("max_seq_len", "vocab_size", "num_layers", "num_heads", "channels", "padded_vocab_size"):
        if getattr(s, field) <= 0:
            return f"{field} {getattr(s, field)} must be positive"
    if s.padded_vocab_size < s.vocab_size:
        return f"padded_vocab_size {s.padded_vocab_size} is below vocab_size {s.vocab_size}"
    if s.channels % s.num_heads != 0:
        return f"channels {s.channels} is not a multiple of num_heads {s.num_heads}"
    return ""


# ---- CRC-32C (host/checksum.h: Castagnoli, reflected 0x82F63B78, init and final xor 0xFFFFFFFF) ----
# The register update r = T[(r ^ byte) & 0xFF] ^ (r >> 8) is linear over GF(2), so a long buffer is cut
# into equal chunks whose registers (from 0) numpy computes side by side, then chained: r = Z(r) ^ chunk,
# Z being "feed `chunk` zero bytes", itself linear: a 32 x 32 bit matrix. Seconds for GPT-2 124M.

def _crc_table():
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(0x82F63B78), t >> 1).astype(np.uint32)
    return t


_CRC_TABLE = _crc_table()
_CRC_TABLE_LIST = [int(x) for x in _CRC_TABLE]


def _registers(registers, rows):
    """The registers after each row of bytes (rows: uint8 (n, k)), one register per row."""
    for j in range(rows.shape[1]):
        registers = _CRC_TABLE[(registers ^ rows[:, j]) & 0xFF] ^ (registers >> np.uint32(8))
    return registers


def crc32c(data):
    data = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    chunk = max(4096, -(-data.size // 16384))
    chunks = data.size // chunk
    register = 0xFFFFFFFF
    if chunks:
        partial = _registers(np.zeros(chunks, dtype=np.uint32), data[:chunks * chunk].reshape(chunks, chunk))
        basis = _registers(np.uint32(1) << np.arange(32, dtype=np.uint32), np.zeros((32, chunk), dtype=np.uint8))
        basis = [int(x) for x in basis]
        for value in partial.tolist():
            shifted = 0
            for bit in range(32):
                if register >> bit & 1:
                    shifted ^= basis[bit]
            register = shifted ^ value
    table = _CRC_TABLE_LIST
    for byte in data[chunks * chunk:].tolist():
        register = table[(register ^ byte) & 0xFF] ^ (register >> 8)
    return register ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the check value host/checksum.h states


# ---- bfloat16 as uint16 bits (numpy has no bfloat16) ----

def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(values):
    """Round to nearest even, as __float2bfloat16 (train_gpt's BF16 build); callers pass finite values."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def check_finite(where, name, values):
    values = bf16_to_f32(values) if values.dtype == np.uint16 else values
    if not np.all(np.isfinite(values)):
        fail(f"{where}: tensor {name} has {int(np.size(values) - np.isfinite(values).sum())} non-finite values")


# ---- llm.c model files ----

def read_llmc(path):
    """(shape, version, [the 16 tensors, float32 or bf16 bits as uint16, llm.c shapes])."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER_BYTES:
        fail(f"{path}: {len(data)} bytes, shorter than the {HEADER_BYTES}-byte header (truncated)")
    header = np.frombuffer(data, dtype="<i4", count=HEADER_INTS)
    if header[0] != MAGIC:
        fail(f"{path}: bad magic {header[0]} in header int 0 (expected {MAGIC}: not an llm.c model file)")
    version = int(header[1])
    if version not in (VERSION_FP32, VERSION_BF16):
        fail(f"{path}: header version {version} is not {VERSION_FP32} (fp32) or {VERSION_BF16} (bf16)")
    shape = Shape(max_seq_len=int(header[2]), vocab_size=int(header[3]), num_layers=int(header[4]),
                  num_heads=int(header[5]), channels=int(header[6]), padded_vocab_size=int(header[7]))
    if problem := shape_problem(shape):
        fail(f"{path}: header {problem}")
    shapes = parameter_shapes(shape)
    dtype = np.dtype("<f4") if version == VERSION_FP32 else np.dtype("<u2")
    count = sum(int(np.prod(s)) for s in shapes)
    expected = HEADER_BYTES + count * dtype.itemsize
    if len(data) != expected:
        fail(f"{path}: file is {len(data)} bytes, the header implies {expected}"
             f" ({'truncated' if len(data) < expected else 'trailing bytes'})")
    kind = int(header[CHECKSUM_KIND_INT])
    if kind not in (0, CHECKSUM_CRC32C):
        fail(f"{path}: header int {CHECKSUM_KIND_INT} (checksum kind) is {kind}, not 0 (none) or 1 (CRC-32C)")
    if kind == CHECKSUM_CRC32C:
        recorded = int(header[CHECKSUM_INT]) & 0xFFFFFFFF
        actual = crc32c(memoryview(data)[HEADER_BYTES:])
        if actual != recorded:
            fail(f"{path}: the parameters' CRC-32C is {actual:08x}, the header records {recorded:08x} (corrupt file)")
    flat = np.frombuffer(data, dtype=dtype, offset=HEADER_BYTES)
    tensors, offset = [], 0
    for s in shapes:
        n = int(np.prod(s))
        tensors.append(flat[offset:offset + n].reshape(s))
        offset += n
    return shape, version, tensors


def write_llmc(path, shape, version, tensors):
    """Writes header (with our CRC-32C) and tensors atomically: a temp file renamed over `path`."""
    dtype = np.dtype("<f4") if version == VERSION_FP32 else np.dtype("<u2")
    body = np.concatenate([np.ascontiguousarray(t, dtype=dtype).reshape(-1) for t in tensors]).tobytes()
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:8] = [MAGIC, version, shape.max_seq_len, shape.vocab_size, shape.num_layers, shape.num_heads,
                  shape.channels, shape.padded_vocab_size]
    header[CHECKSUM_KIND_INT] = CHECKSUM_CRC32C
    header[CHECKSUM_INT] = np.uint32(crc32c(body)).view(np.int32)
    write_atomically(path, header.tobytes() + body)


@contextlib.contextmanager
def replaced_atomically(path):
    """Yields a temporary name beside path to write; path becomes that file when the block ends, and
    on any failure the temporary file is removed and path is left as it was."""
    tmp = f"{path}.tmp"
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_atomically(path, data):
    with replaced_atomically(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


# ---- Hugging Face folders ----

def hf_names(name_template, layers):
    return [name_template.format(l=l) for l in range(layers)] if "{l}" in name_template else [name_template]


def hf_config(shape, version):
    """config.json of GPT2LMHeadModel for this shape: GPT-2's architecture as train_gpt runs it."""
    eot = 50256  # GPT-2's <|endoftext|>, the only special token; named only if the vocabulary has it
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": shape.vocab_size,  # the real vocabulary: the padded rows are not exported
        "n_positions": shape.max_seq_len,
        "n_ctx": shape.max_seq_len,
        "n_embd": shape.channels,
        "n_layer": shape.num_layers,
        "n_head": shape.num_heads,
        "n_inner": None,  # 4 * n_embd
        "activation_function": "gelu_new",  # GELU's tanh approximation, train_gpt's
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        # train_gpt trains without dropout; a fine-tuning that wants it sets these.
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": eot if shape.vocab_size > eot else None,
        "eos_token_id": eot if shape.vocab_size > eot else None,
        "torch_dtype": "float32" if version == VERSION_FP32 else "bfloat16",
    }


def write_safetensors(path, tensors):
    """tensors: {name: float32 array, or uint16 array of bfloat16 bits}, written by the safetensors package."""
    from safetensors import TensorSpec, serialize_file

    arrays = {name: np.ascontiguousarray(t) for name, t in tensors.items()}  # alive until written
    specs = {name: TensorSpec(dtype="float32" if a.dtype == np.float32 else "bfloat16", shape=list(a.shape),
                              data_ptr=a.ctypes.data, data_len=a.nbytes)
             for name, a in arrays.items()}
    with replaced_atomically(path) as tmp:
        serialize_file(specs, tmp, metadata={"format": "pt"})  # "pt": what transformers' loader expects
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # the package creates it private; a model folder is for sharing


def export(model_path, out_dir):
    shape, version, tensors = read_llmc(model_path)
    for (name, _, _), t in zip(PARAMETERS, tensors):
        check_finite(model_path, name, t)
    out = {}
    for (name, template, transposed), t in zip(PARAMETERS, tensors):
        if name == "wte":
            t = t[:shape.vocab_size]  # the padded rows never reach the logits
        per_layer = t if "{l}" in template else [t]
        for hf_name, value in zip(hf_names(template, shape.num_layers), per_layer):
            out[HF_PREFIX + hf_name] = value.T if transposed else value
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), out)
    config = json.dumps(hf_config(shape, version), indent=2) + "\n"
    write_atomically(os.path.join(out_dir, "config.json"), config.encode())
    print(f"{TOOL}: exported {model_path} ({describe(shape, version)}) to {out_dir}")


def describe(shape, version):
    return (f"L={shape.num_layers} C={shape.channels} NH={shape.num_heads} V={shape.vocab_size} "
            f"Vp={shape.padded_vocab_size} maxT={shape.max_seq_len}, {'fp32' if version == VERSION_FP32 else 'bf16'}")


def read_config(hf_dir):
    """The llm.c shape of a GPT-2 config.json, refusing what train_gpt's model does not compute."""
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        fail(f"{path}: missing (not a Hugging Face model folder)")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        fail(f"{path}: not JSON ({e})")
    if not isinstance(config, dict):
        fail(f"{path}: not a JSON object")
    if config.get("model_type", "gpt2") != "gpt2":
        fail(f"{path}: model_type '{config['model_type']}' is not gpt2")
    sizes = {}
    for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            fail(f"{path}: {key} is {json.dumps(value)}, not a positive integer")
        sizes[key] = value
    C = sizes["n_embd"]
    # (field, value train_gpt computes, default when absent: transformers' GPT2Config's)
    fixed = [("activation_function", ("gelu_new", "gelu_pytorch_tanh"), "gelu_new"),  # both: GELU, tanh form
             ("n_inner", (None, 4 * C), None),
             ("tie_word_embeddings", (True,), True),
             ("scale_attn_weights", (True,), True),
             ("scale_attn_by_inverse_layer_idx", (False,), False),
             ("add_cross_attention", (False,), False)]
    for key, accepted, default in fixed:
        value = config.get(key, default)
        if not any(value == a and type(value) is type(a) for a in accepted):  # type: true is not 1
            fail(f"{path}: unsupported {key} {json.dumps(value)} (train_gpt's GPT-2 has "
                 f"{' or '.join(json.dumps(a) for a in accepted)})")
    eps = config.get("layer_norm_epsilon", 1e-5)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or abs(eps - 1e-5) > 1e-12:
        fail(f"{path}: unsupported layer_norm_epsilon {json.dumps(eps)} (train_gpt's LayerNorm uses 1e-05)")
    shape = Shape(max_seq_len=sizes["n_positions"], vocab_size=sizes["vocab_size"],
                  padded_vocab_size=pad_vocab(sizes["vocab_size"]), num_layers=sizes["n_layer"],
                  num_heads=sizes["n_head"], channels=C)
    if problem := shape_problem(shape):
        fail(f"{path}: {problem}")
    return shape


def read_hf_tensors(hf_dir):
    """{name without the 'transformer.' prefix: (safetensors dtype, array, file)}; bfloat16 as uint16 bits."""
    from safetensors import safe_open

    single = os.path.join(hf_dir, "model.safetensors")
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.isfile(single):
        files = [single]
    elif os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            files = sorted({os.path.join(hf_dir, shard) for shard in weight_map.values()})
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            fail(f"{index}: not a safetensors index (no weight_map of file names: {e})")
    else:
        fail(f"{hf_dir}: no model.safetensors or model.safetensors.index.json (only the safetensors format is read)")
    tensors = {}
    for path in files:
        if not os.path.isfile(path):
            fail(f"{path}: missing (named by {index})")
        try:
            with safe_open(path, framework="numpy") as f:
                for key in f.keys():
                    name = key[len(HF_PREFIX):] if key.startswith(HF_PREFIX) else key
                    if name in tensors:
                        fail(f"{path}: tensor {name} appears twice (with and without '{HF_PREFIX}', or in two shards)")
                    dtype = f.get_slice(key).get_dtype()
                    if dtype == "BF16":  # the package cannot make a numpy array of it: read its bytes
                        array = _read_raw_bf16(path, key)
                    elif dtype in ("F32", "F16"):
                        array = f.get_tensor(key)
                    else:
                        array = None  # only a parameter's dtype matters (checked when used)
                    tensors[name] = (dtype, array, path)
        except ConvertError:
            raise
        except Exception as e:  # the package's SafetensorError and friends: a file it cannot read
            fail(f"{path}: not a readable safetensors file ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
    return tensors


def _read_raw_bf16(path, key):
    """A bfloat16 tensor's bits as uint16, located by the file's header (validated by safe_open before):
    an 8-byte little-endian header length, the JSON header, then the data its offsets index."""
    with open(path, "rb") as f:
        header_bytes = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_bytes))
    begin, end = header[key]["data_offsets"]
    bits = np.fromfile(path, dtype="<u2", count=(end - begin) // 2, offset=8 + header_bytes + begin)
    return bits.reshape(header[key]["shape"])


def as_precision(dtype, array, version):
    """A float32/float16/bfloat16-bits array in the llm.c file's precision."""
    if version == VERSION_BF16:
        return array if dtype == "BF16" else f32_to_bf16(array.astype(np.float32))
    return bf16_to_f32(array) if dtype == "BF16" else array.astype(np.float32)


def import_(hf_dir, out_path, dtype_flag):
    shape = read_config(hf_dir)
    tensors = read_hf_tensors(hf_dir)
    L, C, V = shape.num_layers, shape.channels, shape.vocab_size
    expected = {}  # Hugging Face name -> its Hugging Face shape
    for (name, template, transposed), s in zip(PARAMETERS, parameter_shapes(shape)):
        hf_shape = s[1:] if "{l}" in template else s
        if name == "wte":
            hf_shape = (V, C)
        for hf_name in hf_names(template, L):
            expected[hf_name] = tuple(reversed(hf_shape)) if transposed else tuple(hf_shape)
    for name, (dtype, array, path) in tensors.items():
        if name in expected:
            if dtype not in ("F32", "F16", "BF16"):
                fail(f"{path}: tensor {name} has dtype {dtype}, not F32, F16 or BF16")
            if tuple(array.shape) != expected[name]:
                fail(f"{path}: tensor {name} has shape {list(array.shape)}, config.json implies {list(expected[name])}")
            check_finite(path, name, array)
        elif name == "lm_head.weight":
            continue  # checked against wte below
        elif not name.endswith(IGNORED_SUFFIXES) or not name.startswith("h."):
            fail(f"{path}: unexpected tensor {name} (not a GPT2LMHeadModel parameter)")
    for name in expected:
        if name not in tensors:
            fail(f"{hf_dir}: missing tensor {name} (searched with and without the '{HF_PREFIX}' prefix)")
    dtypes = {tensors[name][0] for name in expected}
    if dtype_flag is None:
        version = VERSION_BF16 if dtypes == {"BF16"} else VERSION_FP32
    else:
        version = VERSION_BF16 if dtype_flag == "bf16" else VERSION_FP32
    if "lm_head.weight" in tensors:  # a separate head is fine only as a copy of wte (tied)
        dtype, head, path = tensors["lm_head.weight"]
        wte_dtype, wte, _ = tensors["wte.weight"]
        if dtype not in ("F32", "F16", "BF16") or head.shape != wte.shape or not np.array_equal(
                as_precision(dtype, head, VERSION_FP32), as_precision(wte_dtype, wte, VERSION_FP32)):
            fail(f"{path}: lm_head.weight differs from wte.weight (an untied head; train_gpt ties them)")
    out = []
    for (name, template, transposed), s in zip(PARAMETERS, parameter_shapes(shape)):
        parts = []
        for hf_name in hf_names(template, L):
            dtype, array, _ = tensors[hf_name]
            value = as_precision(dtype, array, version)
            if version == VERSION_BF16 and dtype != "BF16":
                check_finite(f"{tensors[hf_name][2]} (rounded to bf16)", hf_name, value)  # beyond bf16's range
            parts.append(value.T if transposed else value)
        value = np.stack(parts) if "{l}" in template else parts[0]
        if name == "wte":  # zero rows up to the padded vocabulary, as train_gpt keeps them
            value = np.concatenate([value, np.zeros((shape.padded_vocab_size - V, C), dtype=value.dtype)])
        assert value.shape == s, (name, value.shape, s)
        out.append(value)
    write_llmc(out_path, shape, version, out)
    print(f"{TOOL}: imported {hf_dir} ({describe(shape, version)}, from {'/'.join(sorted(dtypes))}) to {out_path}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog=TOOL, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    e = commands.add_parser("export", help="llm.c model file -> Hugging Face GPT-2 folder")
    e.add_argument("model", metavar="MODEL.bin")
    e.add_argument("out_dir", metavar="OUT_DIR")
    i = commands.add_parser("import", help="Hugging Face GPT-2 folder -> llm.c model file")
    i.add_argument("hf_dir", metavar="HF_DIR")
    i.add_argument("out", metavar="OUT.bin")
    i.add_argument("--dtype", choices=("fp32", "bf16"), default=None,
                   help="the llm.c file's precision (default: bf16 when every tensor is bfloat16, else fp32)")
    args = parser.parse_args(argv)
    try:
        if args.command == "export":
            export(args.model, args.out_dir)
        else:
            import_(args.hf_dir, args.out, args.dtype)
    except ConvertError as error:
        print(f"{TOOL}: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # unreadable or unwritable paths, a full disk
        print(f"{TOOL}: {error.filename or ''}: {error.strerror or error}".replace("\n", " "), file=sys.stderr)
        return 1
    except ImportError as error:
        print(f"{TOOL}: {error} (install it: python3 -m pip install safetensors numpy)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
