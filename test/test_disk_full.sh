#!/usr/bin/env bash
# A checkpoint that cannot be written never stops training and leaves no file behind, through the
# real program: `write-error` (a file-size limit, ulimit -f, makes the state write fail mid-checkpoint:
# the step's files are removed, a warning names the error, training goes on and exits 0);
# `no-space` (a 60 MiB tmpfs holds one checkpoint of `tiny`, ~47 MB, not two: the second is skipped
# before writing, with its size and the free space; -y then resumes from the first). `no-space` needs
# to mount a tmpfs (root): without that it exits 77, which CTest reports as skipped.
# `silent-corruption`: a preloaded pwrite flips one bit of the step-4 state as it is written (a disk
# that stores what it was not given); with --keep-last 1 the read-back verification finds it, the step-4
# checkpoint is removed, step 2 (which keep-last would otherwise have retired) stays, and -y resumes it.
# Usage: test_disk_full.sh write-error|no-space|silent-corruption TRAIN_BINARY
set -euo pipefail
mode=$1
bin=$2
dir=$(mktemp -d)
cleanup() { mountpoint -q "$dir/out" 2>/dev/null && umount "$dir/out"; rm -rf "$dir"; }
trap cleanup EXIT
python3 "$(dirname "$0")/make_shards.py" "$dir" 6 20000
common=(-e tiny -b 2 -t 32 -v 0 -s 0 -n 2 -i "$dir/train_*.bin" -j "$dir/val_*.bin" -o "$dir/out")
mkdir -p "$dir/out"

# After a run of 4 steps whose step-4 checkpoint failed (WHY): no file of it is left, step 2's is
# complete, and -y resumes there.
step4_gone_step2_resumes() {
    test -e "$dir/out/state_00000002.bin.done" || { echo "disk: the step-2 checkpoint is missing ($1)"; exit 1; }
    leftovers=$(cd "$dir/out" && ls *00000004* 2>/dev/null || true)
    test -z "$leftovers" || { echo "disk: the step-4 checkpoint left files ($1): $leftovers"; exit 1; }
    "$bin" "${common[@]}" -x 3 -y > "$dir/resumed.log" 2>&1
    grep -q "resumed at step 2" "$dir/resumed.log" || { echo "disk: -y did not resume at step 2"; cat "$dir/resumed.log"; exit 1; }
}

case $mode in
write-error)
    # 20 MB per file: the model file (6.6 MB) fits, the state (40 MB) does not; SIGXFSZ ignored, so
    # the write fails with EFBIG instead of killing the process.
    status=0
    (trap '' XFSZ; ulimit -f 20000; exec "$bin" "${common[@]}" -x 4) > "$dir/log" 2> "$dir/err" || status=$?
    cat "$dir/err"
    test "$status" -eq 0 || { echo "disk: exit status $status, expected 0 (training goes on)"; exit 1; }
    test "$(grep -c '^step ' "$dir/log")" -eq 4 || { echo "disk: expected 4 steps"; cat "$dir/log"; exit 1; }
    grep -q "step 2: checkpoint not written: .*File too large" "$dir/err" || { echo "disk: no warning naming the error"; exit 1; }
    grep -q "step 4: checkpoint skipped, its files removed" "$dir/err" || { echo "disk: no warning for step 4"; exit 1; }
    leftovers=$(cd "$dir/out" && ls model_* state_* 2>/dev/null || true)
    test -z "$leftovers" || { echo "disk: failed checkpoints left files: $leftovers"; exit 1; }
    echo "disk: failed checkpoint writes left no file and training went on to step 4"
    ;;
no-space)
    if ! mount -t tmpfs -o size=60m tmpfs "$dir/out" 2>/dev/null; then
        echo "disk: SKIPPED: cannot mount a tmpfs here (needs root)"
        exit 77
    fi
    "$bin" "${common[@]}" -x 4 > "$dir/log" 2> "$dir/err"
    cat "$dir/err"
    grep -q "step 4: checkpoint skipped: it needs [0-9]* bytes, '$dir/out' has [0-9]* free" "$dir/err" ||
        { echo "disk: no warning naming the size and the free space"; exit 1; }
    step4_gone_step2_resumes "it did not fit"
    echo "disk: a checkpoint that does not fit was skipped before writing; -y resumed from the previous one"
    ;;
silent-corruption)
    cat > "$dir/flip_bit.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>
// pwrite, except that the first large write into a file whose name contains $FLIP_FILE gets one bit
// of its data flipped on the way to the disk; the caller's buffer is left alone.
static int flipped;
ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) {
    static ssize_t (*real)(int, const void*, size_t, off_t);
    if (!real) real = (ssize_t (*)(int, const void*, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
    char link[64], name[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t len = readlink(link, name, sizeof name - 1);
    const char* target = getenv("FLIP_FILE");
    if (!flipped && target && len > 0 && count > 65536) {
        name[len] = 0;
        if (strstr(name, target)) {
            unsigned char* copy = malloc(count);
            memcpy(copy, buf, count);
            copy[count / 2] ^= 0x08;
            flipped = 1;
            const ssize_t done = real(fd, copy, count, offset);
            free(copy);
            return done;
        }
    }
    return real(fd, buf, count, offset);
}
ssize_t pwrite64(int fd, const void* buf, size_t count, off_t offset) { return pwrite(fd, buf, count, offset); }
C
    cc -shared -fPIC -O1 -o "$dir/flip_bit.so" "$dir/flip_bit.c" -ldl
    FLIP_FILE=state_00000004.bin LD_PRELOAD="$dir/flip_bit.so" "$bin" "${common[@]}" -x 4 --keep-last 1 \
        > "$dir/log" 2> "$dir/err"
    cat "$dir/err"
    grep -q "step 4: checkpoint not written: read_state_range: .*CRC-32C .*(corrupt file)" "$dir/err" ||
        { echo "disk: the corrupted state was not caught by the read-back"; exit 1; }
    step4_gone_step2_resumes "its read-back failed: --keep-last 1 must not retire step 2 for it"
    # Without the corruption, --keep-last 1 keeps step 4 alone (the read-back passes).
    rm -rf "$dir/out"/*
    "$bin" "${common[@]}" -x 4 --keep-last 1 > /dev/null 2>&1
    kept=$(cd "$dir/out" && ls state_*.done)
    test "$kept" = "state_00000004.bin.done" || { echo "disk: --keep-last 1 kept '$kept'"; exit 1; }
    echo "disk: a state corrupted on its way to the disk failed its read-back; the previous checkpoint stayed and -y resumed it"
    ;;
*) echo "usage: test_disk_full.sh write-error|no-space|silent-corruption TRAIN_BINARY"; exit 2 ;;
esac
