/* Graph building, compiling, running and discovery, with every error path. */
#include <pthread.h>
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

/* y = relu(x * 2 + b), x: f32[batch:-1, 3] */
static kiln_graph *build_axpy(kiln_value *x_out) {
  kiln_graph *g = NULL;
  OK(kiln_graph_new(&g));
  int64_t dims[2] = {-1, 3};
  const char *names[2] = {"batch", NULL};
  kiln_value x, two, b, vals[4];
  size_t n = 0;
  OK(kiln_graph_add_parameter(g, "x", KILN_DTYPE_F32, dims, names, 2, &x));
  float two_v = 2.0f, b_v[3] = {-1.0f, 0.0f, 1.0f};
  int64_t three[1] = {3};
  OK(kiln_graph_add_constant(g, "two", KILN_DTYPE_F32, NULL, 0, &two_v, sizeof two_v, &two));
  OK(kiln_graph_add_constant(g, "b", KILN_DTYPE_F32, three, 1, b_v, sizeof b_v, &b));
  kiln_value mul_in[2] = {x, two};
  OK(kiln_graph_add_op(g, "Mul", mul_in, 2, NULL, 0, vals, 4, &n));
  CHECK(n == 1);
  kiln_value add_in[2] = {vals[0], b};
  OK(kiln_graph_add_op(g, "Add", add_in, 2, NULL, 0, vals, 4, &n));
  OK(kiln_graph_add_op(g, "Relu", vals, 1, NULL, 0, vals, 4, &n));
  OK(kiln_graph_set_output(g, "y", vals[0]));
  if (x_out) *x_out = x;
  return g;
}

