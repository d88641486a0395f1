#!/usr/bin/env bash
# build.sh — install what is missing (deploy/install-deps.sh) and build roundpipe incrementally
# into ./build (Ninja, ccache). Sourced by demo.sh and test.sh; can also be run on its own.
#   RP_BUILD_DIR   build directory (default: <checkout>/build)
#   RP_JOBS        parallel compile jobs (default: number of cores)
#   RP_SKIP_DEPS=1 skip deploy/install-deps.sh (you installed everything yourself)
#   RP_BUILD_TARGETS  space-separated targets to build (default: all; demo.sh builds only the
#                     daemon and the CLI)
set -euo pipefail
RP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RP_BUILD_DIR="${RP_BUILD_DIR:-$RP_ROOT/build}"
RP_JOBS="${RP_JOBS:-$(nproc)}"

rp_as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "build.sh: installing dependencies needs root (or sudo)" >&2; return 1; fi
}

if [ "${RP_SKIP_DEPS:-0}" != 1 ]; then
  rp_as_root bash "$RP_ROOT/deploy/install-deps.sh"
fi

export CCACHE_DIR="${CCACHE_DIR:-${HOME:-/root}/.cache/ccache}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
# Cache hits whatever the checkout's path (a clean clone elsewhere reuses a warm cache): paths
# under the checkout are hashed relative to it, and the build directory is not hashed.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$RP_ROOT}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
# Precompiled headers (rp_torch_pch) are only cacheable with these sloppiness settings.
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
if [ ! -f "$RP_BUILD_DIR/build.ninja" ]; then
  cmake -S "$RP_ROOT" -B "$RP_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
# shellcheck disable=SC2086  # word splitting of the target list is intended
cmake --build "$RP_BUILD_DIR" -j "$RP_JOBS" ${RP_BUILD_TARGETS:+--target $RP_BUILD_TARGETS}
