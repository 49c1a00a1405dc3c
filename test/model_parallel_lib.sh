# Shared by the shell tests of tensor and pipeline parallelism (source it after setting $dir, the
# scratch directory): running the program with its log kept, refusals, and the checkpoint checks
# (resumed byte for byte on one grid; continued on other grids).

# require_ranks N: $mpirun must start N ranks. A build without MPI cannot (test/no_mpi_launch.sh exits
# 77): the test is reported skipped then, before any of its runs could end it as failed.
require_ranks() {
  local rc=0
  $mpirun -np "$1" true > /dev/null 2>&1 || rc=$?
  [ $rc != 77 ] || { echo "skipped: $1 ranks need MPI, and this build has none (make MPI=0)"; exit 77; }
}

# run NAME COMMAND...: the command's output in $dir/NAME.log; its log and a FAIL line if it fails.
run() { local name=$1; shift; "$@" > "$dir/$name.log" 2>&1 || { cat "$dir/$name.log"; echo "FAIL: $name exited non-zero"; exit 1; }; }

# refuse "what must appear" COMMAND...: the command must fail, saying that (one line, the flags named).
refuse() {
  local want=$1
  shift
  if "$@" > "$dir/refused.log" 2>&1; then cat "$dir/refused.log"; echo "FAIL: accepted: $*"; exit 1; fi
  grep -q -- "$want" "$dir/refused.log" || { cat "$dir/refused.log"; echo "FAIL: '$*' did not say '$want'"; exit 1; }
  echo "refused: $(grep -m1 -- "$want" "$dir/refused.log")"
}

# same_checkpoint LABEL STRAIGHT RESUMED STEP: the two runs' checkpoints at STEP hold the same model
# file byte for byte and the same training state (step, RNG, data position, master weights, moments;
# the run id and times may differ).
same_checkpoint() {
  local label=$1 straight=$2 resumed=$3 step
  step=$(printf "%08d" "$4")
  cmp "$straight/model_$step.bin" "$resumed/model_$step.bin" \
    || { echo "FAIL: $label: the resumed model differs from the uninterrupted run"; exit 1; }
  python3 - "$straight/state_$step.bin" "$resumed/state_$step.bin" "$label" <<'PY'
import struct, sys
def content(path):  # header slots (uint64, host/checkpoint.h): 3 step, 5-11 RNG and loader, 14-17 arrays
    data = open(path, "rb").read()
    slot = struct.unpack_from("<256Q", data)
    return slot[3:12], data[slot[14]:slot[17]]
assert content(sys.argv[1]) == content(sys.argv[2]), \
    f"FAIL: {sys.argv[3]}: the resumed state (step, RNG, data position, master, moments) differs"
PY
}

# continued_like STRAIGHT "RUN:what" ...: each run, resumed from STRAIGHT's step-3 checkpoint on another
# grid, has step 4-6 losses within 1e-3 of STRAIGHT's and a step-6 model file within 2e-2 of scale of
# it (BF16 rounding; a slice or stage written to the wrong place would differ by the parameters' size).
continued_like() {
  python3 - "$dir" "$@" <<'PY'
import json, struct, sys
d, straight_run, runs = sys.argv[1], sys.argv[2], [a.split(":", 1) for a in sys.argv[3:]]
def losses(run):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{d}/{run}/metrics.jsonl")) if "loss" in r}
def params(run):
    data = open(f"{d}/{run}/model_00000006.bin", "rb").read()
    assert struct.unpack_from("<256i", data)[1] == 5, "a BF16 model file"
    raw = struct.unpack_from(f"<{(len(data) - 1024) // 2}H", data, 1024)
    return [struct.unpack("<f", struct.pack("<I", x << 16))[0] for x in raw]
straight, base = losses(straight_run), params(straight_run)
scale = max(abs(x) for x in base)
for run, what in runs:
    resumed = losses(run)
    for step in (4, 5, 6):
        diff = abs(straight[step] - resumed[step])
        print(f"resume {what}, step {step}: loss {resumed[step]:.5f} vs {straight[step]:.5f} (|diff| {diff:.1e})")
        assert diff < 1e-3, f"FAIL: {what}, step {step}: loss differs by {diff}"  # measured <= 2.3e-4 (BF16)
    worst = max(abs(a - b) for a, b in zip(base, params(run))) / scale
    print(f"model file after resuming on {run}: within {worst:.1e} of the straight run's (of scale)")
    assert worst < 2e-2, f"FAIL: {run}: model file differs by {worst} of scale"
PY
}

# losses_follow BASE RUN BOUND "what RUN is": RUN's logged train and validation losses (and its
# samples) against BASE's, step for step, within BOUND relative (NaN fails); both logs in $dir.
# series_follow is the losses' part alone (runs that print no samples).
losses_follow() {
  series_follow "$@"
  local samples
  samples=$(grep -c "^sample" "$dir/$2.log" || true)
  [ "$samples" = "$(grep -c "^sample" "$dir/$1.log" || true)" ] && [ "$samples" -gt 0 ] \
    || { cat "$dir/$2.log"; echo "FAIL: $2 printed $samples samples"; exit 1; }
}
series_follow() {
  python3 - "$dir/$1.log" "$dir/$2.log" "$3" "$4" <<'PY'
import re, sys
base_log, run_log, bound, what_run = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
def series(path, pattern):
    return [float(x) for x in re.findall(pattern, open(path).read())]
for what, pattern in (("train", r"step \d+/\d+ \| loss ([0-9.]+)"), ("val", r"val loss ([0-9.]+)")):
    base, run = series(base_log, pattern), series(run_log, pattern)
    if len(base) == 0 or len(base) != len(run):
        sys.exit(f"FAIL: {what} losses: {len(base)} in {base_log}, {len(run)} in {run_log}")
    worst = max(abs(a - b) / abs(a) for a, b in zip(base, run))
    if not worst < bound:  # also fails on NaN
        sys.exit(f"FAIL: {what} losses differ by {worst:.2e} relative (bound {bound}): {base} vs {run}")
    print(f"{what} losses of {what_run} within {worst:.1e} of the baseline's ({len(base)} values)")
PY
}
