#!/usr/bin/env bash
# Sets up a GPU host from bundle/ (see make-bundle.sh): the shared libraries
# the host lacks go on LD_LIBRARY_PATH. Source it, then run the suite.
bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../bundle" && pwd)
mkdir -p "$bundle/lib"
for f in "$bundle/bin/criu" "$bundle/build/plugin/phosctl" "$bundle/build/test/unit/phos-unit-tests"; do
  ldd "$f" | awk '/not found/ {print $1}'
done | sort -u | while read -r lib; do ln -sf "$bundle/lib-all/$lib" "$bundle/lib/$lib"; done
export LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PHOS_BUILD=$bundle/build CRIU=$bundle/bin/criu PHOS_BUNDLE=$bundle
echo "host: $(uname -r), $(. /etc/os-release; echo "$PRETTY_NAME"), carried libs: $(ls "$bundle/lib" | tr '\n' ' ')"
