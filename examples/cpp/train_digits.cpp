// The C++ twin of examples/c/train_digits.c, through kiln.hpp: an MLP and a small CNN
// trained on the UCI handwritten digits (examples/data/digits.bin, made by
// scripts/make-digits.py) with Adam, evaluated on a separate inference graph whose
// weights are copied from the training executable by name, then checkpointed and
// reloaded into a fresh executable. See the C version for the reasons behind the design
// (an inference graph of its own; the CNN's fixed batch).
//
// Usage: train_digits [digits.bin [checkpoint-dir [backend [mlp|cnn]]]]. Exits non-zero
// if the MLP's test accuracy is below 97% or the CNN's below 98%, or on any error.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "kiln.hpp"

#ifndef KILN_DIGITS_PATH
#define KILN_DIGITS_PATH "examples/data/digits.bin"
#endif

namespace {

constexpr int kPixels = 64;
constexpr int kClasses = 10;
constexpr int kBatch = 64;

struct Split {
  int n = 0;
  std::vector<float> x;     // n × 64 pixels scaled to [0, 1]
  std::vector<std::int64_t> y;  // n labels 0..9
};

std::uint32_t le32(const unsigned char *p) {
  return std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 24;
}

// The layout is documented in scripts/make-digits.py.
void load_digits(const std::string &path, Split &train, Split &test) {
  std::ifstream f(path, std::ios::binary);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto bad = [&] { return std::runtime_error(path + ": not a digits file (see scripts/make-digits.py)"); };
  if (bytes.size() < 24 || std::memcmp(bytes.data(), "KDIGITS1", 8) != 0 || le32(&bytes[16]) != 8 ||
      le32(&bytes[20]) != 8)
    throw bad();
  std::size_t at = 24;
  for (Split *s : {&train, &test}) {
    s->n = int(le32(&bytes[s == &train ? 8 : 12]));
    if (bytes.size() < at + std::size_t(s->n) * (kPixels + 1)) throw bad();
    for (int i = 0; i < s->n * kPixels; i++) s->x.push_back(float(bytes[at + i]) / 16.0f);
    at += std::size_t(s->n) * kPixels;
    for (int i = 0; i < s->n; i++) s->y.push_back(bytes[at + i]);
    at += std::size_t(s->n);
  }
}

// splitmix64: the same stream as the C example's, so both start from the same weights.
struct Rng {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float symmetric() { return float(next() >> 40) / float(1 << 23) - 1.0f; }  // [-1, 1)
  void shuffle(std::vector<int> &order) {
    for (int i = int(order.size()) - 1; i > 0; i--) std::swap(order[i], order[next() % std::uint64_t(i + 1)]);
  }
};

struct Model {
  std::string name;
  bool cnn;
  int epochs;
  float lr;
  double target;
};

// A model's weights in creation order (the same names in the training and inference
// graphs).
struct Weights {
  std::vector<kiln_value> values;
  std::vector<std::string> names;
  std::size_t count = 0;

