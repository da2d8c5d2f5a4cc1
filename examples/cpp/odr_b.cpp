// The second translation unit of the ODR check (see odr_a.cpp).
#include "kiln.hpp"

std::string text_of_b() {
  kiln::Graph g;
  auto x = g.add_parameter("x", KILN_DTYPE_F32, {2});
  g.set_output("y", g.op("Neg", {x}));
  return g.to_text();
}
