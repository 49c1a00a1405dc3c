#!/usr/bin/env bash
# --matmul-autotune's picks kept in a file (host/matmul_algos.h), through the real program: (1) a run
# with -o times its GEMM shapes and writes -o/matmul_algos.json, one pick per shape timed; (2) a run
# that starts from that file times none, is stopped at step 3 and resumed with -y, and ends byte for byte
# where the first, uninterrupted run did (on a GPU the file is what makes that so: a pick by timing can
# differ between runs); (3) --matmul-algos names a file outside -o; (4) a file written on another device
# is timed over and rewritten, with a note; (5) a file that does not read stops the run with one line
# naming it and the field, before any step; --matmul-algos in a folder that does not exist is refused;
# (6) 2 ranks keep one file each.
# Usage: test_matmul_algos.sh TRAIN_BINARY "MPIRUN..."
set -euo pipefail
bin=$1
mpirun=${2:-mpirun --allow-run-as-root --oversubscribe}
here=$(dirname "$0")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 "$here/make_shards.py" "$dir" 13 8000
common=(-e tiny -b 2 -t 32 -d 128 -k constant -l 1e-3 -v 0 -s 0 -i "$dir/train_*.bin" -j "$dir/val_*.bin" --matmul-autotune)
# "matmul autotune: N GEMM shapes timed, M took the picks recorded in '...'" -> "N M"
counts() { sed -n 's/^matmul autotune: \([0-9]*\) GEMM shapes timed, \([0-9]*\) took the picks.*/\1 \2/p' "$1"; }
picks() { python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["picks"]))' "$1"; }

# (1) timed, written
"$bin" "${common[@]}" -x 6 -n 3 -o "$dir/whole" > "$dir/whole.log"
read -r timed taken <<<"$(counts "$dir/whole.log")" || true
test -n "${timed:-}" || { echo "(1) no autotune summary line"; cat "$dir/whole.log"; exit 1; }
test "$timed" -gt 0 && test "$taken" = 0 || { echo "(1) expected shapes timed and none taken, got '$timed $taken'"; exit 1; }
test "$(picks "$dir/whole/matmul_algos.json")" = "$timed" ||
    { echo "(1) the file holds $(picks "$dir/whole/matmul_algos.json") picks for $timed shapes timed"; exit 1; }

# (2) the same picks, stopped and resumed: nothing timed, and the same bytes at step 6
mkdir "$dir/parts"
cp "$dir/whole/matmul_algos.json" "$dir/parts/"
"$bin" "${common[@]}" -x 3 -n 3 -o "$dir/parts" > "$dir/part1.log"
"$bin" "${common[@]}" -x 6 -n 3 -o "$dir/parts" -y > "$dir/part2.log"
for part in part1 part2; do
  test "$(counts "$dir/$part.log")" = "0 $timed" ||
      { echo "(2) $part: expected '0 $timed' (none timed, all taken), got '$(counts "$dir/$part.log")'"; cat "$dir/$part.log"; exit 1; }
done
cmp "$dir/whole/model_00000006.bin" "$dir/parts/model_00000006.bin" ||
    { echo "(2) the resumed run's model differs from the uninterrupted run's"; exit 1; }

# (3) --matmul-algos: a file outside -o, read and not rewritten when nothing new was timed
cp "$dir/whole/matmul_algos.json" "$dir/kept.json"
"$bin" "${common[@]}" -x 2 --matmul-algos "$dir/kept.json" > "$dir/named.log"
test "$(counts "$dir/named.log")" = "0 $timed" || { echo "(3) expected '0 $timed', got '$(counts "$dir/named.log")'"; exit 1; }
cmp "$dir/kept.json" "$dir/whole/matmul_algos.json" || { echo "(3) a file with nothing new was rewritten"; exit 1; }

# (4) written on another device: timed over, with a note, and rewritten for this one
python3 - "$dir/kept.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["device"] = "another GPU"
json.dump(d, open(sys.argv[1], "w"))
PY
"$bin" "${common[@]}" -x 2 --matmul-algos "$dir/kept.json" > "$dir/other.log" 2> "$dir/other.err"
grep -q "was written for .* on another GPU .*: its shapes are timed again and the file rewritten" "$dir/other.err" ||
    { echo "(4) no note on a file from another device"; cat "$dir/other.err"; exit 1; }
test "$(counts "$dir/other.log")" = "$timed 0" || { echo "(4) expected '$timed 0', got '$(counts "$dir/other.log")'"; exit 1; }
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(d["device"] == "another GPU")' "$dir/kept.json" ||
    { echo "(4) the file was not rewritten for this device"; exit 1; }

# (5) a file that does not read: one line naming it and the field, no step run
python3 - "$dir/kept.json" "$dir/broken.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
del d["picks"][0]["m"]
json.dump(d, open(sys.argv[2], "w"))
PY
"$here/expect_failure.sh" "matmul algorithms '.*broken.json': picks\[0\]\.m: missing or not a 32-bit integer" \
    "$bin" "${common[@]}" -x 2 --matmul-algos "$dir/broken.json" -o "$dir/broken_run"
test ! -e "$dir/broken_run" || { echo "(5) a run with a broken file started (made its -o)"; exit 1; }
"$here/expect_failure.sh" "--matmul-algos '$dir/nowhere/a.json': no directory '$dir/nowhere' to write it in" \
    "$bin" "${common[@]}" -x 2 --matmul-algos "$dir/nowhere/a.json"

# (6) 2 ranks: a file each (skipped, 77, without MPI)
$mpirun -np 2 "$bin" "${common[@]}" -x 2 -o "$dir/two" > "$dir/two.log"
for r in 0 1; do
  test "$(picks "$dir/two/matmul_algos.rank$r.json")" -gt 0 || { echo "(6) no picks in rank $r's file"; exit 1; }
done
test ! -e "$dir/two/matmul_algos.json" || { echo "(6) 2 ranks wrote the one-rank file"; exit 1; }
echo "matmul algos: $timed shapes timed and kept; taken again without timing, resumed byte for byte; another device's file timed over; a broken file refused; a file per rank"
