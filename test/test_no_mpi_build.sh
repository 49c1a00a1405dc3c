#!/usr/bin/env bash
# The offline build (make MPI=0 DEPS_PREFIX=...: what scripts/gpu_check.sh builds on a GPU node without
# MPI, Debian's -dev packages or a network), built by the Makefile's no-mpi-check-build:
#   (1) it links no MPI library;
#   (2) every header it read of MPI and of the header-only dependencies came from the prefix, none from
#       /usr/include (g++ -M of the program and of the Catch2 main: headers.txt);
#   (3) 3 training steps write the same model file as this (MPI) build, byte for byte;
#   (4) its Catch2 tests pass on one rank (test_config: the CLI and JSON headers; test_mpi_nccl: the
#       one-process MPI under the process grid and NCCL tests);
#   (5) under mpirun with 2 ranks it refuses to start, non-zero, with one line naming the launcher's
#       variable, instead of training two copies that overwrite each other's files.
# Usage: test_no_mpi_build.sh NO_MPI_BUILD_DIR DEPS_PREFIX TRAIN_BINARY "MPIRUN..."
set -euo pipefail
nompi=$1
deps=$(cd "$2" && pwd)
bin=$3
mpirun=${4:-mpirun --allow-run-as-root --oversubscribe}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for f in train_gpt_cpu test_config test_mpi_nccl headers.txt; do
  [ -e "$nompi/$f" ] || { echo "no-mpi build: $nompi/$f missing (make no-mpi-check-build)"; exit 1; }
done

# (1)
if ldd "$nompi/train_gpt_cpu" | grep -i "libmpi"; then echo "no-mpi build: linked against MPI"; exit 1; fi
# (grep without -q reads all of ldd's output: with pipefail, -q stopping early could kill ldd with SIGPIPE)
ldd "$bin" | grep -i "libmpi" > /dev/null || { echo "no-mpi build: the regular build links no libmpi, so (1) proves nothing"; exit 1; }

# (2) headers.txt is make's dependency syntax: split into one path per line.
tr ' \\' '\n\n' < "$nompi/headers.txt" | grep -v '^$' | grep -v ':$' | sort -u > "$dir/headers"
for h in cxxopts.hpp nlohmann/json.hpp catch2/catch.hpp; do
  grep -q "^$deps/usr/include/$h\$" "$dir/headers" || { echo "no-mpi build: $h not read from the prefix $deps"; grep "$h" "$dir/headers"; exit 1; }
done
if grep -E "^/usr/include/(cxxopts\.hpp|nlohmann/|catch2/)|/mpi\.h$|openmpi" "$dir/headers"; then
  echo "no-mpi build: the headers above came from the system, not the prefix"; exit 1
fi
grep -q "parallel/single_process_mpi.h" "$dir/headers" || { echo "no-mpi build: parallel/single_process_mpi.h not read"; exit 1; }

# (3) Same data, same flags: the model and the optimizer state after 3 steps.
python3 - "$dir" <<'PY'
import random, struct, sys
random.seed(7)
tokens = [random.randrange(50257) for _ in range(20000)]
with open(f"{sys.argv[1]}/train_000000.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
common=(-e tiny -b 2 -t 32 -x 3 -l 1e-3 -v 0 -s 0 -n 3 -i "$dir/train_*.bin")
"$bin" "${common[@]}" -o "$dir/with_mpi" > "$dir/with_mpi.log"
"$nompi/train_gpt_cpu" "${common[@]}" -o "$dir/no_mpi" > "$dir/no_mpi.log"
# (The state file holds the run's identity and times too, which differ between any two runs.)
cmp "$dir/with_mpi/model_00000003.bin" "$dir/no_mpi/model_00000003.bin" ||
  { echo "no-mpi build: the model after 3 steps differs from the MPI build's"; exit 1; }
[ -s "$dir/no_mpi/model_00000003.bin" ] || { echo "no-mpi build: empty model file"; exit 1; }

# (4)
"$nompi/test_config" > "$dir/test_config.log" 2>&1 || { cat "$dir/test_config.log"; echo "no-mpi build: test_config failed"; exit 1; }
"$nompi/test_mpi_nccl" > "$dir/test_mpi_nccl.log" 2>&1 || { cat "$dir/test_mpi_nccl.log"; echo "no-mpi build: test_mpi_nccl failed"; exit 1; }
grep -q "All tests passed" "$dir/test_mpi_nccl.log" || { cat "$dir/test_mpi_nccl.log"; echo "no-mpi build: test_mpi_nccl ran no tests"; exit 1; }

# (5)
status=0
$mpirun -np 2 "$nompi/train_gpt_cpu" "${common[@]}" -o "$dir/two" > "$dir/two.log" 2> "$dir/two.err" || status=$?
[ "$status" -ne 0 ] || { echo "no-mpi build: 2 ranks under mpirun were not refused"; cat "$dir/two.log"; exit 1; }
grep -q "^error: this build has no MPI (built with make MPI=0).*OMPI_COMM_WORLD_SIZE=2" "$dir/two.err" ||
  { echo "no-mpi build: no one-line refusal naming OMPI_COMM_WORLD_SIZE"; cat "$dir/two.err"; exit 1; }
[ ! -e "$dir/two/model_00000003.bin" ] || { echo "no-mpi build: a refused run wrote a model"; exit 1; }
echo "no-mpi build: no libmpi; the dependencies' headers from $deps; 3 steps byte-equal to the MPI build; its tests pass; mpirun -np 2 refused (exit $status)"