static void building_errors(void) {
  kiln_value x;
  kiln_graph *g = build_axpy(&x);
  kiln_value out[2] = {{7, 7}, {7, 7}};
  size_t n = 99;
  EXPECT_STATUS(KILN_STATUS_UNKNOWN_OP, "Frobnicate", kiln_graph_add_op(g, "Frobnicate", &x, 1, NULL, 0, out, 2, &n));
  kiln_attr bad = int_attr("alpha", 1);
  EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "unknown attribute 'alpha'", kiln_graph_add_op(g, "Relu", &x, 1, &bad, 1, out, 2, &n));
  kiln_attr axis_str;
  memset(&axis_str, 0, sizeof axis_str);
  axis_str.name = "axis";
  axis_str.kind = KILN_ATTR_STRING;
  axis_str.s = "last";
  EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "'axis' must be int", kiln_graph_add_op(g, "Softmax", &x, 1, &axis_str, 1, out, 2, &n));
  kiln_attr twice[2] = {int_attr("axis", 0), int_attr("axis", 1)};
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "given twice", kiln_graph_add_op(g, "Softmax", &x, 1, twice, 2, out, 2, &n));
  kiln_attr bad_kind = int_attr("axis", 0);
  bad_kind.kind = 77;
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "not a kiln_attr_kind", kiln_graph_add_op(g, "Softmax", &x, 1, &bad_kind, 1, out, 2, &n));
  kiln_value dangling = {1000, 0};
  EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "1000", kiln_graph_add_op(g, "Relu", &dangling, 1, NULL, 0, out, 2, &n));
  kiln_value wrong_output = {x.node, 5};
  EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, NULL, kiln_graph_add_op(g, "Relu", &wrong_output, 1, NULL, 0, out, 2, &n));
  EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "Add takes 2 inputs", kiln_graph_add_op(g, "Add", &x, 1, NULL, 0, out, 2, &n));
  CHECK(n == 99 && out[0].node == 7); /* nothing written on failure */

  /* Too small an output array: the count needed, and nothing added. */
  kiln_attr split_attrs[1] = {int_attr("num_outputs", 3)};
  EXPECT_STATUS(KILN_STATUS_BUFFER_TOO_SMALL, "3 outputs", kiln_graph_add_op(g, "Split", &x, 1, split_attrs, 1, out, 2, &n));
  CHECK(n == 3);
  kiln_value three[3];
  kiln_attr split3[2] = {int_attr("axis", 1), int_attr("num_outputs", 3)};
  OK(kiln_graph_add_op(g, "Split", &x, 1, split3, 2, three, 3, &n));
  CHECK(n == 3 && three[2].output == 2);

  /* Omitted optional inputs. */
  kiln_value clip_in[3] = {x, {KILN_VALUE_NONE_NODE, 0}, {KILN_VALUE_NONE_NODE, 0}};
  OK(kiln_graph_add_op(g, "Clip", clip_in, 3, NULL, 0, out, 2, &n));

  /* Outputs. */
  EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "'y' already exists", kiln_graph_set_output(g, "y", x));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "needs a name", kiln_graph_set_output(g, "", x));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "name", kiln_graph_set_output(g, NULL, x));
  CHECK(kiln_graph_input_count(g) == 1 && kiln_graph_output_count(g) == 1);

  /* Parameters: names and dims. */
  int64_t bad_dims[1] = {-5};
  kiln_value v = {9, 9};
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "dims[0] is -5", kiln_graph_add_parameter(g, "p", KILN_DTYPE_F32, bad_dims, NULL, 1, &v));
  EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "'x' already exists", kiln_graph_add_parameter(g, "x", KILN_DTYPE_F32, NULL, NULL, 0, &v));
  float data[2] = {1, 2};
  int64_t two[1] = {2};
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "bytes given", kiln_graph_add_constant(g, "c", KILN_DTYPE_F32, two, 1, data, 4, &v));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "not a kiln_dtype", kiln_graph_add_constant(g, "c", 99, two, 1, data, 8, &v));
  CHECK(v.node == 9);

  /* The inferred type of a value, and a too-small dims array. */
  kiln_dtype dt = KILN_DTYPE_INVALID;
  int64_t tdims[4];
  size_t rank = 0;
  OK(kiln_graph_value_type(g, three[1], &dt, tdims, 4, &rank));
  CHECK(dt == KILN_DTYPE_F32 && rank == 2 && tdims[0] == -1 && tdims[1] == 1);
  EXPECT_STATUS(KILN_STATUS_BUFFER_TOO_SMALL, "dims_capacity", kiln_graph_value_type(g, three[1], &dt, tdims, 1, &rank));
  CHECK(rank == 2);

  /* NULLs. */
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "g is NULL", kiln_graph_add_op(NULL, "Relu", &x, 1, NULL, 0, out, 2, &n));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "op_type", kiln_graph_add_op(g, NULL, &x, 1, NULL, 0, out, 2, &n));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "n_outputs", kiln_graph_add_op(g, "Relu", &x, 1, NULL, 0, out, 2, NULL));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "inputs", kiln_graph_add_op(g, "Relu", NULL, 1, NULL, 0, out, 2, &n));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "g is NULL", kiln_graph_set_output(NULL, "z", x));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "out", kiln_graph_new(NULL));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "g is NULL", kiln_graph_add_parameter(NULL, "p", KILN_DTYPE_F32, NULL, NULL, 0, &v));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "out", kiln_graph_add_parameter(g, "p", KILN_DTYPE_F32, NULL, NULL, 0, NULL));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "g is NULL", kiln_graph_add_variable(NULL, "v", KILN_DTYPE_F32, NULL, 0, data, 4, &v));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "g is NULL", kiln_graph_add_control_dependency(NULL, 1, 0));
  EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "earlier node", kiln_graph_add_control_dependency(g, 0, 1));
  CHECK(kiln_graph_input_count(NULL) == 0 && kiln_graph_output_count(NULL) == 0);
  kiln_graph_free(NULL);

  /* The handle is still good after all that. */
  OK(kiln_graph_add_op(g, "Neg", &x, 1, NULL, 0, out, 2, &n));
  kiln_graph_free(g);
}

static void text_in_and_out(void) {
  kiln_graph *g = build_axpy(NULL);
  char *text = NULL;
  OK(kiln_graph_to_text(g, &text));
  CHECK(text != NULL && strstr(text, "\"x\" = Parameter : f32[batch:batch, 3]") != NULL);
  kiln_graph *back = NULL;
  OK(kiln_graph_parse(text, &back));
  char *again = NULL;
  OK(kiln_graph_to_text(back, &again));
  CHECK(strcmp(text, again) == 0);
  kiln_string_free(text);
  kiln_string_free(again);
  kiln_string_free(NULL);
  kiln_graph_free(back);
  kiln_graph_free(g);
  kiln_graph *bad = (kiln_graph *)0x1;
  EXPECT_STATUS(KILN_STATUS_PARSE, "<text>:1:1", kiln_graph_parse("grph \"g\" {}", &bad));
  EXPECT_STATUS(KILN_STATUS_PARSE, "unknown op 'Nope'", kiln_graph_parse("graph \"g\" {\n  %0 \"x\" = Nope : f32[1]\n}\n", &bad));
  CHECK(bad == (kiln_graph *)0x1);
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "text", kiln_graph_parse(NULL, &bad));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "g is NULL", kiln_graph_to_text(NULL, &text));
}

