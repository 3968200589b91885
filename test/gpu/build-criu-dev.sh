#!/usr/bin/env bash
# Builds CRIU from a source tree of its development branch (criu-dev) and
# installs it beside, not over, the project's CRIU, for measuring criu's
# CPU-side restore with the development branch (parallel memfd restore and
# native AIO restore of private memory, CRIU pull requests 3021 and 3022).
# The project itself installs CRIU 4.2.1 (contrib/scripts/install-criu.sh);
# make-bundle.sh carries this build as bundle/criu-dev/ when it is there.
#
# The source is not fetched here: it is reachable only where a snapshot of
# checkpoint-restore/criu is at hand (e.g. `git archive criu-dev | tar -x`).
# A tree without .git has no git id; PHOS_CRIU_GITID names it (git describe
# of the snapshot), else criu reports GitID 0.
#
# Usage: build-criu-dev.sh SRC [PREFIX]   (PREFIX: /var/cache/phos-criu-dev)
# Installs PREFIX/bin/criu, PREFIX/include/criu/criu-plugin.h and, if it
# builds, PREFIX/lib/criu/cuda_plugin.so. Built the way install-criu.sh builds
# 4.1.1 (`make criu`, `make cuda_plugin`), in a copy of SRC, which stays as it
# is. Idempotent: a PREFIX built from the same source (and git id) is kept.
set -euo pipefail

if [ $# -lt 1 ] || [ ! -f "$1/Makefile.versions" ] || [ ! -d "$1/criu" ]; then
  echo "usage: $0 CRIU_SOURCE_DIR [PREFIX]" >&2
  exit 2
fi
src=$(cd "$1" && pwd)
prefix=${2:-/var/cache/phos-criu-dev}

gitid=${PHOS_CRIU_GITID:-}
if [ -z "$gitid" ] && [ -e "$src/.git" ]; then gitid=$(git -C "$src" describe --always 2>/dev/null || true); fi
# What the install was built from: the source's content and the git id.
stamp=$( { echo "gitid ${gitid:-0}"
           (cd "$src" && find . -path ./.git -prune -o -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
         } | sha256sum | cut -d' ' -f1)
if [ -x "$prefix/bin/criu" ] && [ "$(cat "$prefix/source.sha256" 2>/dev/null)" = "$stamp" ]; then
  echo "build-criu-dev: $("$prefix/bin/criu" --version | tr '\n' ' ')already installed in $prefix"
  exit 0
fi
if ! mkdir -p "$prefix" 2>/dev/null || [ ! -w "$prefix" ]; then
  echo "build-criu-dev: cannot write $prefix (root?)" >&2; exit 1
fi

build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
cp -a "$src/." "$build/"
make_args=(-C "$build" -j"$(nproc)")
[ -n "$gitid" ] && make_args+=(GITID="$gitid")
echo "build-criu-dev: building criu from $src ($(nproc) jobs)"
make "${make_args[@]}" criu > "$build/build.log" 2>&1 || {
  tail -n 40 "$build/build.log" >&2; echo "build-criu-dev: build failed" >&2; exit 1; }
install -D -m 0755 "$build/criu/criu" "$prefix/bin/criu"
install -D -m 0644 "$build/criu/include/criu-plugin.h" "$prefix/include/criu/criu-plugin.h"
if make "${make_args[@]}" cuda_plugin >> "$build/build.log" 2>&1; then
  install -D -m 0644 "$build/plugins/cuda/cuda_plugin.so" "$prefix/lib/criu/cuda_plugin.so"
else
  tail -n 20 "$build/build.log" >&2
  echo "build-criu-dev: CRIU's cuda plugin did not build; criu alone installed" >&2
  rm -f "$prefix/lib/criu/cuda_plugin.so"
fi
echo "$stamp" > "$prefix/source.sha256"
echo "build-criu-dev: installed $("$prefix/bin/criu" --version | tr '\n' ' ')in $prefix"
