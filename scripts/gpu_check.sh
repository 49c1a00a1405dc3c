#!/usr/bin/env bash
# The checks that need a GPU, in stages of at most 8 minutes each, every figure written as JSON:
#   scripts/gpu_check.sh [STAGE...]       the stages named, in the order given (default: all, in order)
# Stages:
#   build     train_gpt and the GPU test binaries (nvcc, every core); fails on a register spill
#   test      the suite on the GPU (make test-gpu's CTest file): passed, failed, skipped, by name
#   train     GPT-2 124M (d12) for 20 steps replayed from CUDA graphs, 20 launched kernel by kernel
#             (--cuda-graphs off; the two models must match byte for byte), 20 with --matmul-autotune and
#             20 more taking its picks file (nothing timed; the same model, byte for byte),
#             20 with --attention-backward fused, 20 with --bias-grad epilogue: median tokens/s, MFU
#   profile   --profile-step: every kernel's measured time beside its H100 roofline estimate, and the
#             libraries' time per kernel family at the same shapes (dev/bench/library_baselines.py);
#             the attention rows again with --attention-backward fused, the weight gradients' GEMMs and
#             bias-gradient kernels again with --bias-grad epilogue, the GEMMs again with --matmul-autotune
#             (the train stage's picks where it ran), and a GPT-2 1.5B (d48) step at
#             B=8 (D48_B; none where 0): the 55% target's kernels, then again with the fused backward
#             and the BGRADB epilogue (d48_best: the fused kernel's grid of one block per (b, h));
#             each kernel's time against the first H100 profile (scripts/profile_delta.py); the
#             attention forward's mma.sync and wgmma kernels timed side by side at d12 B and d48 B=16
#             (dev/attention_bench.cu: attention_bench_d12.json, attention_bench_d48.json)
#   sanitize  compute-sanitizer memcheck, racecheck and synccheck over a short training run and the
#             kernel tests
# Each stage writes $GPU_CHECK_OUT/<stage>.json ({"stage", "ok", "seconds", ...figures}) and its logs
# under $GPU_CHECK_LOGS; env.json (the machine, the toolchain, how the build was configured) comes with
# every call. Back on a machine without a GPU, build/cpu/roofline --fit DIR holds the roofline
# (dev/roofline.h) against DIR's train.json and profile.json and prints the constants they fit, and
# each option not yet on by default (fused backward, BGRADB epilogue, autotune) against the default.
# A stage that fails records why in its JSON and the script exits non-zero after the
# stages asked for; a stage past its time limit (STAGE_TIMEOUT) is stopped and recorded as such
# ("timed_out"); run it again to go on (the build continues where make stopped).
#
# Machines without MPI, Debian's -dev packages or a network (the lent H100/H200 nodes: nvcc 13, CMake,
# PyTorch, ncu, compute-sanitizer, NCCL only as the nvidia-nccl-cu13 Python package). Found here, no
# flags needed:
#   - MPI: without mpicxx the build is make MPI=0 (parallel/single_process_mpi.h: one process, one GPU);
#     the multi-rank tests then report themselves skipped.
#   - cxxopts, nlohmann-json, Catch2 (header-only): /usr/include, or else the prefix build/gpu_deps.
#     Prepare it beforehand on a machine with Debian's package archive, in the repository's root:
#       scripts/gpu_deps.sh          # apt-get download + dpkg -x into build/gpu_deps (5.6 MB)
#     and carry build/gpu_deps to the GPU node with the working tree (it is git-ignored).
#   - NCCL: the CUDA toolkit's nccl.h and libnccl when there, else the nvidia.nccl Python package's
#     include/ and lib/ (make NCCL_HOME=...; the binaries find libnccl.so.2 through their rpath).
# MPI=0|1, DEPS_PREFIX=DIR and NCCL_HOME=DIR in the environment override what is found.
#
# Prebuilt binaries (GPU_PREBUILT): a lease's minutes are too few to spend compiling (the test binaries
# take ~15 CPU-minutes of nvcc). scripts/gpu_prebuild.sh builds train_gpt and the GPU test
# binaries here (MPI=0, sm_90 only, stripped) into build/device/gpu-nompi and packs them (8 MB); carry
# build/device_pack, and GPU_PREBUILT=build/device_pack/gpu-nompi.tar.xz (or a folder of binaries)
# unpacks them and makes the build stage check what was carried (every binary's libraries, the ptxas
# logs' spills) instead of running make. The libraries nvcc linked here (libcublasLt.so.13,
# libnccl.so.2) are found there in the toolkit or the nvidia-* Python packages.
# With the device tool: run(carry=["build/gpu_deps"], command="GPU_CHECK_OUT=$OUT scripts/gpu_check.sh build
# test"), then the same carry with "... train profile sanitize". A machine stays warm only briefly
# between calls; on a fresh one the later stages build train_gpt first (the test binaries need the
# build stage again).
#
# Environment:
#   GPU_CHECK_OUT   folder of the JSON files (default out/gpu_check)
#   GPU_CHECK_LOGS  folder of the logs (default out/gpu_check/logs: apart from the JSON, so a folder that
#                   brings back only a few files, like the device tool's $OUT, gets the JSON whole)
#   STAGE_TIMEOUT   seconds a stage may run (default 470: under 8 minutes)
#   B, T            micro-batch and sequence length of train/profile (default 16, 1024; d12 at B=64 needs
#                   about 30 GB)
#   D48_B           micro-batch of the profile stage's d48 step (default 8: 1.5B parameters, ran on one
#                   80 GB H100; 0 skips it)
#   CTEST_ARGS      extra ctest arguments of the test stage (e.g. "-R test_kernel -j 8")
#   SANITIZE_RUNS   the sanitize stage's runs to make, as tool:target words (default all 12: memcheck,
#                   racecheck, synccheck x train, test_kernel_layernorm, test_kernel_attention,
#                   test_kernel_attention_tc)
#   TRAIN_DATA      token-shard glob (default data/shakespeare/train_*.bin, prepared by data/prepare.py
#                   when it can be; else a synthetic shard of random tokens: the timing does not depend
#                   on the tokens)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${GPU_CHECK_OUT:-out/gpu_check}
logs=${GPU_CHECK_LOGS:-out/gpu_check/logs}
stage_timeout=${STAGE_TIMEOUT:-470}
B=${B:-16}
T=${T:-1024}
mkdir -p "$out" "$logs"
all_stages=(build test train profile sanitize)
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=("${all_stages[@]}")
for s in "${stages[@]}"; do
  [[ " ${all_stages[*]} " == *" $s "* ]] || { echo "gpu_check.sh: unknown stage '$s' (stages: ${all_stages[*]})" >&2; exit 2; }
