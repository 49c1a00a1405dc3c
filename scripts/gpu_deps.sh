#!/usr/bin/env bash
# The C++ dependencies a machine without Debian's -dev packages or a network needs to build train_gpt
# (a lent GPU node: scripts/gpu_check.sh): the header-only ones (scripts/deps.sh --header-only-packages:
# cxxopts, nlohmann-json, Catch2) unpacked into a prefix that travels with the working tree, then
# `make DEPS_PREFIX=DIR MPI=0 ...` reads them from DIR/usr/include. MPI is not carried: builds for one
# GPU need none (make MPI=0); NCCL comes from the toolkit or the nvidia-nccl-cu13 Python package.
#   scripts/gpu_deps.sh [DIR]                   apt-get download the packages, dpkg -x them into DIR
#                                               (default build/gpu_deps; never into /)
#   scripts/gpu_deps.sh --from-installed [DIR]  copy the installed packages' files instead (dpkg -L): no
#                                               network (test/test_no_mpi_build.sh)
# DIR/PACKAGES lists what it holds, one "name version" a line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mode=download
if [ "${1:-}" = "--from-installed" ]; then
  mode=installed
  shift
fi
dir=${1:-build/gpu_deps}
read -r -a packages <<< "$("$here/deps.sh" --header-only-packages)"
rm -rf "$dir"
mkdir -p "$dir"
: > "$dir/PACKAGES"
if [ "$mode" = download ]; then
  debs=$(mktemp -d)
  trap 'rm -rf "$debs"' EXIT
  (cd "$debs" && apt-get -o APT::Sandbox::User=root download "${packages[@]}" >/dev/null)
  for deb in "$debs"/*.deb; do
    dpkg -x "$deb" "$dir"
    dpkg-deb -f "$deb" Package Version | paste -sd' ' | sed 's/^Package: \(.*\) Version: /\1 /' >> "$dir/PACKAGES"
  done
else
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || {
      echo "gpu_deps.sh: $p is not installed (scripts/deps.sh installs it)" >&2
      exit 1
    }
    dpkg -L "$p" | while read -r f; do
      [ -f "$f" ] && ! [ -L "$f" ] && install -D -m 644 "$f" "$dir$f"
      true
    done
    echo "$p $(dpkg-query -W -f='${Version}' "$p")" >> "$dir/PACKAGES"
  done
fi
for header in cxxopts.hpp nlohmann/json.hpp catch2/catch.hpp; do
  [ -f "$dir/usr/include/$header" ] || { echo "gpu_deps.sh: $dir/usr/include/$header missing after unpacking" >&2; exit 1; }
done
echo "gpu_deps.sh: $(wc -l < "$dir/PACKAGES") packages in $dir ($(du -sh "$dir" | cut -f1)): $(paste -sd, "$dir/PACKAGES")"
