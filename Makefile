# The two entry points of the README. Each installs what it needs first.
CARGO ?= cargo
DEMO_OUT := target/demo

.PHONY: demo test deps lint

deps:
	@scripts/ensure-deps.sh

# The main job: a real graph (a small MLP in .kir text) checked, then run through the
# reference interpreter from the command line, its output written as .npy and printed.
demo: deps
	$(CARGO) build --release --bin kiln
	target/release/kiln check examples/graphs/mlp.kir
	target/release/kiln run examples/graphs/mlp.kir --inputs examples/graphs/mlp_input.npy --outputs $(DEMO_OUT) --print

lint: deps
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) clippy --all-targets --features cuda -- -D warnings

# Every test: format, lints, exporter-style ONNX models against onnxruntime (before and
# after the pass pipeline; they stay in target/real-models for the compiler's tests),
# the Rust suites (the CPU backend's again on its portable kernels; the CUDA backend's
# tests built with the `cuda` feature: NVRTC + ptxas from pinned wheels, device tests
# that skip without a GPU; snapshots must match: no .snap.new may be left; the ONNX node suite
# is generated first, by a pinned onnx in target/py), the C ABI tests under valgrind,
# the CMake package (install, find_package from a consumer, shared and static, ctest,
# pkg-config), and the demo under valgrind so that the CLI path is leak- and error-free.
test: lint
	scripts/onnx-node-tests.sh
	scripts/test-onnx-models.sh
	INSTA_UPDATE=no KILN_REQUIRE=onnx-suite,avx512f,cuda-tools,gxx $(CARGO) test --all-targets
	KILN_CPU_ISA=portable $(CARGO) test --test cpu_backend
	env=$$(scripts/cuda-tools.sh) && eval "$$env" && KILN_REQUIRE=onnx-suite,cuda-tools,gxx $(CARGO) test --features cuda --test cuda_nvrtc --test cuda_device --test cuda_cli
	@if find . -name '*.snap.new' -not -path './target/*' | grep -q .; then \
	  echo "stale insta snapshots (review with cargo insta review):"; \
	  find . -name '*.snap.new' -not -path './target/*'; exit 1; fi
	scripts/test-capi.sh
	scripts/test-cmake.sh
	$(CARGO) build --bin kiln
	valgrind --quiet --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect \
	  target/debug/kiln run examples/graphs/mlp.kir --inputs examples/graphs/mlp_input.npy --outputs $(DEMO_OUT)