done
nvidia-smi -L >/dev/null 2>&1 || { echo "gpu_check.sh: no GPU (nvidia-smi -L failed)" >&2; exit 1; }

# ---- how to build here --------------------------------------------------------------------------
nvcc_path=$(command -v nvcc || true)
[ -n "$nvcc_path" ] || { echo "gpu_check.sh: nvcc is not on PATH" >&2; exit 1; }
cuda_home=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$nvcc_path")")")}
make_vars=(CUDA_HOME="$cuda_home")
mpi=${MPI:-1}
[ -n "${GPU_PREBUILT:-}" ] && mpi=0  # scripts/gpu_prebuild.sh builds with MPI=0
if [ -z "${MPI:-}" ] && { ! command -v mpicxx >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; }; then
  mpi=0
fi
[ "$mpi" = 0 ] && make_vars+=(MPI=0)
deps_prefix=${DEPS_PREFIX:-}
[ -n "$deps_prefix" ] && make_vars+=(DEPS_PREFIX="$deps_prefix")
missing_headers=()
for h in cxxopts.hpp nlohmann/json.hpp catch2/catch.hpp; do [ -f "/usr/include/$h" ] || missing_headers+=("$h"); done
if [ -z "$deps_prefix" ] && [ ${#missing_headers[@]} -gt 0 ]; then
  if [ -f build/gpu_deps/usr/include/cxxopts.hpp ]; then
    deps_prefix=build/gpu_deps
    make_vars+=(DEPS_PREFIX="$deps_prefix")
  else
    echo "gpu_check.sh: ${missing_headers[*]} not in /usr/include and no build/gpu_deps: run scripts/gpu_deps.sh on a machine with Debian's archive and carry build/gpu_deps" >&2
    exit 1
  fi
fi
nccl_home=${NCCL_HOME:-}
if [ -z "$nccl_home" ] && ! [ -f "$cuda_home/include/nccl.h" ] && ! [ -f /usr/include/nccl.h ]; then
  nccl_home=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
  if [ -z "$nccl_home" ] || ! [ -f "$nccl_home/include/nccl.h" ]; then
    echo "gpu_check.sh: no nccl.h in $cuda_home/include, /usr/include or the nvidia.nccl Python package" >&2
    exit 1
  fi
fi
[ -n "$nccl_home" ] && make_vars+=(NCCL_HOME="$nccl_home")
gpu_dir=build/gpu$([ "$mpi" = 0 ] && echo -nompi)
prebuilt=${GPU_PREBUILT:-}
if [[ "$prebuilt" == *.tar.xz ]]; then  # scripts/gpu_prebuild.sh's pack: build/device/gpu-nompi
  [ -f "$prebuilt" ] || { echo "gpu_check.sh: GPU_PREBUILT=$prebuilt: no such file" >&2; exit 1; }
  mkdir -p build && tar -xJf "$prebuilt" -C build || { echo "gpu_check.sh: GPU_PREBUILT=$prebuilt: cannot unpack" >&2; exit 1; }
  prebuilt=build/device/gpu-nompi
fi
if [ -n "$prebuilt" ]; then
  [ -x "$prebuilt/train_gpt" ] || { echo "gpu_check.sh: GPU_PREBUILT=$prebuilt holds no train_gpt" >&2; exit 1; }
  gpu_dir=${prebuilt%/}
  make_vars+=(BUILD="$(dirname "$gpu_dir")")  # the test stage's CTest file names this folder
fi
# cuBLASLt from the toolkit that compiled the binaries, whatever the loader's default path holds.
export LD_LIBRARY_PATH="$cuda_home/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Prebuilt binaries name libnccl.so.2 and libcublasLt.so.13 without a run path: where the toolkit
# lacks one, the nvidia-* Python packages' lib/ folders hold them.
if [ -n "$prebuilt" ]; then
  for pkg in nccl cublas; do
    lib=$(python3 -c "import nvidia.$pkg as n; print(list(n.__path__)[0] + '/lib')" 2>/dev/null || true)
    [ -n "$lib" ] && [ -d "$lib" ] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$lib"
  done
  export LD_LIBRARY_PATH
fi

# One JSON object from key=value words (a value that parses as JSON stays JSON, else it is a string).
write_json() {
  local file=$1; shift
  python3 - "$file" "$@" <<'PY'
import json, sys
obj = {}
for word in sys.argv[2:]:
    key, _, value = word.partition("=")
    try:
        obj[key] = json.loads(value)
    except ValueError:
        obj[key] = value
json.dump(obj, open(sys.argv[1], "w"), indent=1)
PY
}

write_json "$out/env.json" stage=env \
  gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)" \
  nvcc="$(nvcc --version | tail -1)" cuda_home="$cuda_home" mpi="$([ $mpi = 1 ] && echo true || echo false)" \
  deps_prefix="$deps_prefix" nccl_home="$nccl_home" make_vars="$(printf '%s ' "${make_vars[@]}")" \
  cores="$(nproc)" compute_sanitizer="$(command -v compute-sanitizer || true)" ncu="$(command -v ncu || true)" \
  cpu="$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed "s/^ *//")" \
  prebuilt_commit="$([ -n "$prebuilt" ] && cat "$gpu_dir/COMMIT" 2>/dev/null)" \
  commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)" dirty="$(git status --porcelain 2>/dev/null | grep -qv '^??' && echo true || echo false)"