static void dot_out(void) {
  kiln_graph *g = build_axpy(NULL);
  char *dot = NULL;
  OK(kiln_graph_to_dot(g, &dot));
  CHECK(dot != NULL && strncmp(dot, "digraph ", 8) == 0);
  CHECK(strstr(dot, "n0 [") != NULL && strstr(dot, "#0 x") != NULL);
  char *again = NULL;
  OK(kiln_graph_to_dot(g, &again));
  CHECK(strcmp(dot, again) == 0);
  kiln_string_free(dot);
  kiln_string_free(again);
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "g is NULL", kiln_graph_to_dot(NULL, &dot));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "out", kiln_graph_to_dot(g, NULL));
  kiln_graph_free(g);
}

static void onnx_import(void) {
  kiln_graph *g = NULL;
  OK(kiln_graph_import_onnx("tests/onnx/scale_relu.onnx", &g));
  CHECK(kiln_graph_input_count(g) == 1 && kiln_graph_output_count(g) == 1);
  kiln_executable *e = NULL;
  OK(kiln_compile(g, NULL, &e));
  const char *name = NULL;
  OK(kiln_executable_input_info(e, 0, &name, NULL, NULL, NULL));
  CHECK(strcmp(name, "x") == 0);
  kiln_executable_free(e);
  kiln_graph_free(g);

  /* The same model from memory. */
  FILE *f = fopen("tests/onnx/scale_relu.onnx", "rb");
  CHECK(f != NULL);
  unsigned char buf[4096];
  size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
  if (f) fclose(f);
  OK(kiln_graph_import_onnx_bytes(buf, n, &g));
  kiln_graph_free(g);

  kiln_graph *untouched = (kiln_graph *)0x1;
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "not a valid ONNX model", kiln_graph_import_onnx_bytes(buf, n / 2, &untouched));
  EXPECT_STATUS(KILN_STATUS_IO, "nope.onnx", kiln_graph_import_onnx("tests/onnx/nope.onnx", &untouched));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "path", kiln_graph_import_onnx(NULL, &untouched));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "data", kiln_graph_import_onnx_bytes(NULL, 10, &untouched));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "out", kiln_graph_import_onnx_bytes(buf, n, NULL));
  CHECK(untouched == (kiln_graph *)0x1);
}

static kiln_tensor *f32_tensor(int64_t rows, int64_t cols, float start) {
  int64_t dims[2] = {rows, cols};
  kiln_tensor *t = NULL;
  OK(kiln_tensor_new(KILN_DTYPE_F32, dims, 2, &t));
  float *d = kiln_tensor_data(t);
  for (int64_t i = 0; i < rows * cols; i++) d[i] = start + (float)i;
  return t;
}

