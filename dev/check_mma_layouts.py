#!/usr/bin/env python3
"""Cross-checks our lane -> element maps of mma.m16n8k16 (bf16), ldmatrix and wgmma (register
fragments and shared-memory atoms) against CuTe's.

Our maps (kernels/tensor_core.cuh, emu/tensor_core.cpp, test/test_kernel_mma.cu) are written from
the PTX ISA's formulas. CuTe (CUTLASS) describes the same instructions as layouts from (thread,
value) to an element, independently. This script reads those layouts from CuTe's own headers as
the nvidia-cutlass package ships them (cute/atom/mma_traits_sm80.hpp: SM80_16x8x16_F32BF16BF16F32_TN;
cute/atom/copy_traits_sm75.hpp: SM75_U32x{1,2,4}_LDSM_N, SM75_U16x8_LDSM_T), evaluates them with
pycute and compares every lane and value; for wgmma, cute/atom/mma_traits_sm90_gmma.hpp's
CLayout_64xN, ALayout_64x16 and Layout_{K,MN}_{INTER,SW32,SW64,SW128}_Atom_Bits (emu/tensor_core.cpp,
test/test_kernel_wgmma.cu). CuTe's MMA layouts index the (M, K), (N, K) and (M, N) matrices column-major; its ldmatrix layouts map to bits of the 8 x 128-bit rows that the
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

# ---- wgmma.mma_async m64nNk16 (sm_90a): register fragments and shared-memory layouts ----
# Ours (kernels/tensor_core.cuh, emu/tensor_core.cpp, test/test_kernel_wgmma.cu): warp w = thread / 32
# of the warpgroup holds rows 16 w.. of D and (register form) of A, in the mma.m16n8k16 C and A
# layouts: d[4 j + i] is C element i of columns 8 j.., a[r] holds A register r. CuTe: CLayout_64xN and
# ALayout_64x16 of cute/atom/mma_traits_sm90_gmma.hpp, (thread, value) -> m + 64 n (or + 64 k).

GMMA_HEADER = "mma_traits_sm90_gmma.hpp"
gmma_text = open(os.path.join(ATOMS, GMMA_HEADER)).read()


def gmma_alias(name, n=None):
    value = re.search(rf"using {name}\s*=\s*(Layout<.*?>);", gmma_text, re.S).group(1)
    return layout_expression(value.replace("Int<N/8>", str(n // 8)) if n else value)


for n in (64, 128):
    cute_d = gmma_alias("CLayout_64xN", n)
    for thread in range(128):
        w, lane = thread // 32, thread % 32
        for v in range(n // 2):
            row, col = ours_c(lane, v % 4)
            idx = cute_d(thread, v)
            check(f"wgmma m64n{n} D", thread, v, (16 * w + row, 8 * (v // 4) + col), (idx % 64, idx // 64))
cute_wa = gmma_alias("ALayout_64x16")
for thread in range(128):
    w, lane = thread // 32, thread % 32
    for i in range(8):
        row, col = ours_a(lane, i)
        idx = cute_wa(thread, i)
        check("wgmma A (registers)", thread, i, (16 * w + row, col), (idx % 64, idx // 64))


# Shared memory: ours gives the byte of element (mn, k) from the descriptor (emu/tensor_core.cpp's
# operand_address, W = 16-byte chunks of a swizzle row, 1 unswizzled); CuTe's canonical atoms
# (Layout_{K,MN}_{INTER,SW32,SW64,SW128}_Atom_Bits: a swizzle on the byte address over a layout in
# bits of (mn, k) or (k, mn)) place one atom's elements, which ours must place the same way. (Which
# descriptor field steps between atoms is the PTX ISA's, and test_kernel_wgmma checks it on a GPU.)

def ours_smem(w, mn_major, mn, k, leading, stride):
    if w == 1:
        address = (2 * (mn % 8) + stride * (mn // 8) + 16 * (k % 8) + leading * (k // 8)) if mn_major else \
                  (16 * (mn % 8) + stride * (mn // 8) + 2 * (k % 8) + leading * (k // 8))
        return address
    address = (2 * (mn % (8 * w)) + leading * (mn // (8 * w)) + 16 * w * (k % 8) + stride * (k // 8)) if mn_major else \
              (16 * w * (mn % 8) + stride * (mn // 8) + 2 * k)
    return address ^ (((address >> 7) & (w - 1)) << 4)


def cute_atom(name):
    match = re.search(rf"using {name}\s*=\s*ComposedLayout<Swizzle<(\d+),(\d+),(\d+)>,\s*smem_ptr_flag,\s*(Layout<.*?>)>;", gmma_text)
    bits, base, shift = map(int, match.group(1, 2, 3))
    return bits, base, shift, layout_expression(match.group(4))


for kind, w in (("INTER", 1), ("SW32", 2), ("SW64", 4), ("SW128", 8)):
    for major in ("K", "MN"):
        bits, base, shift, layout = cute_atom(f"Layout_{major}_{kind}_Atom_Bits")
        mn_extent, k_extent = (8 * w, 8) if major == "MN" else (8, 8 * w)
        for mn in range(mn_extent):
            for k in range(k_extent):
                # The Bits atoms index bits: (mn bits, k) for MN-major, (mn, k bits) for K-major; bf16 = 16 bits.
                bit = layout(16 * mn, k) if major == "MN" else layout(mn, 16 * k)
                address = bit // 8
                address ^= ((address >> (base + shift)) & ((1 << bits) - 1)) << base
                ours = ours_smem(w, major == "MN", mn, k, 1 << 13, 1 << 14)  # strides past the atom: unused in it
                check(f"wgmma smem {major}-major {kind}", mn, k, ours, address)

print(f"{mismatches} mismatches" if mismatches else
      "mma.m16n8k16 A/B/C, ldmatrix x1/x2/x4/x4.trans, wgmma D/A fragments and shared-memory atoms: all agree with CuTe")
sys.exit(1 if mismatches else 0)
