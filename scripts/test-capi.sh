#!/usr/bin/env bash
# The C ABI tests: builds libkiln.a, compiles every tests/capi/*.c as C11 with all
# warnings as errors, and runs each under valgrind (zero errors, zero definite or
# indirect leaks). Part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
$CARGO build --lib --quiet
out=target/capi-tests
mkdir -p "$out"
# What Rust's staticlib needs from the system (`cargo rustc --lib --crate-type staticlib
# -- --print native-static-libs`).
libs="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
status=0
for src in tests/capi/*.c; do
  name=$(basename "$src" .c)
  cc -std=c11 -Wall -Wextra -Wpedantic -Werror -Iinclude -Itests/capi "$src" target/debug/libkiln.a $libs -o "$out/$name"
  if ! valgrind --quiet --error-exitcode=1 --leak-check=full \
      --errors-for-leak-kinds=definite,indirect "$out/$name"; then
    echo "test-capi: $name failed"
    status=1
  fi
done
exit $status
