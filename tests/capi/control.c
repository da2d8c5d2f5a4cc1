/* Control flow built from C: If and Loop with body graphs (copied: the caller frees
 * them right away), run on cpu and interp, and the error paths. */
#include <stdint.h>

#include "check.h"

static kiln_attr int_attr(const char *name, int64_t v) {
  kiln_attr a;
  memset(&a, 0, sizeof a);
  a.name = name;
  a.kind = KILN_ATTR_INT;
  a.i = v;
  return a;
}

static const int64_t three[1] = {3};

/* A branch: x -> x * scale (scale != 0) or -x. */
static kiln_graph *branch(float scale) {
  kiln_graph *b = NULL;
  OK(kiln_graph_new(&b));
  kiln_value x, c, y;
  size_t n = 0;
  OK(kiln_graph_add_parameter(b, "x", KILN_DTYPE_F32, three, NULL, 1, &x));
  if (scale != 0.0f) {
    OK(kiln_graph_add_constant(b, "s", KILN_DTYPE_F32, NULL, 0, &scale, sizeof scale, &c));
    kiln_value in[2] = {x, c};
    OK(kiln_graph_add_op(b, "Mul", in, 2, NULL, 0, &y, 1, &n));
  } else {
    OK(kiln_graph_add_op(b, "Neg", &x, 1, NULL, 0, &y, 1, &n));
  }
  OK(kiln_graph_set_output(b, "y", y));
  return b;
}

/* Runs `g` (inputs: bool c, f32[3] x) on `backend`; writes the f32[3] result. */
static void run(kiln_graph *g, const char *backend, int cond, float *out) {
  kiln_compile_options *o = NULL;
  OK(kiln_compile_options_new(&o));
  OK(kiln_compile_options_set_backend(o, backend));
  kiln_executable *e = NULL;
  OK(kiln_compile(g, o, &e));
  kiln_compile_options_free(o);
  kiln_tensor *c = NULL, *x = NULL, *y = NULL;
  OK(kiln_tensor_new(KILN_DTYPE_BOOL, NULL, 0, &c));
  *(uint8_t *)kiln_tensor_data(c) = (uint8_t)cond;
  OK(kiln_tensor_new(KILN_DTYPE_F32, three, 1, &x));
  float *xd = kiln_tensor_data(x);
  for (int i = 0; i < 3; i++) xd[i] = (float)i - 1.0f;
  const kiln_tensor *ins[2] = {c, x};
  OK(kiln_executable_run(e, ins, 2, &y, 1));
  if (y) memcpy(out, kiln_tensor_data(y), 3 * sizeof(float));
  kiln_tensor_free(y);
  kiln_tensor_free(x);
  kiln_tensor_free(c);
  kiln_executable_free(e);
}

static void if_from_c(void) {
  kiln_graph *g = NULL;
  OK(kiln_graph_new(&g));
  kiln_value c, x, y;
  size_t n = 0;
  OK(kiln_graph_add_parameter(g, "c", KILN_DTYPE_BOOL, NULL, NULL, 0, &c));
  OK(kiln_graph_add_parameter(g, "x", KILN_DTYPE_F32, three, NULL, 1, &x));
  kiln_graph *then_g = branch(3.0f), *else_g = branch(0.0f);
  kiln_graph_attr graphs[2] = {{"then_branch", then_g}, {"else_branch", else_g}};
  kiln_attr captures = int_attr("captures", 1);
  kiln_value ins[2] = {c, x};

  /* Errors first: nothing is added. */
  kiln_value out = {7, 7};
  kiln_graph_attr null_graph[2] = {{"then_branch", NULL}, {"else_branch", else_g}};
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "graphs[0] ('then_branch').graph", kiln_graph_add_op_with_graphs(g, "If", ins, 2, &captures, 1, null_graph, 2, &out, 1, &n));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "graphs", kiln_graph_add_op_with_graphs(g, "If", ins, 2, &captures, 1, NULL, 2, &out, 1, &n));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "g is NULL", kiln_graph_add_op_with_graphs(NULL, "If", ins, 2, &captures, 1, graphs, 2, &out, 1, &n));
  kiln_graph_attr twice[2] = {{"then_branch", then_g}, {"then_branch", else_g}};
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "given twice", kiln_graph_add_op_with_graphs(g, "If", ins, 2, &captures, 1, twice, 2, &out, 1, &n));
  kiln_attr body_as_int = int_attr("then_branch", 1);
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "given twice", kiln_graph_add_op_with_graphs(g, "If", ins, 2, &body_as_int, 1, graphs, 2, &out, 1, &n));
  /* Without the captures attribute x is not a body parameter: the branches do not fit. */
  EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "If", kiln_graph_add_op_with_graphs(g, "If", ins, 2, NULL, 0, graphs, 2, &out, 1, &n));
  CHECK(out.node == 7);

  OK(kiln_graph_add_op_with_graphs(g, "If", ins, 2, &captures, 1, graphs, 2, &y, 1, &n));
  CHECK(n == 1);
  /* The bodies were copied: freeing them now leaves the graph whole. */
  kiln_graph_free(then_g);
  kiln_graph_free(else_g);
  OK(kiln_graph_set_output(g, "y", y));
  const char *backends[2] = {"cpu", "interp"};
  for (int b = 0; b < 2; b++) {
    float r[3] = {0, 0, 0};
    run(g, backends[b], 1, r);
    CHECK(r[0] == -3.0f && r[1] == 0.0f && r[2] == 3.0f);
    run(g, backends[b], 0, r);
    CHECK(r[0] == 1.0f && r[1] == 0.0f && r[2] == -1.0f);
  }
  kiln_graph_free(g);
}

