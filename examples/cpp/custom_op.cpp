// An external op from C++: a class with `infer`, `compute` and `gradient` members
// registered by kiln::register_op as the op com.example::ScaledSwish
// (y = x * sigmoid(beta * x)); an MLP using it is imported from ONNX
// (examples/data/swish_mlp.onnx, written by scripts/make-swish-mlp.py) and trained a
// few steps beside the same MLP built from built-in ops. Losses and gradients must agree.
//
//   custom_op_cpp [path/to/swish_mlp.onnx]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "kiln.hpp"

#ifndef KILN_SWISH_MLP_PATH
#define KILN_SWISH_MLP_PATH "examples/data/swish_mlp.onnx"
#endif

namespace {

constexpr std::int64_t N = 16, IN = 4, HID = 8, OUT = 3;
constexpr double BETA = 1.5;
constexpr float LR = 0.2f;
constexpr int STEPS = 5;

struct ScaledSwish {
  void infer(kiln::InferContext &ctx) {
    if (ctx.input_dtype(0) != KILN_DTYPE_F32) throw kiln::Error(KILN_STATUS_INVALID_GRAPH, "ScaledSwish computes f32 only");
    ctx.set_output_like(0, 0);
  }

  void compute(kiln::KernelContext &ctx) {
    const float beta = static_cast<float>(ctx.attrs().get_float("beta", 1.0));
    kiln_tensor_view x = ctx.input(0);
    kiln_tensor_view y = ctx.output(0, x.dims, x.rank);
    std::size_t n = 1;
    for (std::uint32_t k = 0; k < x.rank; k++) n *= static_cast<std::size_t>(x.dims[k]);
    const float *xs = static_cast<const float *>(x.data);
    float *ys = static_cast<float *>(y.data);
    for (std::size_t i = 0; i < n; i++) ys[i] = xs[i] / (1.0f + std::exp(-beta * xs[i]));
  }

  // dL/dx = dL/dy * (s + beta x s (1 - s)), s = sigmoid(beta x).
  void gradient(kiln::GradientContext &ctx, kiln::Graph &g) {
    const float beta = static_cast<float>(ctx.attrs().get_float("beta", 1.0));
    kiln_value x = ctx.input(0), gy = ctx.output_grad(0);
    kiln_value bx = g.op("Mul", {x, g.add_constant<float>("", {}, {beta})});
    kiln_value s = g.op("Sigmoid", {bx});
    kiln_value one_minus = g.op("Sub", {g.add_constant<float>("", {}, {1.0f}), s});
    kiln_value d = g.op("Add", {s, g.op("Mul", {g.op("Mul", {bx, s}), one_minus})});
    ctx.set_input_grad(0, g.op("Mul", {gy, d}));
  }
};

// loss = mean((y - t)^2) and its gradients with respect to params[1..4], as outputs
// after y.
void add_training(kiln::Graph &g, kiln_value y, const std::vector<kiln_value> &params) {
  kiln_value t = g.add_parameter("t", KILN_DTYPE_F32, {N, OUT});
  kiln_value d = g.op("Sub", {y, t});
  kiln_value loss = g.op("ReduceMean", {g.op("Mul", {d, d})}, {kiln::Attr("keepdims", 0)});
  auto grads = g.add_gradients(loss, {params.begin() + 1, params.end()});
  g.set_output("loss", loss);
  const char *names[4] = {"dW1", "db1", "dW2", "db2"};
  for (int i = 0; i < 4; i++) g.set_output(names[i], grads[i]);
}

kiln::Graph imported(const std::string &path) {
  kiln::Graph g = kiln::Graph::import_onnx(path);
  std::vector<kiln_value> params;
  for (std::size_t i = 0; i < 5; i++) params.push_back(g.input_value(i));
  add_training(g, g.output_value(0), params);
  return g;
}

kiln::Graph builtin() {
  kiln::Graph g;
  std::vector<kiln_value> p = {g.add_parameter("x", KILN_DTYPE_F32, {-1, IN}, {"N", ""}),
                               g.add_parameter("W1", KILN_DTYPE_F32, {IN, HID}),
                               g.add_parameter("b1", KILN_DTYPE_F32, {HID}),
                               g.add_parameter("W2", KILN_DTYPE_F32, {HID, OUT}),
                               g.add_parameter("b2", KILN_DTYPE_F32, {OUT})};
  kiln_value h = g.op("Add", {g.op("MatMul", {p[0], p[1]}), p[2]});
  kiln_value beta = g.add_constant<float>("beta", {}, {static_cast<float>(BETA)});
  kiln_value a = g.op("Mul", {h, g.op("Sigmoid", {g.op("Mul", {h, beta})})});
  kiln_value y = g.op("Add", {g.op("MatMul", {a, p[3]}), p[4]});
  g.set_output("y", y);
  add_training(g, y, p);
  return g;
}

struct Model {
  std::vector<std::vector<float>> weights;  // W1, b1, W2, b2
  kiln::Executable exe;
};

// One step: the loss and gradients at the weights, then SGD. Returns the loss; `grads`
// gets the gradients.
float step(Model &m, std::vector<float> &x, std::vector<float> &t, std::vector<std::vector<float>> &grads) {
  const std::vector<std::vector<std::int64_t>> dims = {{IN, HID}, {HID}, {HID, OUT}, {OUT}};
  kiln::Tensor xt = kiln::Tensor::wrap<float>({N, IN}, x.data(), x.size());
  kiln::Tensor tt = kiln::Tensor::wrap<float>({N, OUT}, t.data(), t.size());
  std::vector<kiln::Tensor> ws;
  for (int i = 0; i < 4; i++) ws.push_back(kiln::Tensor::wrap<float>(dims[i], m.weights[i].data(), m.weights[i].size()));
  auto outs = m.exe.run({&xt, &ws[0], &ws[1], &ws[2], &ws[3], &tt});
  float loss = outs[1].values<float>()[0];
  grads.clear();
  for (int i = 0; i < 4; i++) {
    auto g = outs[i + 2].values<float>();
    grads.push_back(g.to_vector());
    for (std::size_t k = 0; k < g.size(); k++) m.weights[i][k] -= LR * g[k];
  }
  return loss;
}

}  // namespace

