#!/usr/bin/env bash
# Builds, here, what scripts/gpu_check.sh runs on a lent GPU node, so the lease's minutes go to running
# it: train_gpt and every GPU test binary, for one GPU without MPI (make MPI=0), sm_90 only (the H100
# and H200; sm_80 would double the size), the header-only dependencies from build/gpu_deps
# (scripts/gpu_deps.sh). The binaries, stripped, and their ptxas logs go to build/device/gpu-nompi
# (84 MB with the tests), packed as build/device_pack/gpu-nompi.tar.xz (8 MB: the device tool carries
# at most 64 MiB of working tree): carry build/device_pack and build/gpu_deps, and run
#   GPU_PREBUILT=build/device_pack/gpu-nompi.tar.xz scripts/gpu_check.sh build train profile test sanitize
#   scripts/gpu_prebuild.sh [--no-tests]     --no-tests: train_gpt alone
set -euo pipefail
cd "$(dirname "$0")/.."
targets=test-gpu-binaries
[ "${1:-}" = "--no-tests" ] && targets=train_gpt
[ -f build/gpu_deps/usr/include/cxxopts.hpp ] || scripts/gpu_deps.sh
build=build/h100  # sm_90: the H100 and the H200
make --no-print-directory -j"$(nproc)" MPI=0 DEPS_PREFIX=build/gpu_deps BUILD=$build \
  GPU_ARCH="-gencode arch=compute_90,code=sm_90" "$build/gpu-nompi/train_gpt" \
  $([ $targets = test-gpu-binaries ] && echo test-gpu-binaries)
dest=build/device/gpu-nompi
rm -rf build/device
mkdir -p "$dest"
for f in "$build"/gpu-nompi/*; do
  if [ -f "$f" ] && [ -x "$f" ]; then
    strip -o "$dest/$(basename "$f")" "$f"
  elif [[ "$f" == *.ptxas.log ]]; then
    cp "$f" "$dest/"
  fi
done
git describe --always --dirty > "$dest/COMMIT"
mkdir -p build/device_pack
tar -cJf build/device_pack/gpu-nompi.tar.xz -C build device
echo "gpu_prebuild.sh: $(find "$dest" -type f -executable | wc -l) binaries in $dest ($(du -sh "$dest" | cut -f1))," \
  "packed in build/device_pack/gpu-nompi.tar.xz ($(du -sh build/device_pack/gpu-nompi.tar.xz | cut -f1)), commit $(cat "$dest/COMMIT")"