  // He-uniform (bound sqrt(6 / fan_in)) when fan_in > 0, else zeros.
  kiln_value add(kiln::Graph &g, Rng &rng, const std::string &name, const std::vector<std::int64_t> &dims,
                 int fan_in) {
    std::size_t n = 1;
    for (auto d : dims) n *= std::size_t(d);
    std::vector<float> init(n, 0.0f);
    const float bound = fan_in > 0 ? std::sqrt(6.0f / float(fan_in)) : 0.0f;
    if (fan_in > 0)
      for (auto &v : init) v = bound * rng.symmetric();
    values.push_back(g.add_variable(name, dims, init));
    names.push_back(name);
    count += n;
    return values.back();
  }
};

kiln_value add_images(kiln::Graph &g, const Model &m, std::int64_t batch) {
  if (m.cnn) return g.add_parameter("x", KILN_DTYPE_F32, {batch, 1, 8, 8}, {"batch", "", "", ""});
  return g.add_parameter("x", KILN_DTYPE_F32, {batch, kPixels}, {"batch", ""});
}

kiln_value add_layers(kiln::Graph &g, const Model &m, Rng &rng, kiln_value x, Weights &w) {
  if (!m.cnn) {  // 64 → 128 → ReLU → 10
    auto w1 = w.add(g, rng, "w1", {kPixels, 128}, kPixels);
    auto b1 = w.add(g, rng, "b1", {128}, 0);
    auto w2 = w.add(g, rng, "w2", {128, kClasses}, 128);
    auto b2 = w.add(g, rng, "b2", {kClasses}, 0);
    auto h = g.op("Relu", {g.op("Gemm", {x, w1, b1})});
    return g.op("Gemm", {h, w2, b2});
  }
  auto c1 = w.add(g, rng, "conv1_w", {16, 1, 3, 3}, 9);
  auto cb1 = w.add(g, rng, "conv1_b", {16}, 0);
  auto c2 = w.add(g, rng, "conv2_w", {32, 16, 3, 3}, 16 * 9);
  auto cb2 = w.add(g, rng, "conv2_b", {32}, 0);
  auto fw = w.add(g, rng, "fc_w", {32 * 16, kClasses}, 32 * 16);
  auto fb = w.add(g, rng, "fc_b", {kClasses}, 0);
  const kiln::Attr pads("pads", std::vector<std::int64_t>{1, 1, 1, 1});
  auto h = g.op("Relu", {g.op("Conv", {x, c1, cb1}, {pads})});
  h = g.op("MaxPool", {h}, {kiln::Attr("kernel_shape", std::vector<std::int64_t>{2, 2}),
                            kiln::Attr("strides", std::vector<std::int64_t>{2, 2})});
  h = g.op("Flatten", {g.op("Relu", {g.op("Conv", {h, c2, cb2}, {pads})})});
  return g.op("Gemm", {h, fw, fb});
}

std::vector<std::int64_t> image_dims(const Model &m, int n) {
  if (m.cnn) return {n, 1, 8, 8};
  return {n, kPixels};
}

// The test logits and the number classified right.
int evaluate(const Model &m, const kiln::Executable &infer, Split &test, std::vector<float> &logits) {
  auto x = kiln::Tensor::wrap(image_dims(m, test.n), test.x.data(), test.x.size());
  auto out = infer.run({&x});
  auto values = out[0].values<float>();
  logits = values.to_vector();
  int correct = 0;
  for (int i = 0; i < test.n; i++) {
    const float *row = &logits[std::size_t(i) * kClasses];
    correct += std::max_element(row, row + kClasses) - row == test.y[i];
  }
  return correct;
}

void copy_weights(const kiln::Executable &from, const kiln::Executable &to, const Weights &w) {
  for (const auto &name : w.names) to.write_variable(name, from.read_variable(name));
}

bool run_model(const Model &m, Split &train, Split &test, const std::string &ckpt_dir,
               const kiln::CompileOptions &opts) {
  Rng rng{42};
  Weights w, unused;
  kiln::Graph tg, ig;
  {
    // Training: x, labels and lr in, the mean loss out; each run takes one Adam step.
    const std::int64_t batch = -1;
    auto x = add_images(tg, m, batch);
    auto labels = tg.add_parameter("labels", KILN_DTYPE_I64, {batch}, {"batch"});
    auto lr = tg.add_parameter("lr", KILN_DTYPE_F32, {});
    auto logits = add_layers(tg, m, rng, x, w);
    auto loss = tg.op("SoftmaxCrossEntropyLoss", {logits, labels});
    tg.add_optimizer(kiln::Optimizer("adam"), w.values, tg.add_gradients(loss, w.values), lr);
    tg.set_output("loss", loss);
  }
  ig.set_output("logits", add_layers(ig, m, rng, add_images(ig, m, -1), unused));
  auto train_exe = kiln::Executable::compile(tg, &opts);
  auto infer = kiln::Executable::compile(ig, &opts);
  std::printf("%s: %zu weights in %zu variables (+%zu of Adam state), Adam lr %g, batch %d, %d epochs\n",
              m.name.c_str(), w.count, w.names.size(), train_exe.variables().size() - w.names.size(), double(m.lr),
              kBatch, m.epochs);

  std::vector<int> order(std::size_t(train.n));
  for (int i = 0; i < train.n; i++) order[std::size_t(i)] = i;
  std::vector<float> bx(kBatch * kPixels);
  std::vector<std::int64_t> by(kBatch);
  float lr = m.lr;
  auto lr_t = kiln::Tensor::wrap<float>({}, &lr, 1);
  const auto start = std::chrono::steady_clock::now();
  const std::clock_t cpu_start = std::clock();
  for (int e = 1; e <= m.epochs; e++) {
    rng.shuffle(order);
    double total = 0.0;
    int seen = 0;
    for (int s = 0; s < train.n; s += kBatch) {
      const int n = std::min(kBatch, train.n - s);
      for (int i = 0; i < n; i++) {
        const int k = order[std::size_t(s + i)];
        std::copy_n(&train.x[std::size_t(k) * kPixels], kPixels, &bx[std::size_t(i) * kPixels]);
        by[std::size_t(i)] = train.y[std::size_t(k)];
      }
      auto xt = kiln::Tensor::wrap(image_dims(m, n), bx.data(), std::size_t(n) * kPixels);
      auto yt = kiln::Tensor::wrap<std::int64_t>({n}, by.data(), std::size_t(n));
      auto out = train_exe.run({&xt, &yt, &lr_t});
      total += double(out[0].data<float>()[0]) * n;
      seen += n;
    }
    std::printf("%s epoch %2d  loss %.4f\n", m.name.c_str(), e, total / seen);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The process's CPU time too: on a shared machine the wall clock counts the waiting.
  const double cpu_seconds = double(std::clock() - cpu_start) / CLOCKS_PER_SEC;

  std::vector<float> logits, logits2;
  copy_weights(train_exe, infer, w);
  const int correct = evaluate(m, infer, test, logits);
  const double accuracy = 100.0 * correct / test.n;
  std::printf("%s: test accuracy %.2f%% (%d/%d), training %.2f s (%.3f s/epoch), %.2f s of CPU\n", m.name.c_str(),
              accuracy, correct, test.n, seconds, seconds / m.epochs, cpu_seconds);

  // Checkpoint the training state; a fresh executable of the same graph loads it.
  const std::string path = ckpt_dir + "/train_digits_cpp_" + m.name + ".ckpt";
  train_exe.save_checkpoint(path);
  auto fresh = kiln::Executable::compile(tg, &opts);
  auto fresh_infer = kiln::Executable::compile(ig, &opts);
  fresh.load_checkpoint(path);
  copy_weights(fresh, fresh_infer, w);
  const int correct2 = evaluate(m, fresh_infer, test, logits2);
  const bool same = correct2 == correct && logits == logits2;
  std::printf("%s: checkpoint %s reloaded into a fresh executable: test accuracy %.2f%%, logits %s\n",
              m.name.c_str(), path.c_str(), 100.0 * correct2 / test.n, same ? "identical" : "DIFFERENT");
  std::remove(path.c_str());
  if (accuracy < m.target)
    std::fprintf(stderr, "%s: test accuracy %.2f%% is below %.0f%%\n", m.name.c_str(), accuracy, m.target);
  return same && accuracy >= m.target;
}

}  // namespace

#ifndef MLP_EPOCHS
#define MLP_EPOCHS 20
#endif
#ifndef CNN_EPOCHS
#define CNN_EPOCHS 10
#endif

int main(int argc, char **argv) {
  try {
    const std::string data = argc > 1 ? argv[1] : KILN_DIGITS_PATH;
    const std::string ckpt_dir = argc > 2 ? argv[2] : ".";
    const std::string backend = argc > 3 ? argv[3] : "cpu";
    const std::string only = argc > 4 ? argv[4] : "";
    Split train, test;
    load_digits(data, train, test);
    std::printf("Kiln %s on %s: digits %d train / %d test (%s)\n", kiln_version_string(), backend.c_str(), train.n,
                test.n, data.c_str());
    kiln::CompileOptions opts;
    opts.backend(backend);
    const Model models[] = {
        {"mlp", false, MLP_EPOCHS, 0.003f, 97.0},
        {"cnn", true, CNN_EPOCHS, 0.003f, 98.0},
    };
    bool ok = true;
    for (const auto &m : models)
      if (only.empty() || only == m.name) ok = run_model(m, train, test, ckpt_dir, opts) && ok;
    return ok ? 0 : 1;
  } catch (const std::exception &e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
