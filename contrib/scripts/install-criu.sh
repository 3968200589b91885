#!/usr/bin/env bash
# Builds and installs CRIU 4.2.1 (criu binary, criu-plugin.h, and CRIU's own
# cuda plugin for side-by-side benchmarks) under /usr/local from Debian
# unstable's source package.
#
# Why 4.2.1: bookworm's criu 3.17 fails on current kernels ("Unexpected rt
# vDSO area bounds") and has no PAUSE_DEVICES / CHECKPOINT_DEVICES hooks;
# 4.1.1 cannot dump a TCP or UDP socket on Linux 6.16 and later ("Can't get
# 1:16 opt": SO_PASSCRED is refused there on inet sockets), fixed in 4.2.
#
# The unstable deb-src entry is derived from the machine's own Debian sources
# and used through a private apt configuration, so the machine's package
# lists stay on its own suite. Only the upstream (orig) tarball is used, and
# its SHA-256 is checked against the one pinned here.
#
# The patches in contrib/criu/ (*.patch, in name order) are applied on top;
# `criu --version` then says "GitID: v4.2.1-phos-<id>", <id> the start of the
# SHA-256 of the patches, so a binary says which patches it has. Idempotent:
# criu 4.2.1 with the same GitID is kept; any other is rebuilt.
#
# PHOS_CRIU_UNPATCHED=1 builds criu 4.2.1 without the patches instead (GitID
# "v4.2.1"), the criu binary alone, into PHOS_CRIU_PREFIX (default
# /var/cache/phos-criu/unpatched): the baseline test/bench/criu_pages.sh
# measures the patched one against, which make-bundle.sh carries.
set -euo pipefail

want=4.2.1
suite=unstable
# criu_4.2.1.orig.tar.xz as Debian ships it (its .dsc's Checksums-Sha256).
want_sha256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
cache=${PHOS_CRIU_CACHE:-/var/cache/phos-criu}
unpatched=${PHOS_CRIU_UNPATCHED:-0}
here=$(cd "$(dirname "$0")" && pwd)
patches=()
if [ "$unpatched" = 1 ]; then
  prefix=${PHOS_CRIU_PREFIX:-$cache/unpatched}
  gitid=v$want
else
  prefix=${PHOS_CRIU_PREFIX:-/usr/local}
  for p in "$here"/../criu/*.patch; do [ -f "$p" ] && patches+=("$p"); done
  gitid=v$want
  if [ ${#patches[@]} -gt 0 ]; then
    gitid=v$want-phos-$(cat "${patches[@]}" | sha256sum | cut -c1-12)
  fi
fi

installed() {  # installed KEY: the installed criu's "KEY: value"
  [ -x "$prefix/sbin/criu" ] || return 0
  "$prefix/sbin/criu" --version 2>/dev/null | sed -n "s/^$1: *//p"
}

if [ "$(installed Version)" = "$want" ] && [ "$(installed GitID)" = "$gitid" ] \
   && { [ "$unpatched" = 1 ] || { [ -f "$prefix/include/criu/criu-plugin.h" ] \
                                 && [ -f "$prefix/lib/criu/cuda_plugin.so" ]; }; }; then
  echo "install-criu: criu $want ($gitid) already installed in $prefix"
  exit 0
fi
if ! mkdir -p "$prefix" 2>/dev/null || [ ! -w "$prefix" ] || [ "$(id -u)" -ne 0 ]; then
  echo "install-criu: need root to install criu into $prefix" >&2
  exit 1
fi

# The mirror of the machine's own Debian sources (deb822 or one-line format).
debian_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk '/^URIs:/{u=$2} /^Suites:/{for(i=2;i<=NF;i++) if ($i !~ /-/) s=1}
         /^$/{if(u!="" && s){print u; exit} u=""; s=0}
         END{if(u!="" && s) print u}' "$f" | grep -v security | head -n1
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '$1=="deb" && $3 !~ /-/ {print ($2 ~ /^\[/ ? $3 : $2)}' "$f" | grep -v security | head -n1
  done
}

