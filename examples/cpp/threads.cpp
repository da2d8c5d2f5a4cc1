// Eight std::threads run one kiln::Executable at once and check every result.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <thread>
#include <vector>

#include "kiln.hpp"

int main() try {
  kiln::Graph g;
  auto x = g.add_parameter("x", KILN_DTYPE_F64, {-1, 2});
  auto w = g.add_constant<double>("w", {2, 2}, {0.5, -1.0, 2.0, 1.5});
  g.set_output("y", g.op("Tanh", {g.op("MatMul", {x, w})}));
  const auto exe = kiln::Executable::compile(g);

  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; t++) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < 100; r++) {
        std::int64_t batch = 1 + (t + r) % 4;
        std::vector<double> xs(batch * 2);
        for (std::size_t i = 0; i < xs.size(); i++) xs[i] = double((t * 13 + r * 3 + int(i)) % 9) * 0.25 - 1.0;
        try {
          auto input = kiln::Tensor::from<double>({batch, 2}, xs);
          auto outputs = exe.run({&input});  // keeps the tensors alive for the views
          auto y = outputs.at(0).values<double>();
          for (std::int64_t b = 0; b < batch; b++) {
            double y0 = std::tanh(xs[b * 2] * 0.5 + xs[b * 2 + 1] * 2.0);
            double y1 = std::tanh(xs[b * 2] * -1.0 + xs[b * 2 + 1] * 1.5);
            if (std::abs(y[b * 2] - y0) > 1e-12 || std::abs(y[b * 2 + 1] - y1) > 1e-12) errors++;
          }
        } catch (const kiln::Error &e) {
          std::cerr << e.what() << "\n";
          errors++;
        }
      }
    });
  }
  for (auto &th : threads) th.join();
  std::cout << "8 threads x 100 runs: " << errors << " errors\n";
  return errors != 0;
} catch (const kiln::Error &e) {
  std::cerr << e.what() << "\n";
  return 1;
}
