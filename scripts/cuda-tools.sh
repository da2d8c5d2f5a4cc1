#!/usr/bin/env bash
# The CUDA toolchain pieces the GPU-less checks need, from the locked PyPI wheels of the
# project venv (scripts/py-env.sh, target/py; scripts/requirements/tests.in): NVRTC (a shared library that cudarc loads
# by name, so its lib/ must be on LD_LIBRARY_PATH before the process starts) and ptxas
# (from the nvcc wheel). Prints the environment the cuda tests need
# as `export` lines: eval "$(scripts/cuda-tools.sh)".
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/py-env.sh)
site=$(cd "$("$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")" && pwd)
nvrtc_lib="$site/nvidia/cuda_nvrtc/lib"
ptxas="$site/nvidia/cuda_nvcc/bin/ptxas"
[ -f "$nvrtc_lib/libnvrtc.so.12" ] || { echo "cuda-tools: no libnvrtc.so.12 in $nvrtc_lib" >&2; exit 1; }
[ -x "$ptxas" ] || { echo "cuda-tools: no ptxas at $ptxas" >&2; exit 1; }
echo "export LD_LIBRARY_PATH=$nvrtc_lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
echo "export KILN_PTXAS=$ptxas"