int main(int argc, char **argv) {
  try {
    const std::string path = argc > 1 ? argv[1] : KILN_SWISH_MLP_PATH;
    kiln::register_op("com.example", "ScaledSwish",
                      kiln::OpSignature{1, 1, 1, KILN_CUSTOM_OP_PURE | KILN_CUSTOM_OP_MAY_RUN_IN_PLACE}, ScaledSwish{});
    kiln::CompileOptions cpu;
    cpu.backend("cpu");
    std::vector<std::vector<float>> w0;
    const std::size_t sizes[4] = {IN * HID, HID, HID * OUT, OUT};
    for (int i = 0; i < 4; i++) {
      w0.emplace_back(sizes[i]);
      for (std::size_t k = 0; k < sizes[i]; k++) w0[i][k] = 0.4f * std::cos(1.3f * static_cast<float>(k + 7 * i));
    }
    Model custom{w0, kiln::Executable::compile(imported(path), &cpu)};
    Model reference{w0, kiln::Executable::compile(builtin(), &cpu)};

    std::vector<float> x(N * IN), t(N * OUT);
    for (std::size_t i = 0; i < x.size(); i++) x[i] = std::sin(0.7f * static_cast<float>(i)) * 1.5f;
    for (std::int64_t r = 0; r < N; r++)
      for (std::int64_t c = 0; c < OUT; c++) t[r * OUT + c] = std::tanh(x[r * IN + c] - 0.5f * x[r * IN + c + 1]);

    float first = 0, last = 0, worst = 0;
    std::vector<std::vector<float>> gc, gb;
    for (int s = 0; s < STEPS; s++) {
      float lc = step(custom, x, t, gc), lb = step(reference, x, t, gb);
      float diff = std::fabs(lc - lb);
      for (int i = 0; i < 4; i++)
        for (std::size_t k = 0; k < gc[i].size(); k++) diff = std::max(diff, std::fabs(gc[i][k] - gb[i][k]));
      worst = std::max(worst, diff);
      std::printf("step %d: loss %.6f (built-in ops: %.6f), max |difference| %.2e\n", s, lc, lb, diff);
      if (s == 0) first = lc;
      last = lc;
    }
    kiln::unregister_op("com.example", "ScaledSwish");
    const bool ok = worst <= 1e-5f && last < first;
    std::printf("%s: custom op vs built-in ops max difference %.2e; loss %.6f -> %.6f\n", ok ? "ok" : "FAILED", worst,
                first, last);
    return ok ? 0 : 1;
  } catch (const kiln::Error &e) {
    std::fprintf(stderr, "custom_op: %s\n", e.what());
    return 1;
  }
}
