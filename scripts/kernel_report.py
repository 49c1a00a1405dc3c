#!/usr/bin/env python3
"""Static report of every kernel of the sm_90 build of train_gpt (`make kernel-report`).

Per kernel: registers per thread, spill stores/loads and static shared memory (ptxas -v's log of
the build; `cuobjdump -res-usage` of the binary where cuobjdump exists, which then takes
precedence for registers and shared memory), the block size and dynamic shared memory it is
launched with (from recorded d12 steps, one per attention kind: `roofline --launches-json`,
i.e. the model's real launches), and the theoretical occupancy on an H100 computed from those. Exits non-zero on any
register spill, on a launch that cannot fit on an SM, and when the tensor-core attention kernels
(kernels/attention_tc.cuh, once train_gpt.cu includes it) have no `mma.sync` in their PTX.

    scripts/kernel_report.py --ptxas-log build/gpu/train_gpt.ptxas.log --binary build/gpu/train_gpt \\
        --launches build/gpu/launches_tc.json build/gpu/launches_simt.json [--ptx build/gpu/train_gpt_sm90.ptx] [--arch sm_90]

Occupancy (CUDA Occupancy Calculator rules, compute capability 9.0): 64 warps, 32 blocks, 65536
registers (4 sub-partitions of 16384) and 228 KB of shared memory per SM; registers are allocated
per warp in units of 256; each block reserves 1 KB of shared memory; shared memory is allocated in
128-byte units and a block may use at most 227 KB. The carveout is assumed at its maximum.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

H100 = {
    "warps_per_sm": 64, "blocks_per_sm": 32, "regs_per_sm": 65536, "sub_partitions": 4,
    "reg_unit_per_warp": 256, "smem_per_sm": 228 * 1024, "smem_per_block_max": 227 * 1024,
    "smem_reserved_per_block": 1024, "smem_unit": 128,
}


def demangle(names):
    """Mangled -> readable names, in one c++filt (or cu++filt) call."""
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines()))


def short_name(demangled):
    """'void attention_forward_kernel<64>(__nv_bfloat16*, ...)' -> 'attention_forward_kernel<64>':
    the spelling of the launch recorder (kernel_name<K>() in kernels/cuda_common.h)."""
    depth, end = 0, len(demangled)
    for i, ch in enumerate(demangled):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            end = i
            break
    name = demangled[:end].strip()
    return name[5:] if name.startswith("void ") else name


def parse_ptxas_log(path, arch):
    """{mangled: {regs, spill_stores, spill_loads, smem}} for the entries compiled for `arch`."""
    kernels, current = {}, None
    entry = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
    for line in open(path, errors="replace"):
        m = entry.search(line)
        if m:
            current = m.group(1) if m.group(2) == arch else None
            if current:
                kernels[current] = {"regs": 0, "spill_stores": 0, "spill_loads": 0, "smem": 0}
            continue
        if not current:
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            kernels[current]["spill_stores"], kernels[current]["spill_loads"] = int(m.group(1)), int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            kernels[current]["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            kernels[current]["smem"] = int(s.group(1)) if s else 0
    return kernels


def parse_cuobjdump(binary, arch):
    """{mangled: {regs, smem}} from `cuobjdump -res-usage` for `arch`; {} without cuobjdump."""
    tool = shutil.which("cuobjdump") or (os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump"))
    if not os.path.exists(tool) or not os.path.exists(binary):
        return {}
    text = subprocess.run([tool, "-res-usage", binary], capture_output=True, text=True).stdout
    out, in_arch, function = {}, False, None
    for line in text.splitlines():
        m = re.search(r"arch = (\w+)", line)
        if m:
            in_arch = m.group(1) == arch
            continue
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            function = m.group(1) if in_arch else None
            continue
        m = re.search(r"REG:(\d+).*SHARED:(\d+)", line)
        if m and function:
            out[function] = {"regs": int(m.group(1)), "smem": int(m.group(2))}
            function = None
    return out


def occupancy(threads, regs, static_smem, dynamic_smem):
    """(blocks per SM, occupancy fraction, limiter), or (0, 0, reason) when the launch cannot fit."""
    h = H100
    warps = -(-threads // 32)
    smem = static_smem + dynamic_smem
    if smem > h["smem_per_block_max"]:
        return 0, 0.0, f"shared memory {smem} B > 227 KB"
    regs_per_warp = -(-regs * 32 // h["reg_unit_per_warp"]) * h["reg_unit_per_warp"]
    warps_by_regs = h["sub_partitions"] * ((h["regs_per_sm"] // h["sub_partitions"]) // regs_per_warp) if regs else h["warps_per_sm"]
    smem_per_block = -(-(smem + h["smem_reserved_per_block"]) // h["smem_unit"]) * h["smem_unit"]
    limits = {
        "blocks": h["blocks_per_sm"],
        "warps": h["warps_per_sm"] // warps,
        "registers": warps_by_regs // warps,
        "shared memory": h["smem_per_sm"] // smem_per_block,
    }
    limiter = min(limits, key=lambda k: limits[k])
    blocks = limits[limiter]
    if blocks == 0:
        return 0, 0.0, f"{limiter}: none fits"
    return blocks, blocks * warps / h["warps_per_sm"], limiter


def ptx_functions(ptx_path):
    """{mangled name: body text} of every .entry and .func in a PTX file."""
    text = open(ptx_path, errors="replace").read()
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"^\s*(?:\.visible\s+|\.weak\s+)*\.(?:entry|func)\s+(?:\([^)]*\)\s*)?(\w+)\s*\(", text, re.M)]
    return {name: text[begin:(starts[i + 1][0] if i + 1 < len(starts) else len(text))] for i, (begin, name) in enumerate(starts)}


def check_tensor_core_ptx(ptx_path, root):
    """Problems with the tensor-core attention kernels' PTX (a list of strings), or a note."""
    header = os.path.join(root, "kernels", "attention_tc.cuh")
    if not os.path.exists(header):
        return [], "note: kernels/attention_tc.cuh does not exist yet: no tensor-core PTX to check"
    if "attention_tc.cuh" not in open(os.path.join(root, "train_gpt.cu")).read():
        return [], "note: train_gpt.cu does not include kernels/attention_tc.cuh yet: no tensor-core PTX to check"
    if not ptx_path or not os.path.exists(ptx_path):
        return ["no PTX file to check the tensor-core attention kernels in (--ptx)"], ""
    wanted = set(re.findall(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\([^)]*\)\s*)?(?:void\s+)?(\w+)\s*\(",
                            open(header).read()))
    functions = ptx_functions(ptx_path)
    names = demangle(list(functions))
    problems, checked = [], []
    for mangled, body in functions.items():
        kernel = short_name(names[mangled]).split("<")[0]
        if kernel not in wanted or ".entry" not in body.split("(", 1)[0]:
            continue
        # mma.sync in the kernel itself or in a device function it calls (.func bodies)
        called = set(re.findall(r"call(?:\.uni)?\s*(?:\([^)]*\),\s*)?(\w+)", body))
        found = "mma.sync" in body or any("mma.sync" in functions.get(c, "") for c in called)
        checked.append(short_name(names[mangled]))
        if not found:
            problems.append(f"{short_name(names[mangled])}: no mma.sync in its PTX")
    if not checked:
        return [f"none of the kernels of attention_tc.cuh ({', '.join(sorted(wanted))}) is in {ptx_path}"], ""
    return problems, f"tensor-core PTX: mma.sync in {len(checked) - len(problems)} of {len(checked)} attention_tc kernel(s)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ptxas-log", required=True)
    parser.add_argument("--binary", default="")
    parser.add_argument("--launches", required=True, nargs="+", help="roofline --launches-json output(s)")
    parser.add_argument("--ptx", default="")
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    kernels = parse_ptxas_log(args.ptxas_log, args.arch)
    if not kernels:
        sys.exit(f"kernel_report: no {args.arch} entries in {args.ptxas_log}")
    resources = parse_cuobjdump(args.binary, args.arch)
    source = "cuobjdump -res-usage" if resources else "ptxas -v (no cuobjdump)"
    names = demangle(list(kernels))
    launches, steps = {}, []
    for path in args.launches:
        recorded = json.load(open(path))
        steps.append(f"{recorded['model']} B={recorded['B']} T={recorded['T']} attention {recorded.get('attention', '?')}")
        for launch in recorded["launches"]:
            same = [l for l in launches.get(launch["name"], [])
                    if l["block"] == launch["block"] and l["dynamic_smem"] == launch["dynamic_smem"]]
            if not same:
                launches.setdefault(launch["name"], []).append(launch)

    print(f"kernels of the {args.arch} build: registers and shared memory from {source}; spills from ptxas -v; "
          f"block sizes from recorded steps ({'; '.join(steps)})")
    header = f"{'kernel':46} {'regs':>4} {'spill st/ld':>11} {'smem':>6} {'block':>9} {'dyn smem':>8} {'blocks/SM':>9} {'occupancy':>9}  limiter"
    print(header)
    problems = []
    for mangled in sorted(kernels, key=lambda m: short_name(names[m])):
        k = dict(kernels[mangled])
        k.update(resources.get(mangled, {}))
        name = short_name(names[mangled])
        spills = f"{k['spill_stores']}/{k['spill_loads']}"
        if k["spill_stores"] or k["spill_loads"]:
            problems.append(f"{name}: {k['spill_stores']} bytes spill stores, {k['spill_loads']} bytes spill loads")
        shown = name if len(name) <= 46 else name[:43] + "..."
        if name not in launches:
            print(f"{shown:46} {k['regs']:4d} {spills:>11} {k['smem']:6d} {'-':>9} {'-':>8} {'-':>9} {'-':>9}  not launched by the recorded steps")
            continue
        for launch in launches[name]:
            threads = launch["block"][0] * launch["block"][1] * launch["block"][2]
            blocks, fraction, limiter = occupancy(threads, k["regs"], k["smem"], launch["dynamic_smem"])
            if blocks == 0:
                problems.append(f"{name}: block of {threads} threads cannot run on an H100 SM ({limiter})")
            block = "x".join(str(b) for b in launch["block"] if b > 1) or "1"
            print(f"{shown:46} {k['regs']:4d} {spills:>11} {k['smem']:6d} {block:>9} {launch['dynamic_smem']:8d} "
                  f"{blocks:9d} {100 * fraction:8.1f}%  {limiter}")
    compiled = {short_name(n) for n in names.values()}
    for name in sorted(set(launches) - compiled):
        print(f"note: {name} was launched by a recorded step but has no {args.arch} entry in {args.ptxas_log}")

    tc_problems, tc_note = check_tensor_core_ptx(args.ptx, root)
    problems += tc_problems
    if tc_note:
        print(tc_note)
    if problems:
        print("kernel report: FAILED", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        sys.exit(1)
    print(f"kernel report: {len(kernels)} kernels, 0 spills")


if __name__ == "__main__":
    main()
