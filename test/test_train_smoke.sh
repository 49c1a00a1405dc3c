#!/usr/bin/env bash
# 20 training steps of a tiny GPT-2 on a small repetitive corpus: the loss must fall (by at least
# a third), and the program's outputs must be there (config.json, metrics.jsonl with 20 steps, two
# validations and two HellaSwag evaluations of the 3-example fixture).
# Then a short run with packed documents masked and positions restarted (--doc-mask --doc-positions).
# Then the defaults that give way with a note, and the mistakes that stay errors: samples longer than
# -t are clipped; no validation shard without -v turns validation off, with -v it is an error; an
# unknown preset is named with the list. Then --layers/--heads/--channels: a preset reshaped to tiny's
# shape trains tiny's model byte for byte; bad shapes and a model file reshaped are one-line errors.
# Usage: test_train_smoke.sh TRAIN_BINARY
set -euo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# A token stream a model can learn fast: a 50-token sentence repeated, documents separated by EOT.
python3 - "$dir" <<'PY'
import struct, sys
sentence = [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13] * 5
tokens = ([50256] + sentence * 8) * 40
for name in ("train_000000.bin", "val_000000.bin"):
    with open(f"{sys.argv[1]}/{name}", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
"$bin" -e tiny -b 4 -t 32 -x 20 -l 3e-3 -u 2 -v 10 -m 2 -s 20 -g 8 -i "$dir/train_*.bin" -j "$dir/val_*.bin" \
  -h "$(dirname "$0")/fixtures/hellaswag_tiny.bin" -o "$dir/out" > "$dir/log"
cat "$dir/log"
tail -1 "$dir/log" | grep -qx "plot: python3 scripts/plot_metrics.py $dir/out/metrics.jsonl" ||
    { echo "smoke: the run's last line does not give the command that plots it"; exit 1; }
python3 - "$dir/out" <<'PY'
import json, sys
records = [json.loads(line) for line in open(f"{sys.argv[1]}/metrics.jsonl")]
losses = [r["loss"] for r in records if "loss" in r]
vals = [r["val_loss"] for r in records if "val_loss" in r]
assert len(losses) == 20, f"expected 20 step records, got {len(losses)}"
assert losses[-1] < losses[0] * 2 / 3, f"the loss did not fall: {losses[0]:.3f} -> {losses[-1]:.3f}"
assert len(vals) == 2 and vals[-1] < vals[0], f"the validation loss did not fall: {vals}"
hellaswag = [r for r in records if "hellaswag_examples" in r]
assert [r["step"] for r in hellaswag] == [10, 20], f"expected HellaSwag at steps 10 and 20: {hellaswag}"
assert all(r["hellaswag_examples"] == 3 for r in hellaswag), hellaswag
json.load(open(f"{sys.argv[1]}/config.json"))
print(f"smoke: loss {losses[0]:.3f} -> {losses[-1]:.3f}, val {vals[0]:.3f} -> {vals[-1]:.3f}")
PY

# Documents of 7 to 40 tokens (EOT first), so most rows hold several.
python3 - "$dir" <<'PY'
import random, struct, sys
random.seed(3)
tokens = []
while len(tokens) < 4000:
    tokens += [50256] + [random.randrange(50256) for _ in range(random.randint(6, 39))]
with open(f"{sys.argv[1]}/docs_000000.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
"$bin" -e tiny -b 2 -t 64 -x 2 -v 0 -s 0 -i "$dir/docs_*.bin" --doc-mask --doc-positions > "$dir/docs.log"
grep -qE "attention (simt|tc) \+ doc-mask, doc-positions," "$dir/docs.log" || { echo "smoke: no doc-mask in the first line"; cat "$dir/docs.log"; exit 1; }
grep -q "^step 2/2 " "$dir/docs.log" || { echo "smoke: the document-masked run did not train"; cat "$dir/docs.log"; exit 1; }

"$bin" -e tiny -b 2 -t 32 -x 1 -s 1 -i "$dir/train_*.bin" -j "$dir/none_*.bin" > "$dir/notes.log"
grep -q "note: samples are 31 tokens, not -g/--gen-tokens 64: a sample fits one -t/--seq-len 32 window" "$dir/notes.log" ||
    { echo "smoke: no note for the clipped sample length"; cat "$dir/notes.log"; exit 1; }
grep -q "note: no validation shard matches -j/--val-data '$dir/none_\*.bin': validation is off" "$dir/notes.log" ||
    { echo "smoke: no note for the missing validation shards"; cat "$dir/notes.log"; exit 1; }
grep -q "^step 1/1 " "$dir/notes.log" || { echo "smoke: the run with notes did not train"; exit 1; }
"$(dirname "$0")/expect_failure.sh" "DataLoader: no file matches the pattern '.*none_\*.bin'" \
    "$bin" -e tiny -b 2 -t 32 -x 1 -s 0 -v 5 -i "$dir/train_*.bin" -j "$dir/none_*.bin"
"$(dirname "$0")/expect_failure.sh" "-e/--model 'd13' is neither a preset \(d12\|d24\|d36\|d48\|tiny\|mini\) nor an existing model file" \
    "$bin" -e d13 -b 2 -t 32 -x 1 -i "$dir/train_*.bin"
# Shape flags (--layers, --heads, --channels): mini (4 layers, 128 channels) made tiny's shape (2, 64)
# is tiny: the same initialization and steps write the same model file, byte for byte.
"$bin" -e tiny -b 2 -t 64 -x 2 -v 0 -s 0 -n 2 -i "$dir/train_*.bin" -o "$dir/tiny" > "$dir/tiny.log"
"$bin" -e mini --layers 2 --channels 64 -b 2 -t 64 -x 2 -v 0 -s 0 -n 2 -i "$dir/train_*.bin" -o "$dir/shaped" > "$dir/shaped.log"
grep -q "^train_gpt: mini --layers 2 --channels 64 on " "$dir/shaped.log" ||
    { echo "smoke: the banner does not name the shape flags"; cat "$dir/shaped.log"; exit 1; }
cmp "$dir/tiny/model_00000002.bin" "$dir/shaped/model_00000002.bin" ||
    { echo "smoke: mini --layers 2 --channels 64 did not train tiny's model"; exit 1; }
"$(dirname "$0")/expect_failure.sh" "--layers/--heads/--channels: channels 66 is not a multiple of num_heads 4" \
    "$bin" -e tiny --channels 66 -b 2 -t 32 -x 1 -i "$dir/train_*.bin"
"$(dirname "$0")/expect_failure.sh" "^train_gpt: -e tiny --channels 100: encoder: C = 100 is not a positive multiple of 8" \
    "$bin" -e tiny --channels 100 -b 2 -t 32 -x 1 -i "$dir/train_*.bin"
"$(dirname "$0")/expect_failure.sh" "--layers 3: the model file '.*model_00000002.bin' has 2 \(a model file's shape is its own\)" \
    "$bin" -e "$dir/tiny/model_00000002.bin" --layers 3 -b 2 -t 32 -x 1 -i "$dir/train_*.bin"
# Validation batches against the split's size: a split of 201 tokens holds 6 samples of 33, 3 batches
# of B = 2 per rank. -m 0 reads all 3 (the same loss as -m 3, unlike -m 1); more than 3 is an error
# when asked for, and the default 20 gives way with a note.
mkdir "$dir/small" && python3 "$(dirname "$0")/make_shards.py" "$dir/small" 5 201
for m in 0 3 1; do
    "$bin" -e tiny -b 2 -t 32 -x 1 -v 1 -m $m -s 0 -i "$dir/train_*.bin" -j "$dir/small/val_*.bin" -o "$dir/val_m$m" > "$dir/val_m$m.log"
done
val_of() { python3 -c "import json,sys; print([json.loads(l)['val_loss'] for l in open(sys.argv[1]) if 'val_loss' in l][0])" "$1/metrics.jsonl"; }
[ "$(val_of "$dir/val_m0")" = "$(val_of "$dir/val_m3")" ] ||
    { echo "smoke: -m 0 gave val $(val_of "$dir/val_m0"), the whole split's 3 batches (-m 3) $(val_of "$dir/val_m3")"; exit 1; }
[ "$(val_of "$dir/val_m1")" != "$(val_of "$dir/val_m3")" ] || { echo "smoke: -m 1 and -m 3 gave the same val loss"; exit 1; }
"$(dirname "$0")/expect_failure.sh" "^train_gpt: -m/--val-batches 4 is more than the validation split -j/--val-data '.*small/val_\*.bin' holds 3 batches of 2 x 32 tokens per rank over 1 rank; -m 0 takes all of them$" \
    "$bin" -e tiny -b 2 -t 32 -x 1 -v 1 -m 4 -s 0 -i "$dir/train_*.bin" -j "$dir/small/val_*.bin" -o "$dir/val_m4"
"$bin" -e tiny -b 2 -t 32 -x 1 -v 1 -s 0 -i "$dir/train_*.bin" -j "$dir/small/val_*.bin" -o "$dir/val_default" > "$dir/val_default.log"
grep -q "^note: validation reads 3 batches, not -m/--val-batches 20: the validation split" "$dir/val_default.log" ||
    { echo "smoke: no note for the default -m over a small split"; cat "$dir/val_default.log"; exit 1; }
[ "$(val_of "$dir/val_default")" = "$(val_of "$dir/val_m3")" ] || { echo "smoke: the default -m did not read the whole small split"; exit 1; }
# --final-val-batches: the validation after the last step reads its own count (0: the whole split), the
# others -m's; each record's val_tokens counts the targets it averaged (a batch here: 2 x 32).
"$bin" -e tiny -b 2 -t 32 -x 2 -v 1 -m 1 --final-val-batches 0 -s 0 -i "$dir/train_*.bin" -j "$dir/small/val_*.bin" \
    -o "$dir/val_final" > "$dir/val_final.log"
"$bin" -e tiny -b 2 -t 32 -x 2 -v 1 -m 0 -s 0 -i "$dir/train_*.bin" -j "$dir/small/val_*.bin" -o "$dir/val_all" > "$dir/val_all.log"
python3 - "$dir/val_final/metrics.jsonl" "$dir/val_all/metrics.jsonl" <<'PY'
import json, sys
final, whole = ([json.loads(l) for l in open(p) if '"val_loss"' in l] for p in sys.argv[1:])
def fail(why):
    print("smoke: --final-val-batches:", why, final, whole); sys.exit(1)
if [r["val_tokens"] for r in final] != [64, 192]: fail("val_tokens not 64 then 192")
if [r["val_tokens"] for r in whole] != [192, 192]: fail("-m 0 did not average 192 targets each time")
if final[1]["val_loss"] != whole[1]["val_loss"]: fail("the last validation differs from -m 0's")
if final[0]["val_loss"] == whole[0]["val_loss"]: fail("the first validation read the whole split")
PY
grep -q "^val loss [0-9.]* (192 tokens)$" "$dir/val_final.log" || { echo "smoke: no 'val loss ... (192 tokens)' line"; cat "$dir/val_final.log"; exit 1; }
"$(dirname "$0")/expect_failure.sh" "^train_gpt: --final-val-batches 4 is more than the validation split -j/--val-data '.*small/val_\*.bin' holds 3 batches of 2 x 32 tokens per rank over 1 rank; --final-val-batches 0 takes all of them$" \
    "$bin" -e tiny -b 2 -t 32 -x 1 -v 1 -m 1 --final-val-batches 4 -s 0 -i "$dir/train_*.bin" -j "$dir/small/val_*.bin" -o "$dir/val_f4"

echo "smoke: a document-masked run; notes for a clipped sample and absent validation shards; errors for -v without shards and an unknown preset; shape flags; validation batches against the split's size, and the last validation's own count"

