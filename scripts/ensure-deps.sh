#!/usr/bin/env bash
# Installs what building and testing Kiln needs on a fresh Debian machine (as root), and
# nothing when it is already there. Used by `make demo` and `make test`.
set -euo pipefail

# `--pictures` (make test): also what reads the pictures Kiln draws (graphviz's dot,
# headless Chromium and a font for its screenshots).
pkgs=(libopenblas-dev pkg-config valgrind cmake g++ make python3 python3-venv python3-pip)
[ "${1:-}" = --pictures ] && pkgs+=(graphviz chromium fonts-dejavu-core)
need=()
for pkg in "${pkgs[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "ensure-deps: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "ensure-deps: cargo is required (the stock Rust toolchain)"; exit 1; }
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt >/dev/null 2>&1 || true
