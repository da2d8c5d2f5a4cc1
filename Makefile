# The two entry points of the README. Each installs what it needs first.
CARGO ?= cargo
DEMO_OUT := target/demo

.PHONY: demo test deps lint

deps:
	@scripts/ensure-deps.sh

# The main job: what Kiln is for, in two parts.
# 1. A real ONNX model (a digits CNN written as PyTorch exports it, made by
#    scripts/make-digits-cnn.py) imported, optimized and memory-planned for the cpu
#    backend (ops left, naive vs planned arena bytes), run on 16 test images (their
#    labels: 7 9 4 7 0 2 6 1 3 1 3 7 3 6 7 1), and timed.
# 2. Training through the C library: examples/c/train_digits.c builds an MLP graph
#    through the C ABI, differentiates it, and trains it with Adam on the digits,
#    printing the loss per epoch and the test accuracy.
DEMO_MODEL := examples/data/digits_cnn.onnx
demo: deps
	$(CARGO) build --release --bin kiln --lib
	@echo; echo "== import, optimize and plan $(DEMO_MODEL) for cpu (batch 16)"
	target/release/kiln info $(DEMO_MODEL)
	target/release/kiln compile $(DEMO_MODEL) --shape batch=16
	@echo; echo "== run it on 16 test digits (true labels: 7 9 4 7 0 2 6 1 3 1 3 7 3 6 7 1)"
	target/release/kiln run $(DEMO_MODEL) --inputs examples/data/digits_test16.npy --outputs $(DEMO_OUT) --print
	@echo; echo "== latency on cpu, batch 16 and batch 1"
	target/release/kiln bench $(DEMO_MODEL) --inputs examples/data/digits_test16.npy --threads 1
	target/release/kiln bench $(DEMO_MODEL) --shape batch=1 --threads 1
	@echo; echo "== train an MLP on the digits through the C ABI (examples/c/train_digits.c)"
	mkdir -p $(DEMO_OUT)
	cc -std=c11 -O2 -Iinclude examples/c/train_digits.c -Ltarget/release -lkiln \
	  -Wl,-rpath,$(CURDIR)/target/release -lm -o $(DEMO_OUT)/train_digits
	$(DEMO_OUT)/train_digits examples/data/digits.bin $(DEMO_OUT) cpu mlp

lint: deps
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) clippy --all-targets --features cuda -- -D warnings
	$(CARGO) clippy --all-targets --features openblas -- -D warnings
	$(CARGO) fmt --check --manifest-path bindings/python/Cargo.toml
	CARGO_TARGET_DIR=$(CURDIR)/target/python $(CARGO) clippy --manifest-path bindings/python/Cargo.toml -- -D warnings

# Every test: format, lints, what reads the pictures Kiln draws (graphviz, Chromium), exporter-style ONNX models against onnxruntime (before and
# after the pass pipeline; they stay in target/real-models for the compiler's tests), the
# zoo of real models from PyPI packages (tests/zoo/README.md; in release; required under CI=true),
# the Rust suites (the CPU backend's again on its portable kernels; the GEMM's comparison
# with OpenBLAS under the `openblas` feature, which the library itself never links; the CUDA backend's
# tests built with the `cuda` feature: NVRTC + ptxas from pinned wheels, device tests
# that skip without a GPU; snapshots must match: no .snap.new may be left; the ONNX node suite
# is generated first, by a pinned onnx in target/py), the C ABI tests under valgrind,
# the Python package (pip-installed into a fresh venv: pytest, valgrind),
# the CMake package (install, find_package from a consumer, shared and static, ctest,
# pkg-config), and the demo model under valgrind on both backends so that the CLI path
# is leak- and error-free.
test: lint
	scripts/ensure-deps.sh --pictures
	scripts/onnx-node-tests.sh
	scripts/contrib-cases.sh
	scripts/test-onnx-models.sh
	scripts/model-zoo.sh
	INSTA_UPDATE=no KILN_REQUIRE=onnx-suite,contrib-cases,avx512f,cuda-tools,gxx,chromium,graphviz $(CARGO) test --all-targets
	KILN_REQUIRE=$${CI:+zoo} $(CARGO) test --release --test zoo
	KILN_CPU_ISA=portable $(CARGO) test --test cpu_backend
	$(CARGO) test --features openblas --lib gemm
	env=$$(scripts/cuda-tools.sh) && eval "$$env" && KILN_REQUIRE=onnx-suite,cuda-tools,gxx $(CARGO) test --features cuda --test cuda_nvrtc --test cuda_device --test cuda_cli
	@if find . -name '*.snap.new' -not -path './target/*' | grep -q .; then \
	  echo "stale insta snapshots (review with cargo insta review):"; \
	  find . -name '*.snap.new' -not -path './target/*'; exit 1; fi
	scripts/test-capi.sh
	scripts/test-python.sh
	scripts/test-cmake.sh
	$(CARGO) build --bin kiln
	for backend in cpu interp; do \
	  valgrind --quiet --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect \
	    target/debug/kiln run $(DEMO_MODEL) --inputs examples/data/digits_test16.npy --backend $$backend \
	    --outputs $(DEMO_OUT)/$$backend || exit 1; \
	done
