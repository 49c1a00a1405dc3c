#!/usr/bin/env python3
"""Cross-checks our lane -> element maps of mma.m16n8k16 (bf16) and ldmatrix against CuTe's.

Our maps (kernels/tensor_core.cuh, emu/tensor_core.cpp, test/test_kernel_mma.cu) are written from
the PTX ISA's formulas. CuTe (CUTLASS) describes the same instructions as layouts from (thread,
value) to an element, independently; this script evaluates CuTe's layouts with pycute and
compares every lane and value. The shapes and strides below are CuTe's published atom layouts
(cute/atom/mma_traits_sm80.hpp: SM80_16x8x16_F32BF16BF16F32_TN; cute/atom/copy_traits_sm75.hpp:
SM75_U32x{1,2,4}_LDSM_N, SM75_U16x8_LDSM_T). CuTe's MMA layouts index the (M, K), (N, K) and
(M, N) matrices column-major; its ldmatrix layouts map to bits of the 8 x 128-bit rows that the
address-giving threads name (row 8 i + r of the reference = row r of matrix i).

Needs pycute: pip install nvidia-cutlass (pure Python; no GPU). Prints mismatches, exits 1 on any.
"""
import sys

from pycute import Layout

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


cute_a = Layout(((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128)))  # (thr, val) -> m + 16 k
cute_b = Layout(((4, 8), (2, 2)), ((16, 1), (8, 64)))          # (thr, val) -> n + 8 k
cute_c = Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))          # (thr, val) -> m + 16 n

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


ldsm_n = {  # dst (thr, val) -> bit; val = bit of the 32-bit register + 32 register-index
    1: Layout((32, 32), (32, 1)),
    2: Layout((32, (32, 2)), (32, (1, 1024))),
    4: Layout((32, (32, 4)), (32, (1, 1024))),
}
ldsm_t4 = Layout(((4, 8), (16, 2, 4)), ((256, 16), (1, 128, 1024)))  # val = (bit, half, register)

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
