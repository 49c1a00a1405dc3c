#!/usr/bin/env python3
"""Cross-checks our lane -> element maps of mma.m16n8k16 (bf16) and ldmatrix against CuTe's.

Our maps (kernels/tensor_core.cuh, emu/tensor_core.cpp, test/test_kernel_mma.cu) are written from
the PTX ISA's formulas. CuTe (CUTLASS) describes the same instructions as layouts from (thread,
value) to an element, independently. This script reads those layouts from CuTe's own headers as
the nvidia-cutlass package ships them (cute/atom/mma_traits_sm80.hpp: SM80_16x8x16_F32BF16BF16F32_TN;
cute/atom/copy_traits_sm75.hpp: SM75_U32x{1,2,4}_LDSM_N, SM75_U16x8_LDSM_T), evaluates them with
pycute and compares every lane and value. CuTe's MMA layouts index the (M, K), (N, K) and (M, N)
matrices column-major; its ldmatrix layouts map to bits of the 8 x 128-bit rows that the
address-giving threads name (row 8 i + r of the reference = row r of matrix i).

Needs nvidia-cutlass (pure Python, no GPU; dev/requirements.txt, scripts/install_python_deps.sh).
Run by `make test` (CTest: check_mma_layouts). Prints mismatches, exits 1 on any.
"""
import ast
import os
import re
import sys

try:
    import cutlass_library
    from pycute import Layout
except ImportError:
    sys.exit("check_mma_layouts: needs nvidia-cutlass: run scripts/install_python_deps.sh (pins in dev/requirements.txt)")

ATOMS = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include", "cute", "atom")


def layout_expression(text):
    """pycute Layout from CuTe's C++ spelling, e.g. Layout<Shape<_32,_32>,Stride<_32,_1>>."""
    s = re.sub(r"\s+", "", text)
    if not (s.startswith("Layout<") and s.endswith(">")):
        raise ValueError(f"not a CuTe Layout: {text!r}")
    s = re.sub(r"\b_(\d+)\b", r"\1", s[len("Layout<"):-1])
    s = s.replace("Shape<", "(").replace("Stride<", "(").replace(">", ",)")
    shape, stride = ast.literal_eval("(" + s + ")")
    unwrap = lambda t: t[0] if isinstance(t, tuple) and len(t) == 1 else (tuple(map(unwrap, t)) if isinstance(t, tuple) else t)
    return Layout(unwrap(shape), unwrap(stride))


def cute_layout(header, traits, atom, member):
    """The layout `member` (ALayout, DstLayout, ...) of traits<atom> in a CuTe header: followed through
    the traits' base class and through a named alias (using SM80_16x8_Row = Layout<...>;)."""
    text = open(os.path.join(ATOMS, header)).read()
    match = re.search(rf"struct {traits}<{atom}>\s*(:\s*{traits}<(\w+)>\s*)?\{{(.*?)\n\}};", text, re.S)
    if not match:
        raise ValueError(f"{header}: no {traits}<{atom}>")
    found = re.search(rf"using {member}\s*=\s*(.*?);", match.group(3), re.S)
    if not found:
        if not match.group(2):
            raise ValueError(f"{header}: {traits}<{atom}> has no {member}")
        return cute_layout(header, traits, match.group(2), member)
    value = found.group(1).strip()
    if re.fullmatch(r"\w+", value):
        value = re.search(rf"using {value}\s*=\s*(Layout<.*?>);", text, re.S).group(1)
    return layout_expression(value)


mismatches = 0


def check(what, lane, value, ours, cute):
    global mismatches
    if ours != cute:
        mismatches += 1
        print(f"{what}: lane {lane} value {value}: ours {ours}, CuTe {cute}")


# ---- mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA formulas) ----

def ours_a(lane, i):  # a_i -> (row m, col k) of A (16 x 16)
    g, t = lane >> 2, lane % 4
    row = g + (8 if i in (2, 3, 6, 7) else 0)
    col = t * 2 + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def ours_b(lane, i):  # b_i -> (row k, col n) of B (16 x 8)
    g, t = lane >> 2, lane % 4
    return t * 2 + (i & 1) + (8 if i >= 2 else 0), g


def ours_c(lane, i):  # c_i -> (row m, col n) of C (16 x 8)
    g, t = lane >> 2, lane % 4
    return g + (8 if i >= 2 else 0), t * 2 + (i & 1)


MMA = ("mma_traits_sm80.hpp", "MMA_Traits", "SM80_16x8x16_F32BF16BF16F32_TN")
cute_a = cute_layout(*MMA, "ALayout")  # (thr, val) -> m + 16 k
cute_b = cute_layout(*MMA, "BLayout")  # (thr, val) -> n + 8 k
cute_c = cute_layout(*MMA, "CLayout")  # (thr, val) -> m + 16 n

for lane in range(32):
    for i in range(8):
        idx = cute_a(lane, i)
        check("mma A", lane, i, ours_a(lane, i), (idx % 16, idx // 16))
    for i in range(4):
        idx = cute_b(lane, i)
        k, n = ours_b(lane, i)
        check("mma B", lane, i, (n, k), (idx % 8, idx // 8))
        idx = cute_c(lane, i)
        check("mma C", lane, i, ours_c(lane, i), (idx % 16, idx // 16))

# ---- ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.b16 ----
# Ours: register j of lane l holds elements (row g, cols 2t, 2t+1) of matrix j, or with .trans
# (rows 2t, 2t+1, col g), g = l >> 2, t = l % 4. As bits of the reference rows: element e of
# reference row R covers bits 128 R + 16 e .. + 15.

def ours_ldmatrix_bit(lane, reg, half, bit, trans):
    g, t = lane >> 2, lane % 4
    row, col = (2 * t + half, g) if trans else (g, 2 * t + half)
    return 128 * (8 * reg + row) + 16 * col + bit


COPY = ("copy_traits_sm75.hpp", "Copy_Traits")
ldsm_n = {  # dst (thr, val) -> bit; val = bit of the 32-bit register + 32 register-index
    n: cute_layout(*COPY, f"SM75_U32x{n}_LDSM_N", "DstLayout") for n in (1, 2, 4)
}
ldsm_t4 = cute_layout(*COPY, "SM75_U16x8_LDSM_T", "DstLayout")  # val = (bit, half, register)

for count, layout in ldsm_n.items():
    for lane in range(32):
        for reg in range(count):
            for v in range(32):
                cute_bit = layout(lane, v + 32 * reg)
                check(f"ldmatrix x{count}", lane, (reg, v), ours_ldmatrix_bit(lane, reg, v // 16, v % 16, False),
                      cute_bit)
for lane in range(32):
    for reg in range(4):
        for half in range(2):
            for bit in range(16):
                cute_bit = ldsm_t4(lane, bit + 16 * half + 32 * reg)
                check("ldmatrix x4.trans", lane, (reg, half, bit), ours_ldmatrix_bit(lane, reg, half, bit, True),
                      cute_bit)

print(f"{mismatches} mismatches" if mismatches else "mma.m16n8k16 A/B/C and ldmatrix x1/x2/x4/x4.trans: all lanes agree with CuTe")
sys.exit(1 if mismatches else 0)