echo "gpu_check.sh: make ${make_vars[*]}"

# Runs "$@" under the stage's time limit, its output to the log $1 (and the terminal); returns its
# status (124: stopped at the limit). The log is complete when it returns (tee is in the pipeline).
run_logged() {
  local log=$1; shift
  timeout --signal=TERM --kill-after=10 "$stage_timeout" "$@" 2>&1 | tee "$log"
  return "${PIPESTATUS[0]}"
}

# ---- stages -------------------------------------------------------------------------------------
stage_build() {
  local start=$SECONDS rc=0
  if [ -n "$prebuilt" ]; then
    # Carried binaries: every library each one needs is found here, or the stage fails naming it.
    local b missing=()
    for b in "$gpu_dir"/train_gpt "$gpu_dir"/test_* "$gpu_dir"/forward_logits*; do
      [ -x "$b" ] && [[ "$b" != *.* ]] || continue
      ldd "$b" | grep -q "not found" && missing+=("$(basename "$b"): $(ldd "$b" | grep "not found" | awk '{print $1}' | sort -u | tr '\n' ' ')")
    done
    { echo "prebuilt binaries in $gpu_dir; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ldd "$gpu_dir/train_gpt"
      printf '%s\n' "${missing[@]}"; } > "$logs/build.log"
    [ ${#missing[@]} -eq 0 ] || rc=1
  else
    run_logged "$logs/build.log" make --no-print-directory "${make_vars[@]}" train_gpt test-gpu-binaries || rc=$?
  fi
  local spills
  spills=$(cat "$gpu_dir"/*.ptxas.log "$gpu_dir"/train_gpt.ptxas.log 2>/dev/null | grep -cE "[1-9][0-9]* bytes spill (stores|loads)" || true)
  write_json "$out/build.json" stage=build ok="$([ $rc = 0 ] && echo true || echo false)" exit_code=$rc \
    seconds=$((SECONDS - start)) timed_out="$([ $rc = 124 ] && echo true || echo false)" spill_lines="$spills" \
    binaries="$(find "$gpu_dir" -maxdepth 1 -type f -executable \( -name 'test_*' -o -name train_gpt -o -name 'forward_logits*' \) | wc -l)" \
    error_tail="$([ $rc = 0 ] || tail -5 "$logs/build.log")"
  return $rc
}

stage_test() {
  local start=$SECONDS rc=0
  [ -x "$gpu_dir/train_gpt" ] || { write_json "$out/test.json" stage=test ok=false error="no $gpu_dir/train_gpt: run the build stage first"; return 1; }
  make --no-print-directory "${make_vars[@]}" "$gpu_dir/CTestTestfile.cmake" >/dev/null || return 1
  # shellcheck disable=SC2086
  run_logged "$logs/test.log" ctest --test-dir "$gpu_dir" --output-on-failure --timeout 300 ${CTEST_ARGS:-} || rc=$?
  python3 - "$logs/test.log" "$out/test.json" "$rc" "$((SECONDS - start))" <<'PY'
import json, re, sys
log, dest, rc, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
passed, failed, skipped = [], [], []
for line in open(log, errors="replace"):
    m = re.search(r"Test\s+#\d+: (\S+) \.+\s*(\*\*\*)?(Passed|Failed|Not Run|Exception|Timeout|\*\*\*Skipped|Skipped)?", line)
    if not m:
        continue
    name, status = m.group(1), line
    if "Passed" in status:
        passed.append(name)
    elif "Skipped" in status:
        skipped.append(name)
    else:
        failed.append(name)
json.dump({"stage": "test", "ok": rc == 0 and not failed and bool(passed), "exit_code": rc, "seconds": seconds,
           "timed_out": rc == 124, "passed": len(passed), "failed": failed, "skipped": skipped}, open(dest, "w"), indent=1)
PY
  [ $rc = 0 ]
}

# train_gpt for the stages that run it: built when missing (a fresh machine, the build stage not run).
ensure_train_gpt() {
  [ -x "$gpu_dir/train_gpt" ] && return 0
  echo "gpu_check.sh: no $gpu_dir/train_gpt: building it"
  run_logged "$logs/build_train_gpt.log" make --no-print-directory "${make_vars[@]}" train_gpt
}

# Training data: the prepared Shakespeare shards, or a synthetic shard (echoes the glob).
training_data() {
  local train=${TRAIN_DATA:-data/shakespeare/train_*.bin}
  if compgen -G "$train" >/dev/null; then echo "$train"; return; fi
  if [ -z "${TRAIN_DATA:-}" ] && python3 data/prepare.py --out data/shakespeare >"$logs/prepare.log" 2>&1; then
    echo "$train"; return
  fi
  local synthetic=build/gpu_check_data
  if [ -f "$synthetic/train_000000.bin" ]; then echo "$synthetic/train_*.bin"; return; fi  # an earlier stage's
  mkdir -p "$synthetic"
  python3 - "$synthetic" <<'PY'
import random, struct, sys
random.seed(1337)
tokens = []
while len(tokens) < 4_000_000:
    tokens.append(50256)
    tokens.extend(random.randrange(50256) for _ in range(random.randrange(200, 2000)))
with open(f"{sys.argv[1]}/train_000000.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
  echo "$synthetic/train_*.bin"
}

# Median tokens/s, MFU and ms of steps 3-20 of a run's metrics.jsonl (the first steps hold start-up:
# cuBLASLt heuristics, autotuning, clocks), as key=value words for write_json.
median_figures() {
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("step", 0) >= 3 and r.get("tokens_per_second")]
p = sys.argv[2]
if rows:
    mfus = [r["mfu"] for r in rows if r.get("mfu") is not None]
    print(f"{p}tokens_per_s={statistics.median(r['tokens_per_second'] for r in rows):.0f}",
          f"{p}ms_per_step={statistics.median(r['ms'] for r in rows):.2f}",
          f"{p}mfu={statistics.median(mfus) if mfus else 'null'}", f"{p}final_loss={rows[-1].get('loss')}")
PY
}

stage_train() {
  local start=$SECONDS rc=0 rc2=0 rc3=0 rc4=0 rc5=0 rc6=0 same=false picks_same=false again_timed train
  ensure_train_gpt || { write_json "$out/train.json" stage=train ok=false error="train_gpt did not build"; return 1; }
  train=$(training_data)
  local common=(-e d12 -b "$B" -t "$T" -x 20 -l 6e-4 -u 5 -v 0 -s 0 -n 0 -i "$train" --overwrite)
  rm -rf build/gpu_check_runs
  # CUDA graphs (the default) against kernel-by-kernel launches: the speed of each, and the same bits
  # (both write the step-20 model).
  run_logged "$logs/train.log" "$gpu_dir/train_gpt" "${common[@]}" -n 20 -o build/gpu_check_runs/plain || rc=$?
  run_logged "$logs/train_eager.log" "$gpu_dir/train_gpt" "${common[@]}" -n 20 -o build/gpu_check_runs/eager \
    --cuda-graphs off || rc3=$?
  cmp -s build/gpu_check_runs/plain/model_00000020.bin build/gpu_check_runs/eager/model_00000020.bin && same=true
  # --matmul-autotune times each shape's candidates and keeps its picks in -o's matmul_algos.json; a second
  # run that takes that file must time nothing and write the same step-20 model (host/matmul_algos.h: the
  # algorithms restored from their 64 bytes on real cuBLASLt).
  run_logged "$logs/train_autotune.log" "$gpu_dir/train_gpt" "${common[@]}" -n 20 -o build/gpu_check_runs/autotune \
    --matmul-autotune || rc2=$?
  run_logged "$logs/train_autotune_again.log" "$gpu_dir/train_gpt" "${common[@]}" -n 20 -o build/gpu_check_runs/autotune_again \
    --matmul-autotune --matmul-algos build/gpu_check_runs/autotune/matmul_algos.json || rc6=$?
  cmp -s build/gpu_check_runs/autotune/model_00000020.bin build/gpu_check_runs/autotune_again/model_00000020.bin &&
    picks_same=true
  again_timed=$(sed -n 's/^matmul autotune: \([0-9]*\) GEMM shapes timed.*/\1/p' "$logs/train_autotune_again.log" | head -1)
  # The fused attention backward (5 products per tile pair against the split kernels' 7): the default
  # once this measures it faster.
  run_logged "$logs/train_fused_backward.log" "$gpu_dir/train_gpt" "${common[@]}" -o build/gpu_check_runs/fused_backward \
    --attention-backward fused || rc4=$?
  # The qkv and fc bias gradients summed by BGRADB in BF16 (--bias-grad epilogue) instead of our column-sum
  # kernels: the default once this measures it faster and its final loss matches the default run's.
  run_logged "$logs/train_bias_grad_epilogue.log" "$gpu_dir/train_gpt" "${common[@]}" -o build/gpu_check_runs/bias_grad_epilogue \
    --bias-grad epilogue || rc5=$?
  # shellcheck disable=SC2046
  write_json "$out/train.json" stage=train \
    ok="$([ $rc = 0 ] && [ $rc2 = 0 ] && [ $rc3 = 0 ] && [ $rc4 = 0 ] && [ $rc5 = 0 ] && [ $rc6 = 0 ] && $same && $picks_same &&
          [ "$again_timed" = 0 ] && echo true || echo false)" \
    exit_code=$rc autotune_exit_code=$rc2 eager_exit_code=$rc3 fused_backward_exit_code=$rc4 \
    bias_grad_epilogue_exit_code=$rc5 autotune_again_exit_code=$rc6 graphs_model_equals_eager=$same \
    autotune_picks_model_equal=$picks_same autotune_again_shapes_timed="${again_timed:-null}" \
    seconds=$((SECONDS - start)) B="$B" T="$T" data="$train" \
    $(median_figures build/gpu_check_runs/plain/metrics.jsonl "" 2>/dev/null) \
    $(median_figures build/gpu_check_runs/eager/metrics.jsonl eager_ 2>/dev/null) \
    $(median_figures build/gpu_check_runs/autotune/metrics.jsonl autotune_ 2>/dev/null) \
    $(median_figures build/gpu_check_runs/autotune_again/metrics.jsonl autotune_again_ 2>/dev/null) \
    $(median_figures build/gpu_check_runs/fused_backward/metrics.jsonl fused_backward_ 2>/dev/null) \
    $(median_figures build/gpu_check_runs/bias_grad_epilogue/metrics.jsonl bias_grad_epilogue_ 2>/dev/null)
  [ $rc = 0 ] && [ $rc2 = 0 ] && [ $rc3 = 0 ] && [ $rc4 = 0 ] && [ $rc5 = 0 ] && [ $rc6 = 0 ] && $same && $picks_same &&
    [ "$again_timed" = 0 ]
}

stage_profile() {
  local start=$SECONDS rc=0 fused_rc=0 epilogue_rc=0 autotune_rc=0 d48_rc=0 d48_best_rc=0 lib_rc=0 train d48_b=${D48_B:-8}
  ensure_train_gpt || { write_json "$out/profile.json" stage=profile ok=false error="train_gpt did not build"; return 1; }
  train=$(training_data)
  run_logged "$logs/profile.log" "$gpu_dir/train_gpt" -e d12 -b "$B" -t "$T" -v 0 -s 0 -i "$train" --profile-step || rc=$?
  run_logged "$logs/profile_fused_backward.log" "$gpu_dir/train_gpt" -e d12 -b "$B" -t "$T" -v 0 -s 0 -i "$train" \
    --profile-step --attention-backward fused || fused_rc=$?
  run_logged "$logs/profile_bias_grad_epilogue.log" "$gpu_dir/train_gpt" -e d12 -b "$B" -t "$T" -v 0 -s 0 -i "$train" \
    --profile-step --bias-grad epilogue || epilogue_rc=$?
  # The GEMMs with autotune's picks (the train stage's file when it ran at this B and T; else timed here):
  # which shapes gain what autotune measured over the whole step.
  local picks=()
  [ -f build/gpu_check_runs/autotune/matmul_algos.json ] && picks=(--matmul-algos build/gpu_check_runs/autotune/matmul_algos.json)
  run_logged "$logs/profile_autotune.log" "$gpu_dir/train_gpt" -e d12 -b "$B" -t "$T" -v 0 -s 0 -i "$train" \
    --profile-step --matmul-autotune ${picks[@]+"${picks[@]}"} || autotune_rc=$?
  # GPT-2 1.5B: no profile of it exists yet (the first GPU run timed its steps only, 189-197 ms at B=8).
  rm -f "$logs/profile_d48.log" "$logs/profile_d48_best.log"
  if [ "$d48_b" != 0 ]; then
    run_logged "$logs/profile_d48.log" "$gpu_dir/train_gpt" -e d48 -b "$d48_b" -t "$T" -v 0 -s 0 -i "$train" --profile-step ||
      d48_rc=$?
    # The 55% target's best configuration: the fused backward's grid at d48 (one block per (b, h): 200 at
    # B=8, 2 waves of 132 for the work of 1.52), which dev/roofline.h charges its whole waves.
    run_logged "$logs/profile_d48_best.log" "$gpu_dir/train_gpt" -e d48 -b "$d48_b" -t "$T" -v 0 -s 0 -i "$train" \
      --profile-step --attention-backward fused --bias-grad epilogue || d48_best_rc=$?
  fi
  # The libraries' time per kernel family at the same shapes (PyTorch: cuBLAS, FlashAttention/cuDNN, ...).
  rm -f "$logs/library.json"
  run_logged "$logs/library.log" python3 dev/bench/library_baselines.py -e d12 -b "$B" -t "$T" --json "$logs/library.json" ||
    lib_rc=$?
  # The attention forward's mma.sync and wgmma kernels on the same inputs (dev/attention_bench.cu): each
  # one's time and TFLOP/s on FlashAttention's count, and their agreement (exit 1 past bf16 rounding), as
  # attention_bench_d12.json and _d48.json. Their exit codes go to attention_bench.json and do not fail the
  # stage: the wgmma kernel has not run on a GPU before, and the step's profile stands without it.
  local bench_rc=0 bench_d48_rc=0
  rm -f "$out/attention_bench_d12.json" "$out/attention_bench_d48.json"
  run_logged "$logs/attention_bench.log" "$gpu_dir/attention_bench" -e d12 -b "$B" -t "$T" \
    --json "$out/attention_bench_d12.json" || bench_rc=$?
  run_logged "$logs/attention_bench_d48.log" "$gpu_dir/attention_bench" -e d48 -b 16 -t "$T" \
    --json "$out/attention_bench_d48.json" || bench_d48_rc=$?
  write_json "$out/attention_bench.json" stage=profile exit_code_d12=$bench_rc exit_code_d48=$bench_d48_rc \
    log_d12="$(tail -5 "$logs/attention_bench.log" 2>/dev/null)" log_d48="$(tail -5 "$logs/attention_bench_d48.log" 2>/dev/null)"
  python3 - "$logs/profile.log" "$out/profile.json" "$rc" "$((SECONDS - start))" "$B" "$T" "$logs/library.json" "$lib_rc" \
    "$logs/profile_fused_backward.log" "$fused_rc" "$logs/profile_bias_grad_epilogue.log" "$epilogue_rc" \
    "$logs/profile_d48.log" "$d48_rc" "$d48_b" "$logs/profile_autotune.log" "$autotune_rc" \
    "$logs/profile_d48_best.log" "$d48_best_rc" <<'PY'
import json, os, sys
(log, dest, rc, seconds, b, t, library, lib_rc, fused_log, fused_rc, epilogue_log, epilogue_rc, d48_log, d48_rc,
 d48_b, autotune_log, autotune_rc, d48_best_log, d48_best_rc) = sys.argv[1:20]
rc, lib_rc, fused_rc, epilogue_rc, d48_rc, d48_b = int(rc), int(lib_rc), int(fused_rc), int(epilogue_rc), int(d48_rc), int(d48_b)
autotune_rc, d48_best_rc = int(autotune_rc), int(d48_best_rc)
def read_lines(path):  # a log's lines; none where the run left no log
    return [l.rstrip("\n") for l in open(path, errors="replace")] if os.path.exists(path) else []
STEP_LINES = ("measured", "H100 SXM roofline estimate")
lines = read_lines(log)
summary = [l for l in lines if l.startswith(STEP_LINES)]
host = [l for l in lines if l.startswith("host: ")]  # the batch uploads' host time, before the device starts
fused_rows = [l for l in read_lines(fused_log) if l.startswith(("attention",) + STEP_LINES)]
epilogue_rows = [l for l in read_lines(epilogue_log)
                 if l.startswith(("matmul_backward_dweight", "matmul_detail::bias_grad") + STEP_LINES)]
autotune_rows = [l for l in read_lines(autotune_log) if l.startswith(("matmul_", "matmul autotune:") + STEP_LINES)]
d48 = read_lines(d48_log)
d48_summary = [l for l in d48 if l.startswith(STEP_LINES)]
d48_best = read_lines(d48_best_log)
lib = json.load(open(library)) if lib_rc == 0 and os.path.exists(library) else {"exit_code": lib_rc}
json.dump({"stage": "profile",
           "ok": rc == 0 and len(summary) == 2 and lib_rc == 0 and fused_rc == 0 and epilogue_rc == 0 and d48_rc == 0
                 and autotune_rc == 0 and d48_best_rc == 0,
           "exit_code": rc, "seconds": int(seconds), "B": int(b), "T": int(t), "summary": summary, "host": host, "library": lib,
           "fused_backward": {"exit_code": fused_rc, "rows": fused_rows},
           "bias_grad_epilogue": {"exit_code": epilogue_rc, "rows": epilogue_rows},
           "autotune": {"exit_code": autotune_rc, "rows": autotune_rows},
           "d48": {"exit_code": d48_rc, "B": d48_b, "summary": d48_summary, "report": d48[-200:]} if d48_b else None,
           "d48_best": {"exit_code": d48_best_rc, "B": d48_b, "summary": [l for l in d48_best if l.startswith(STEP_LINES)],
                        "report": d48_best[-200:]} if d48_b else None,
           "report": lines[-200:]},
          open(dest, "w"), indent=1)
PY
  # Each kernel's measured time against the first H100 profile (2026-11-27): profile_delta.json, and
  # the table in the logs. A comparison that fails does not fail the stage: the profile is the figure.
  if [ $rc = 0 ] && [ -f docs/gpu_check_2026-11-27_h100/profile.json ]; then
    python3 scripts/profile_delta.py docs/gpu_check_2026-11-27_h100/profile.json "$out/profile.json" \
      --json "$out/profile_delta.json" > "$logs/profile_delta.txt" 2>&1 || true
  fi
  [ $rc = 0 ] && [ $lib_rc = 0 ] && [ $fused_rc = 0 ] && [ $epilogue_rc = 0 ] && [ $d48_rc = 0 ] && [ $autotune_rc = 0 ] &&
    [ $d48_best_rc = 0 ]
}

stage_sanitize() {
  local start=$SECONDS train results=() ok=true
  command -v compute-sanitizer >/dev/null || { write_json "$out/sanitize.json" stage=sanitize ok=false error="no compute-sanitizer"; return 1; }
  ensure_train_gpt || { write_json "$out/sanitize.json" stage=sanitize ok=false error="train_gpt did not build"; return 1; }
  train=$(training_data)
  # A short run of the small preset (sanitizers slow kernels 10-100x), then kernel tests.
  local run=("$gpu_dir/train_gpt" -e tiny -b 2 -t 64 -x 2 -v 0 -s 0 -n 0 -i "$train")
  local targets=("train:${run[*]}")
  for t in "$gpu_dir"/test_kernel_layernorm "$gpu_dir"/test_kernel_attention "$gpu_dir"/test_kernel_attention_tc; do
    [ -x "$t" ] && targets+=("$(basename "$t"):$t")
  done
  # Each run its share of the stage's time; SANITIZE_RUNS="tool:target ..." (e.g. "racecheck:train")
  # picks some of them.
  local runs=()
  for tool in memcheck racecheck synccheck; do
    for target in "${targets[@]}"; do
      [ -z "${SANITIZE_RUNS:-}" ] || [[ " $SANITIZE_RUNS " == *" $tool:${target%%:*} "* ]] && runs+=("$tool:$target")
    done
  done
  [ ${#runs[@]} -gt 0 ] || { write_json "$out/sanitize.json" stage=sanitize ok=false error="no run matches SANITIZE_RUNS=$SANITIZE_RUNS"; return 1; }
  for run_spec in "${runs[@]}"; do
      local tool=${run_spec%%:*} target=${run_spec#*:}
      local name=${target%%:*} cmd=${target#*:} rc=0 t0=$SECONDS
      # API errors unreported: NCCL's start-up probes kernel images and gets cudaErrorNoKernelImageForDevice,
      # which memcheck counted as 8 errors on an H100 (2026-11-27); every CUDA call of ours is checked
      # and ends the run with a message, so the run's exit code reports ours.
      # shellcheck disable=SC2086
      timeout --kill-after=10 $((stage_timeout / ${#runs[@]})) compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 99 $cmd \
        > "$logs/sanitize_${tool}_$name.log" 2>&1 || rc=$?
      local summary library_only=false
      summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$logs/sanitize_${tool}_$name.log" | tail -1)
      # Reports inside the libraries' own kernels (cuBLAS's nvjet/xmma/cutlass, NCCL's) are theirs: on an
      # H100, racecheck reported 464 hazards in cuBLAS 13's nvjet split-K kernel (2026-11-27). A run whose
      # every report names such a kernel is recorded as library_only and does not fail the stage.
      if [ $rc = 99 ] && grep -q "^========= Error: " "$logs/sanitize_${tool}_$name.log" &&
         ! grep -E "^========= +(Error: |and )" "$logs/sanitize_${tool}_$name.log" |
           grep -vqE " at (nvjet_|sm[0-9]+_xmma|cutlass|ncclDevKernel|ncclKernel)"; then
        library_only=true
      fi
      results+=("${tool}_${name}={\"exit_code\": $rc, \"seconds\": $((SECONDS - t0)), \"library_only\": $library_only, \"summary\": $(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$summary")}")
      [ $rc = 0 ] || $library_only || ok=false
  done
  write_json "$out/sanitize.json" stage=sanitize ok=$ok seconds=$((SECONDS - start)) "${results[@]}"
  [ $ok = true ]
}

failed=()
for s in "${stages[@]}"; do
  echo "== gpu_check.sh: $s"
  "stage_$s" || failed+=("$s")
done
echo "== gpu_check.sh: JSON in $out: $(cd "$out" && ls ./*.json | tr '\n' ' ')"
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check.sh: failed stages: ${failed[*]}" >&2
  exit 1
fi