/* Branches of different ranks (f32[3] and a scalar): the result's rank is unknown until
 * the run, which says so through the type queries, and still runs. */
static void if_of_unknown_rank(void) {
  kiln_graph *g = NULL;
  OK(kiln_graph_new(&g));
  kiln_value c, x, y;
  size_t n = 0;
  OK(kiln_graph_add_parameter(g, "c", KILN_DTYPE_BOOL, NULL, NULL, 0, &c));
  OK(kiln_graph_add_parameter(g, "x", KILN_DTYPE_F32, three, NULL, 1, &x));
  kiln_graph *then_g = branch(3.0f), *else_g = NULL;
  OK(kiln_graph_new(&else_g));
  kiln_value p, s;
  float one = 1.0f;
  OK(kiln_graph_add_parameter(else_g, "x", KILN_DTYPE_F32, three, NULL, 1, &p));
  OK(kiln_graph_add_constant(else_g, "one", KILN_DTYPE_F32, NULL, 0, &one, sizeof one, &s));
  OK(kiln_graph_set_output(else_g, "y", s));
  kiln_graph_attr graphs[2] = {{"then_branch", then_g}, {"else_branch", else_g}};
  kiln_attr captures = int_attr("captures", 1);
  kiln_value ins[2] = {c, x};
  OK(kiln_graph_add_op_with_graphs(g, "If", ins, 2, &captures, 1, graphs, 2, &y, 1, &n));
  kiln_graph_free(then_g);
  kiln_graph_free(else_g);
  OK(kiln_graph_set_output(g, "y", y));
  kiln_dtype dtype = KILN_DTYPE_INVALID;
  size_t rank = 0;
  int64_t dims[4] = {-7, -7, -7, -7};
  OK(kiln_graph_value_type(g, y, &dtype, dims, 4, &rank));
  CHECK(dtype == KILN_DTYPE_F32 && rank == KILN_RANK_UNKNOWN && dims[0] == -7);
  const char *backends[2] = {"cpu", "interp"};
  for (int b = 0; b < 2; b++) {
    kiln_compile_options *o = NULL;
    OK(kiln_compile_options_new(&o));
    OK(kiln_compile_options_set_backend(o, backends[b]));
    kiln_executable *e = NULL;
    OK(kiln_compile(g, o, &e));
    kiln_compile_options_free(o);
    rank = 0;
    OK(kiln_executable_output_info(e, 0, NULL, NULL, NULL, &rank));
    CHECK(rank == KILN_RANK_UNKNOWN);
    kiln_executable_free(e);
    float r[3] = {0, 0, 0};
    run(g, backends[b], 1, r);
    CHECK(r[0] == -3.0f && r[1] == 0.0f && r[2] == 3.0f);
  }
  kiln_graph_free(g);
}

/* acc <- acc + x, five times, from acc = x: 6x. */
static void loop_from_c(void) {
  kiln_graph *body = NULL;
  OK(kiln_graph_new(&body));
  kiln_value i, cond, acc, bx, sum;
  size_t n = 0;
  OK(kiln_graph_add_parameter(body, "i", KILN_DTYPE_I64, NULL, NULL, 0, &i));
  OK(kiln_graph_add_parameter(body, "cond", KILN_DTYPE_BOOL, NULL, NULL, 0, &cond));
  OK(kiln_graph_add_parameter(body, "acc", KILN_DTYPE_F32, three, NULL, 1, &acc));
  OK(kiln_graph_add_parameter(body, "x", KILN_DTYPE_F32, three, NULL, 1, &bx));
  kiln_value add_in[2] = {acc, bx};
  OK(kiln_graph_add_op(body, "Add", add_in, 2, NULL, 0, &sum, 1, &n));
  OK(kiln_graph_set_output(body, "cond", cond));
  OK(kiln_graph_set_output(body, "acc", sum));

  kiln_graph *g = NULL;
  OK(kiln_graph_new(&g));
  kiln_value c, x, m, outs[2];
  OK(kiln_graph_add_parameter(g, "c", KILN_DTYPE_BOOL, NULL, NULL, 0, &c));
  OK(kiln_graph_add_parameter(g, "x", KILN_DTYPE_F32, three, NULL, 1, &x));
  int64_t five = 5;
  OK(kiln_graph_add_constant(g, "m", KILN_DTYPE_I64, NULL, 0, &five, sizeof five, &m));
  kiln_value ins[4] = {m, c, x, x};
  kiln_attr captures = int_attr("captures", 1);
  kiln_graph_attr graphs[1] = {{"body", body}};
  /* Too small an output array: the count needed, nothing added. */
  EXPECT_STATUS(KILN_STATUS_BUFFER_TOO_SMALL, "1 outputs", kiln_graph_add_op_with_graphs(g, "Loop", ins, 4, &captures, 1, graphs, 1, outs, 0, &n));
  CHECK(n == 1);
  OK(kiln_graph_add_op_with_graphs(g, "Loop", ins, 4, &captures, 1, graphs, 1, outs, 2, &n));
  CHECK(n == 1);
  kiln_graph_free(body);
  OK(kiln_graph_set_output(g, "acc", outs[0]));
  float r[3] = {0, 0, 0};
  run(g, "cpu", 1, r);
  CHECK(r[0] == -6.0f && r[1] == 0.0f && r[2] == 6.0f);
  /* cond false: no iteration. */
  run(g, "cpu", 0, r);
  CHECK(r[0] == -1.0f && r[1] == 0.0f && r[2] == 1.0f);
  kiln_graph_free(g);
}

int main(void) {
  if_from_c();
  if_of_unknown_rank();
  loop_from_c();
  return check_report("control");
}
