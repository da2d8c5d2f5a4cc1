#!/usr/bin/env bash
# The C ABI tests: builds libkiln.a, compiles every tests/capi/*.c as C11 with all
# warnings as errors, and runs each under valgrind (zero errors, zero definite or
# indirect leaks). Part of `make test`; `scripts/test-capi.sh smoke` (`make check`) runs
# only tests/capi/basics.c and graph.c.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
# The feature set of the test build (the Makefile's TEST_FEATURES), so that this reuses it.
$CARGO build --lib --quiet --features cuda,openblas
out=target/capi-tests
mkdir -p "$out"
# What Rust's staticlib needs from the system (`cargo rustc --lib --crate-type staticlib
# -- --print native-static-libs`).
libs="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc -lopenblas"
status=0
sources=(tests/capi/*.c)
[ "${1:-}" = smoke ] && sources=(tests/capi/basics.c tests/capi/graph.c)
for src in "${sources[@]}"; do
  name=$(basename "$src" .c)
  cc -std=c11 -Wall -Wextra -Wpedantic -Werror -Iinclude -Itests/capi "$src" target/debug/libkiln.a $libs -o "$out/$name"
  if ! valgrind --quiet --error-exitcode=1 --leak-check=full \
      --errors-for-leak-kinds=definite,indirect "$out/$name"; then
    echo "test-capi: $name failed"
    status=1
  fi
done
exit $status