static void compile_and_run(void) {
  kiln_graph *g = build_axpy(NULL);
  kiln_compile_options *o = NULL;
  OK(kiln_compile_options_new(&o));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "unknown device 'tpu'", kiln_compile_options_set_backend(o, "tpu"));
  OK(kiln_compile_options_set_backend(o, "cuda:0"));
  kiln_executable *e = (kiln_executable *)0x1;
  EXPECT_STATUS(KILN_STATUS_DEVICE_UNAVAILABLE, "cuda:0", kiln_compile(g, o, &e));
  CHECK(e == (kiln_executable *)0x1);
  OK(kiln_compile_options_set_backend(o, "interp"));
  OK(kiln_compile_options_set_threads(o, 2));
  /* Pass options: the CLI's and KILN_*'s spelling; bad names and values fail here. */
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "unknown pass 'nope'", kiln_compile_options_set_option(o, "passes", "cse,nope"));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "unknown option 'colour'", kiln_compile_options_set_option(o, "colour", "1"));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "expected a count", kiln_compile_options_set_option(o, "rewrite-limit", "x"));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "value", kiln_compile_options_set_option(o, "passes", NULL));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "o is NULL", kiln_compile_options_set_option(NULL, "passes", ""));
  OK(kiln_compile_options_set_option(o, "passes", "canonicalize,constant-fold,simplify,cse,fuse,dce"));
  OK(kiln_compile_options_set_option(o, "verify", "1"));
  OK(kiln_compile_options_set_option(o, "rewrite-limit", "100"));
  /* Threads and tuning are compile options too. */
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "threads: expected a count", kiln_compile_options_set_option(o, "threads", "x"));
  OK(kiln_compile_options_set_option(o, "threads", "2"));
  OK(kiln_compile_options_set_option(o, "tune-force", "im2col"));
  OK(kiln_compile(g, o, &e));
  kiln_executable *e2 = NULL;
  OK(kiln_compile(g, NULL, &e2)); /* defaults: "cpu", the default pipeline */
  /* "cpu" with the options' pipeline: fuses the axpy's epilogue, same results. */
  kiln_executable *e3 = NULL;
  OK(kiln_compile_options_set_backend(o, "cpu"));
  OK(kiln_compile(g, o, &e3));
  kiln_compile_options_free(o);
  kiln_graph_free(g); /* executables do not need the graph */

  /* Discovery. */
  CHECK(kiln_executable_input_count(e) == 1 && kiln_executable_output_count(e) == 1);
  const char *name = NULL;
  kiln_dtype dt = KILN_DTYPE_INVALID;
  const int64_t *dims = NULL;
  size_t rank = 0;
  OK(kiln_executable_input_info(e, 0, &name, &dt, &dims, &rank));
  CHECK(strcmp(name, "x") == 0 && dt == KILN_DTYPE_F32 && rank == 2 && dims[0] == -1 && dims[1] == 3);
  OK(kiln_executable_output_info(e, 0, &name, NULL, NULL, NULL));
  CHECK(strcmp(name, "y") == 0);
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "out of range", kiln_executable_input_info(e, 1, &name, &dt, &dims, &rank));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "e is NULL", kiln_executable_output_info(NULL, 0, &name, &dt, &dims, &rank));
  CHECK(kiln_executable_input_count(NULL) == 0 && kiln_executable_output_count(NULL) == 0);

  /* One executable serves every batch size, including 0. */
  const int64_t batches[3] = {1, 3, 0};
  for (int b = 0; b < 3; b++) {
    kiln_tensor *x = f32_tensor(batches[b], 3, -2.0f);
    kiln_tensor *y = NULL;
    const kiln_tensor *ins[1] = {x};
    OK(kiln_executable_run(b == 0 ? e3 : b == 1 ? e2 : e, ins, 1, &y, 1));
    CHECK(kiln_tensor_rank(y) == 2 && kiln_tensor_dims(y)[0] == batches[b]);
    const float *xd = kiln_tensor_data(x);
    const float *yd = kiln_tensor_data(y);
    const float bias[3] = {-1.0f, 0.0f, 1.0f};
    for (int64_t i = 0; i < batches[b] * 3; i++) {
      float want = xd[i] * 2.0f + bias[i % 3];
      CHECK(yd[i] == (want > 0 ? want : 0.0f));
    }
    kiln_tensor_free(y);
    kiln_tensor_free(x);
  }

  /* Bad runs: count, dtype, shape, NULLs; nothing written. */
  kiln_tensor *x = f32_tensor(2, 3, 0.0f);
  kiln_tensor *wrong_shape = f32_tensor(2, 4, 0.0f);
  int64_t d23[2] = {2, 3};
  kiln_tensor *wrong_dtype = NULL;
  OK(kiln_tensor_new(KILN_DTYPE_F64, d23, 2, &wrong_dtype));
  kiln_tensor *y = NULL;
  const kiln_tensor *ins[2] = {x, x};
  EXPECT_STATUS(KILN_STATUS_RUN_BAD_INPUT, "takes 1 inputs, 2 given", kiln_executable_run(e, ins, 2, &y, 1));
  ins[0] = wrong_shape;
  EXPECT_STATUS(KILN_STATUS_RUN_BAD_INPUT, "input 'x'", kiln_executable_run(e, ins, 1, &y, 1));
  ins[0] = wrong_dtype;
  EXPECT_STATUS(KILN_STATUS_RUN_BAD_INPUT, "expected f32", kiln_executable_run(e, ins, 1, &y, 1));
  ins[0] = NULL;
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "inputs[0] ('x')", kiln_executable_run(e, ins, 1, &y, 1));
  ins[0] = x;
  EXPECT_STATUS(KILN_STATUS_BUFFER_TOO_SMALL, "has 1 outputs", kiln_executable_run(e, ins, 1, &y, 0));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "outputs", kiln_executable_run(e, ins, 1, NULL, 1));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "e is NULL", kiln_executable_run(NULL, ins, 1, &y, 1));
  CHECK(y == NULL);
  OK(kiln_executable_run(e, ins, 1, &y, 1)); /* still usable */
  kiln_tensor_free(y);
  kiln_tensor_free(x);
  kiln_tensor_free(wrong_shape);
  kiln_tensor_free(wrong_dtype);

  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "g is NULL", kiln_compile(NULL, NULL, &e2));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "o is NULL", kiln_compile_options_set_backend(NULL, "cpu"));
  OK(kiln_compile_options_new(&o));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "device", kiln_compile_options_set_backend(o, NULL));
  kiln_compile_options_free(o);
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "o is NULL", kiln_compile_options_set_threads(NULL, 1));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "out", kiln_compile_options_new(NULL));
  kiln_graph *empty = NULL;
  OK(kiln_graph_new(&empty));
  EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "no outputs", kiln_compile(empty, NULL, &e2));
  kiln_graph_free(empty);
  kiln_compile_options_free(NULL);
  kiln_executable_free(NULL);
  kiln_executable_free(e2);
  kiln_executable_free(e3);
  kiln_executable_free(e);
}

