#!/usr/bin/env bash
# The CMake package end to end, as a user would meet it: configure, build and install
# Kiln into a fresh prefix; build the examples/ consumer project against the installed
# package (shared and static flavours) and run them with ctest; then build the C MLP
# example again with only pkg-config's flags. Part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
work=target/cmake-test
rm -rf "$work"
mkdir -p "$work"
prefix=$(pwd)/$work/prefix

cmake -S . -B "$work/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build"
cmake --install "$work/build" --prefix "$prefix" >/dev/null

# The package says whether it has CUDA (this build: without): the config's variable,
# the installed header's macro, and the library itself agree.
cmake -S examples -B "$work/examples" -DCMAKE_PREFIX_PATH="$prefix" > "$work/examples.log"
grep -q "KILN_HAS_CUDA=0" "$work/examples.log" \
  || { echo "test-cmake: the package does not set KILN_HAS_CUDA=0"; exit 1; }
cmake --build "$work/examples" -j 2 >/dev/null
ctest --test-dir "$work/examples" --output-on-failure

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# Static: the archive plus the Libs.private list; shared: the plain flags.
static_libs=$(pkg-config --static --libs-only-l kiln | sed 's/-lkiln//')
cc -std=c11 -Wall -Wextra -Werror examples/c/mlp.c $(pkg-config --cflags kiln) \
  "$prefix/lib/libkiln.a" $static_libs -o "$work/mlp_pkgconfig"
"$work/mlp_pkgconfig" >/dev/null
cc -std=c11 examples/c/mlp.c $(pkg-config --cflags --libs kiln) -lm -Wl,-rpath,"$prefix/lib" -o "$work/mlp_pkgconfig_shared"
"$work/mlp_pkgconfig_shared" >/dev/null
printf '#include "kiln.h"\nint main(void) { return KILN_HAS_CUDA == 0 && kiln_has_cuda() == 0 ? 0 : 1; }\n' > "$work/has_cuda.c"
cc -std=c11 -Wall -Werror "$work/has_cuda.c" $(pkg-config --cflags --libs kiln) -Wl,-rpath,"$prefix/lib" -o "$work/has_cuda"
"$work/has_cuda" || { echo "test-cmake: KILN_HAS_CUDA or kiln_has_cuda() is not 0"; exit 1; }
echo "test-cmake: install, find_package (shared + static), ctest, pkg-config and KILN_HAS_CUDA all passed"
