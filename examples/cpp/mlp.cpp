// The MLP of examples/c/mlp.c through kiln.hpp: RAII handles, exceptions, typed data.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

#include "kiln.hpp"

int main() try {
  const int in = 4, hidden = 8, out = 3, batch = 2;
  std::vector<float> w1(in * hidden), b1(hidden), w2(hidden * out), b2(out);
  for (int i = 0; i < in * hidden; i++) w1[i] = float((i * 7) % 11 - 5) * 0.1f;
  for (int i = 0; i < hidden; i++) b1[i] = float(i % 3 - 1) * 0.05f;
  for (int i = 0; i < hidden * out; i++) w2[i] = float((i * 5) % 9 - 4) * 0.15f;
  for (int i = 0; i < out; i++) b2[i] = float(i) * 0.1f;

  kiln::Graph g;
  auto x = g.add_parameter("x", KILN_DTYPE_F32, {-1, in}, {"batch", ""});
  auto h = g.op("MatMul", {x, g.add_constant("w1", {in, hidden}, w1)});
  h = g.op("Relu", {g.op("Add", {h, g.add_constant("b1", {hidden}, b1)})});
  h = g.op("Add", {g.op("MatMul", {h, g.add_constant("w2", {hidden, out}, w2)}), g.add_constant("b2", {out}, b2)});
  g.set_output("probs", g.op("Softmax", {h}, {kiln::Attr("axis", -1)}));

  kiln::CompileOptions options;
  // The cpu backend optimizes first: MatMul + bias + Relu become one FusedMatMul.
  options.backend("cpu").option("passes", "canonicalize,constant-fold,simplify,cse,fuse,dce");
  auto exe = kiln::Executable::compile(g, &options);
  std::cout << "inputs: " << exe.input(0).name << ", outputs: " << exe.output(0).name << "\n";

  auto input = kiln::Tensor::from<float>({batch, in}, {0.5f, -1.0f, 2.0f, 0.25f, 1.5f, 0.0f, -0.5f, 1.0f});
  auto outputs = exe.run({&input});
  auto probs = outputs.at(0).values<float>();

  // Plain C++ reference.
  const float *xd = input.data<float>();
  int bad = 0;
  for (int b = 0; b < batch; b++) {
    std::vector<float> hid(hidden), logits(out);
    for (int j = 0; j < hidden; j++) {
      float acc = b1[j];
      for (int i = 0; i < in; i++) acc += xd[b * in + i] * w1[i * hidden + j];
      hid[j] = acc > 0 ? acc : 0;
    }
    float mx = -INFINITY, sum = 0;
    for (int k = 0; k < out; k++) {
      float acc = b2[k];
      for (int j = 0; j < hidden; j++) acc += hid[j] * w2[j * out + k];
      logits[k] = acc;
      mx = std::fmax(mx, acc);
    }
    for (int k = 0; k < out; k++) sum += std::exp(logits[k] - mx);
    std::cout << "probs[" << b << "] =";
    for (int k = 0; k < out; k++) {
      float want = std::exp(logits[k] - mx) / sum;
      std::cout << " " << probs[b * out + k];
      if (std::fabs(probs[b * out + k] - want) > 1e-5f) bad = 1;
    }
    std::cout << "\n";
  }

  // Errors are exceptions carrying the status and the message.
  try {
    g.op("Frobnicate", {x});
    bad = 1;
  } catch (const kiln::Error &e) {
    if (e.status() != KILN_STATUS_UNKNOWN_OP) bad = 1;
    std::cout << "expected error: " << e.what() << "\n";
  }
  return bad;
} catch (const kiln::Error &e) {
  std::cerr << e.what() << "\n";
  return 1;
}
