#!/usr/bin/env bash
# Installs the Debian packages that phos builds and tests with, then CRIU 4.2.1.
# Idempotent: packages already present are not fetched again.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

packages=(
  # build
  meson ninja-build pkg-config g++ clang-14 libclang-rt-14-dev
  protobuf-c-compiler libprotobuf-c-dev libzstd-dev liblz4-dev catch2 nlohmann-json3-dev
  # LLVM/Clang 14 libTooling, used by phos-sigdb (speculation)
  llvm-14-dev libclang-14-dev libclang-cpp14-dev
  # CRIU 4.2.1 build (contrib/scripts/install-criu.sh)
  dpkg-dev build-essential libprotobuf-dev protobuf-compiler python3-protobuf
  libnl-3-dev libnet1-dev libcap-dev libaio-dev libgnutls28-dev libbsd-dev
  libnftables-dev libdrm-dev uuid-dev iproute2 xz-utils
  # tests (python3-yaml: CRIU's zdtm, contrib/scripts/criu-zdtm.sh; git: install-criu.sh applies patches with it)
  util-linux procps python3 python3-yaml git
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: need root to install packages" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "install-deps: all Debian packages present"
fi

"$here/install-criu.sh"