mkdir -p "$cache"
src_tarball=$(ls "$cache"/criu_"$want".orig.tar.* 2>/dev/null | head -n1 || true)
if [ -z "$src_tarball" ]; then
  mirror=$(debian_mirror | head -n1)
  if [ -z "$mirror" ]; then
    echo "install-criu: cannot find a Debian mirror in /etc/apt sources" >&2
    exit 1
  fi
  aptdir=$(mktemp -d)
  trap 'rm -rf "$aptdir"' EXIT
  mkdir -p "$aptdir/lists/partial" "$aptdir/cache/archives/partial"
  echo "deb-src $mirror $suite main" > "$aptdir/sources.list"
  apt_private=(-oDir::Etc::SourceList="$aptdir/sources.list" -oDir::Etc::SourceParts=/dev/null
               -oDir::State::Lists="$aptdir/lists" -oDir::Cache="$aptdir/cache"
               -oAPT::Get::Only-Source=true)
  echo "install-criu: fetching Debian $suite's criu source"
  apt-get "${apt_private[@]}" update -qq
  version=$(apt-cache "${apt_private[@]}" showsrc criu | sed -n 's/^Version: //p' | grep "^$want" | head -n1 || true)
  if [ -z "$version" ]; then
    echo "install-criu: Debian $suite has no criu $want source package" >&2
    exit 1
  fi
  # The .dsc is not needed: the upstream tarball is enough to build criu.
  (cd "$cache" && apt-get "${apt_private[@]}" source --download-only "criu=$version" >/dev/null 2>&1) || true
  src_tarball=$(ls "$cache"/criu_"$want".orig.tar.* 2>/dev/null | head -n1 || true)
  if [ -z "$src_tarball" ]; then
    echo "install-criu: apt-get source fetched no criu_$want.orig tarball" >&2
    exit 1
  fi
fi

if [ "$(sha256sum "$src_tarball" | cut -d' ' -f1)" != "$want_sha256" ]; then
  echo "install-criu: $src_tarball does not have the SHA-256 pinned for criu $want; removed" >&2
  rm -f "$src_tarball"
  exit 1
fi

# The patched build's tree stays in the cache: criu-zdtm.sh runs CRIU's own
# zdtm tests from it, against the binary installed from it.
if [ "$unpatched" = 1 ]; then
  build=$(mktemp -d)
  trap 'rm -rf "$build" "${aptdir:-}"' EXIT
else
  build=$cache/src/$gitid
  rm -rf "$cache/src" && mkdir -p "$build"
  trap 'rm -rf "${aptdir:-}"' EXIT
fi
tar -xf "$src_tarball" -C "$build"
srcdir=$(find "$build" -mindepth 1 -maxdepth 1 -type d | head -n1)
for p in "${patches[@]}"; do
  echo "install-criu: applying $(basename "$p")"
  # git apply works outside a repository too; --check first, so that a patch
  # that does not apply leaves nothing half-done.
  (cd "$srcdir" && git apply --check -p1 "$p" && git apply -p1 "$p") || {
    echo "install-criu: $(basename "$p") does not apply to criu $want" >&2; exit 1; }
done
make_args=(-C "$srcdir" -j"$(nproc)" GITID="$gitid")
if command -v ccache >/dev/null; then
  make_args+=(CC="ccache gcc")
  export CCACHE_BASEDIR=$build CCACHE_NOHASHDIR=1
fi
echo "install-criu: building criu $want ($gitid, $(nproc) jobs)"
make "${make_args[@]}" criu > "$build/build.log" 2>&1 || {
  tail -n 40 "$build/build.log" >&2; echo "install-criu: build failed" >&2; exit 1; }
if [ "$unpatched" = 1 ]; then
  install -D -m 0755 "$srcdir/criu/criu" "$prefix/sbin/criu"
  echo "install-criu: installed unpatched $("$prefix/sbin/criu" --version | tr '\n' ' ')in $prefix"
  exit 0
fi
make "${make_args[@]}" cuda_plugin >> "$build/build.log" 2>&1 || {
  tail -n 40 "$build/build.log" >&2; echo "install-criu: cuda plugin build failed" >&2; exit 1; }

install -D -m 0755 "$srcdir/criu/criu" "$prefix/sbin/criu"
install -D -m 0644 "$srcdir/criu/include/criu-plugin.h" "$prefix/include/criu/criu-plugin.h"
install -D -m 0644 "$srcdir/plugins/cuda/cuda_plugin.so" "$prefix/lib/criu/cuda_plugin.so"
echo "install-criu: installed $("$prefix/sbin/criu" --version | tr '\n' ' ')in $prefix"