/* A counter: count += step each run; returns the value the run started with. */
static void variables_persist(void) {
  kiln_graph *g = NULL;
  OK(kiln_graph_new(&g));
  int64_t one[1] = {1};
  int64_t init = 10;
  kiln_value step, count, sum, seen, none[1];
  size_t n;
  OK(kiln_graph_add_parameter(g, "step", KILN_DTYPE_I64, one, NULL, 1, &step));
  OK(kiln_graph_add_variable(g, "count", KILN_DTYPE_I64, one, 1, &init, sizeof init, &count));
  kiln_value add_in[2] = {count, step};
  OK(kiln_graph_add_op(g, "Add", add_in, 2, NULL, 0, &sum, 1, &n));
  OK(kiln_graph_add_op(g, "Identity", &count, 1, NULL, 0, &seen, 1, &n));
  kiln_value assign_in[2] = {count, sum};
  OK(kiln_graph_add_op(g, "Assign", assign_in, 2, NULL, 0, none, 0, &n));
  CHECK(n == 0);
  OK(kiln_graph_set_output(g, "seen", seen));
  kiln_executable *e = NULL;
  OK(kiln_compile(g, NULL, &e));
  int64_t step_v = 5;
  kiln_tensor *st = NULL;
  OK(kiln_tensor_wrap(KILN_DTYPE_I64, one, 1, &step_v, sizeof step_v, &st));
  const kiln_tensor *ins[1] = {st};
  for (int run = 0; run < 3; run++) {
    kiln_tensor *out = NULL;
    OK(kiln_executable_run(e, ins, 1, &out, 1));
    CHECK(((int64_t *)kiln_tensor_data(out))[0] == 10 + 5 * run);
    kiln_tensor_free(out);
  }
  kiln_tensor_free(st);
  kiln_executable_free(e);
  /* Assigning to something other than a Variable is caught when compiling. */
  kiln_value bad_assign[2] = {step, sum};
  OK(kiln_graph_add_op(g, "Assign", bad_assign, 2, NULL, 0, none, 0, &n));
  e = NULL;
  EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "must be a Variable", kiln_compile(g, NULL, &e));
  CHECK(e == NULL);
  kiln_graph_free(g);
}

struct job {
  kiln_executable *e;
  int id;
  int failures;
};

static void *run_many(void *arg) {
  struct job *j = arg;
  for (int r = 0; r < 50; r++) {
    kiln_tensor *x = f32_tensor(1 + (j->id + r) % 4, 3, (float)(j->id * 7 - r));
    const kiln_tensor *ins[1] = {x};
    kiln_tensor *y = NULL;
    if (kiln_executable_run(j->e, ins, 1, &y, 1) != KILN_STATUS_OK) {
      j->failures++;
    } else {
      const float *xd = kiln_tensor_data(x), *yd = kiln_tensor_data(y);
      const float bias[3] = {-1.0f, 0.0f, 1.0f};
      for (int64_t i = 0; i < kiln_tensor_dims(x)[0] * 3; i++) {
        float want = xd[i] * 2.0f + bias[i % 3];
        if (yd[i] != (want > 0 ? want : 0.0f)) j->failures++;
      }
      kiln_tensor_free(y);
    }
    kiln_tensor_free(x);
  }
  return NULL;
}

