#!/usr/bin/env bash
# Run identity (host/run_identity.h), through the real program: (1) a fresh run in an output dir that
# holds checkpoints refuses to start, naming -y and --overwrite; (2) -y with a changed run-identity
# setting (--seed, -t, --doc-mask, --layers) refuses with one line per setting; (3) --resume-override names it and the
# resume goes on; (4) other changed settings (-l) resume, reported; the run id carries over;
# (5) --overwrite deletes the old checkpoints and starts afresh.
# Usage: test_run_identity.sh TRAIN_BINARY
set -euo pipefail
bin=$1
here=$(dirname "$0")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 "$here/make_shards.py" "$dir" 9 8000
common=(-e tiny -b 2 -t 32 -l 1e-3 -v 0 -s 0 -n 2 -i "$dir/train_*.bin" -j "$dir/val_*.bin" -o "$dir/run")
run_id() { sed -n 's/.*, run \([0-9a-f]\{16\}\).*/\1/p' "$1" | head -1; }

"$bin" "${common[@]}" -x 2 > "$dir/first.log"
first_id=$(run_id "$dir/first.log")
test -n "$first_id" || { echo "no run id in the banner"; cat "$dir/first.log"; exit 1; }

# (1) a fresh run where checkpoints are
"$here/expect_failure.sh" "holds checkpoints \(newest: step 2\): resume them with -y, or delete them with --overwrite" \
    "$bin" "${common[@]}" -x 4
# (2) changed run-identity settings: refused, each named
"$here/expect_failure.sh" "belongs to another run \(run $first_id\)" "$bin" "${common[@]}" -x 4 -y --seed 7 -t 16 --doc-mask
err=$("$bin" "${common[@]}" -x 4 -y --seed 7 -t 16 --doc-mask 2>&1 >/dev/null || true)
grep -q -- "--seed: 1337 in the checkpoint, 7 now" <<<"$err" || { echo "the seed change is not named"; echo "$err"; exit 1; }
grep -q -- "-t/--seq-len: 32 in the checkpoint, 16 now" <<<"$err" || { echo "the T change is not named"; echo "$err"; exit 1; }
grep -q -- "--doc-mask: false in the checkpoint, true now" <<<"$err" || { echo "the --doc-mask change is not named"; echo "$err"; exit 1; }
grep -q "tokens per step (-d, resolved for the ranks): 64 in the checkpoint, 32 now" <<<"$err" ||
    { echo "the tokens-per-step change is not named"; echo "$err"; exit 1; }
# A changed model shape (--layers) is a run-identity change too.
"$here/expect_failure.sh" "^  --layers: 0 in the checkpoint, 3 now" "$bin" "${common[@]}" -x 4 -y --layers 3
test ! -e "$dir/run/model_00000004.bin" || { echo "a refused resume trained"; exit 1; }
# (3) overridden: it resumes; (4) -l changed: reported, allowed; the run id carries over
"$bin" "${common[@]}" -x 4 -y --seed 7 --resume-override seed -l 5e-4 > "$dir/resumed.log"
grep -q "resume: changed since step 2: --seed: 1337 in the checkpoint, 7 now" "$dir/resumed.log" ||
    { echo "the overridden change is not reported"; cat "$dir/resumed.log"; exit 1; }
grep -q "resume: changed since step 2: -l/--learning-rate: 0.001 in the checkpoint, 0.0005 now" "$dir/resumed.log" ||
    { echo "the learning-rate change is not reported"; cat "$dir/resumed.log"; exit 1; }
test "$(run_id "$dir/resumed.log")" = "$first_id" || { echo "the resumed run has another id"; exit 1; }
test -e "$dir/run/model_00000004.bin" || { echo "the overridden resume wrote no step-4 checkpoint"; exit 1; }
# (5) --overwrite: the old checkpoints go, a new run with a new id starts at step 1
"$bin" "${common[@]}" -x 2 --overwrite > "$dir/fresh.log"
test ! -e "$dir/run/model_00000004.bin" || { echo "--overwrite left the old step-4 checkpoint"; exit 1; }
test -e "$dir/run/model_00000002.bin" || { echo "--overwrite: the new run wrote no checkpoint"; exit 1; }
test "$(run_id "$dir/fresh.log")" != "$first_id" || { echo "--overwrite kept the old run id"; exit 1; }
echo "run identity: fresh run refused over checkpoints, identity changes refused and overridable, --overwrite starts afresh"
