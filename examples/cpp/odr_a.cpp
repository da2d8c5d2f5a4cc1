// kiln.hpp included in two translation units linked into one program (with odr_b.cpp):
// a non-inline definition in the header would fail to link.
#include "kiln.hpp"

std::string text_of_b();

int main() {
  kiln::Graph g;
  auto x = g.add_parameter("x", KILN_DTYPE_F32, {2});
  g.set_output("y", g.op("Neg", {x}));
  return g.to_text() == text_of_b() ? 0 : 1;
}