static void runs_from_many_threads(void) {
  kiln_graph *g = build_axpy(NULL);
  kiln_executable *e = NULL;
  OK(kiln_compile(g, NULL, &e));
  kiln_graph_free(g);
  pthread_t th[4];
  struct job jobs[4];
  for (int i = 0; i < 4; i++) {
    jobs[i].e = e;
    jobs[i].id = i;
    jobs[i].failures = 0;
    CHECK(pthread_create(&th[i], NULL, run_many, &jobs[i]) == 0);
  }
  for (int i = 0; i < 4; i++) {
    CHECK(pthread_join(th[i], NULL) == 0);
    CHECK(jobs[i].failures == 0);
  }
  kiln_executable_free(e);
}

/* d/dw Σ relu(x·w) for x: f32[batch, 3], w: f32[3, 2]; and the errors. */
static void gradients(void) {
  kiln_graph *g = NULL;
  OK(kiln_graph_new(&g));
  int64_t xd[2] = {-1, 3}, wd[2] = {3, 2};
  kiln_value x, w, v[2], loss, gw = {7, 7};
  size_t n = 0;
  OK(kiln_graph_add_parameter(g, "x", KILN_DTYPE_F32, xd, NULL, 2, &x));
  OK(kiln_graph_add_parameter(g, "w", KILN_DTYPE_F32, wd, NULL, 2, &w));
  kiln_value mm[2] = {x, w};
  OK(kiln_graph_add_op(g, "MatMul", mm, 2, NULL, 0, v, 2, &n));
  OK(kiln_graph_add_op(g, "Relu", v, 1, NULL, 0, v, 2, &n));
  kiln_value y = v[0];
  kiln_attr keep0 = int_attr("keepdims", 0);
  OK(kiln_graph_add_op(g, "ReduceSum", &y, 1, &keep0, 1, &loss, 1, &n));

  EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "must be a float scalar", kiln_graph_add_gradients(g, y, &w, 1, &gw));
  EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "is a ReduceSum", kiln_graph_add_gradients(g, loss, &loss, 1, &gw));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "wrt", kiln_graph_add_gradients(g, loss, NULL, 1, &gw));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "grads_out", kiln_graph_add_gradients(g, loss, &w, 1, NULL));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "g is NULL", kiln_graph_add_gradients(NULL, loss, &w, 1, &gw));
  kiln_value dangling = {1000, 0};
  EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "1000", kiln_graph_add_gradients(g, loss, &dangling, 1, &gw));
  CHECK(gw.node == 7);
  OK(kiln_graph_add_gradients(g, loss, &w, 1, &gw));
  OK(kiln_graph_set_output(g, "dw", gw));

  kiln_executable *e = NULL;
  OK(kiln_compile(g, NULL, &e));
  kiln_graph_free(g);
  /* x = [[1,2,3],[-4,-5,-6]], w = [[1,-1],[1,-1],[1,-1]]: only (row 0, col 0) and
     (row 1, col 1) are positive, so dw[k][0] = x[0][k] and dw[k][1] = x[1][k]. */
  kiln_tensor *xt = f32_tensor(2, 3, 1.0f), *wt = f32_tensor(3, 2, 0.0f), *out = NULL;
  float *xp = kiln_tensor_data(xt), *wp = kiln_tensor_data(wt);
  for (int k = 0; k < 3; k++) {
    xp[3 + k] = -xp[3 + k] - 3.0f;
    wp[2 * k] = 1.0f;
    wp[2 * k + 1] = -1.0f;
  }
  const kiln_tensor *ins[2] = {xt, wt};
  OK(kiln_executable_run(e, ins, 2, &out, 1));
  const float *dw = kiln_tensor_data(out);
  for (int k = 0; k < 3; k++) CHECK(dw[2 * k] == xp[k] && dw[2 * k + 1] == xp[3 + k]);
  kiln_tensor_free(out);
  kiln_tensor_free(xt);
  kiln_tensor_free(wt);
  kiln_executable_free(e);
}

int main(void) {
  building_errors();
  text_in_and_out();
  dot_out();
  onnx_import();
  compile_and_run();
  variables_persist();
  runs_from_many_threads();
  gradients();
  return check_report("graph");
}
