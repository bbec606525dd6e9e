#!/usr/bin/env bash
# Installs the Debian 12 packages fusewire's scripts need (as root), once.
# Usage: .ci/deps.sh [build|tests|bench|peers|demo|venv]...   (build is always included)
set -euo pipefail

build=(g++ meson ninja-build ccache pkg-config cmake libboost-dev nlohmann-json3-dev
       liburing-dev libibverbs-dev librdmacm-dev libssl-dev)
tests=(doctest-dev clang libclang-rt-14-dev zlib1g-dev libopenblas-dev dataset-fashion-mnist iptables)
bench=(libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
       libzmq3-dev cppzmq-dev libtensorpipe-dev libcli11-dev gnuplot-nox)
demo=(dataset-fashion-mnist zlib1g-dev libcli11-dev libopenblas-dev)
# the peers bench/peers.sh measures fusewire against (UCX's ucx_perftest, iperf3)
peers=(ucx-utils iperf3)
# what .ci/venv.sh needs to make a Python virtual environment
venv=(python3 python3-venv python3-pip)

want=("${build[@]}")
for part in "$@"; do
  case "$part" in
    build) ;;
    tests) want+=("${tests[@]}" "${bench[@]}") ;;
    bench) want+=("${bench[@]}") ;;
    peers) want+=("${peers[@]}") ;;
    venv) want+=("${venv[@]}") ;;
    demo) want+=("${demo[@]}") ;;
    *) echo "deps.sh: unknown part '$part' (allowed: build tests bench peers demo venv)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "deps.sh: missing Debian packages: ${missing[*]}; run as root or install them" >&2
  exit 1
fi
echo "deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt_install() { apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/fusewire-apt.log 2>&1; }
if ! apt_install; then
  apt-get update -q >/tmp/fusewire-apt-update.log 2>&1 || true
  apt_install || { echo "deps.sh: apt-get install failed, see /tmp/fusewire-apt.log" >&2; tail -5 /tmp/fusewire-apt.log >&2; exit 1; }
fi
