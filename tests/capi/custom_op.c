/* External ops from C: a registered "scaled swish" (y = x * sigmoid(beta * x)) checked
 * against the same computation in built-in ops on both backends, forward and gradient;
 * the registration's versioning (older and newer struct sizes); and every bad-input
 * path: NULL and incomplete definitions, duplicates, unknown versions and flags,
 * callbacks that fail, kernels whose outputs contradict inference, use after
 * unregistering (and when the destructor runs). */
#include <math.h>
#include <stdint.h>

#include "check.h"

#define N 6
#define D 5

static int destroyed = 0;
static void count_destroy(void *user_data) { *(int *)user_data += 1; }

static kiln_status swish_infer(kiln_infer_context *ctx, void *user_data) {
  (void)user_data;
  size_t rank = 0;
  kiln_dtype dt = KILN_DTYPE_INVALID;
  double beta = 0;
  if (kiln_infer_context_num_inputs(ctx) != 1) {
    kiln_infer_context_set_error(ctx, "ScaledSwish takes one input");
    return KILN_STATUS_INVALID_GRAPH;
  }
  if (kiln_attrs_get_float(kiln_infer_context_attrs(ctx), "beta", 1.0, &beta) != KILN_STATUS_OK) {
    kiln_infer_context_set_error(ctx, kiln_last_error_message());
    return KILN_STATUS_INVALID_GRAPH;
  }
  kiln_infer_context_input(ctx, 0, &dt, &rank);
  if (dt != KILN_DTYPE_F32) {
    kiln_infer_context_set_error(ctx, "ScaledSwish wants f32");
    return KILN_STATUS_INVALID_GRAPH;
  }
  return kiln_infer_context_set_output_like(ctx, 0, 0);
}

static size_t elements(const kiln_tensor_view *v) {
  size_t n = 1;
  for (uint32_t k = 0; k < v->rank; k++) n *= (size_t)v->dims[k];
  return n;
}

static kiln_status swish_compute(kiln_kernel_context *ctx, void *user_data) {
  (void)user_data;
  const kiln_attrs *attrs = kiln_kernel_context_attrs(ctx);
  double beta = 1.0;
  int64_t fail = 0;
  kiln_attrs_get_float(attrs, "beta", 1.0, &beta);
  kiln_attrs_get_int(attrs, "fail", 0, &fail);
  if (fail) {
    kiln_kernel_context_set_error(ctx, "the user's kernel refused (fail = 1)");
    return KILN_STATUS_RUN_FAILED;
  }
  kiln_tensor_view x, y;
  kiln_status s = kiln_kernel_context_input(ctx, 0, &x);
  if (s != KILN_STATUS_OK) return s;
  s = kiln_kernel_context_output(ctx, 0, x.dims, x.rank, &y);
  if (s != KILN_STATUS_OK) return s;
  /* The strides are row-major; a scratch buffer is not needed, but exercised. */
  float *tmp = NULL;
  size_t n = elements(&x);
  s = kiln_kernel_context_scratch(ctx, n * sizeof(float), (void **)&tmp);
  if (s != KILN_STATUS_OK) return s;
  const float *xs = x.data;
  for (size_t i = 0; i < n; i++) tmp[i] = xs[i] / (1.0f + expf(-(float)beta * xs[i]));
  memcpy(y.data, tmp, n * sizeof(float));
  return KILN_STATUS_OK;
}

static kiln_value op1(kiln_graph *g, const char *op, kiln_value a) {
  kiln_value out = {0, 0};
  size_t n = 0;
  OK(kiln_graph_add_op(g, op, &a, 1, NULL, 0, &out, 1, &n));
  return out;
}

static kiln_value op2(kiln_graph *g, const char *op, kiln_value a, kiln_value b) {
  kiln_value in[2] = {a, b}, out = {0, 0};
  size_t n = 0;
  OK(kiln_graph_add_op(g, op, in, 2, NULL, 0, &out, 1, &n));
  return out;
}

static kiln_value scalar(kiln_graph *g, float v) {
  kiln_value out = {0, 0};
  OK(kiln_graph_add_constant(g, NULL, KILN_DTYPE_F32, NULL, 0, &v, sizeof v, &out));
  return out;
}

/* d/dx [x * s(bx)] = s + b x s (1 - s), built in the graph through the ordinary API. */
static kiln_status swish_gradient(kiln_gradient_context *ctx, kiln_graph *g, void *user_data) {
  (void)user_data;
  double beta = 1.0;
  kiln_attrs_get_float(kiln_gradient_context_attrs(ctx), "beta", 1.0, &beta);
  kiln_value x, y, gy;
  if (kiln_gradient_context_num_inputs(ctx) != 1 || kiln_gradient_context_num_outputs(ctx) != 1)
    return KILN_STATUS_INVALID_GRAPH;
  kiln_gradient_context_input(ctx, 0, &x);
  kiln_gradient_context_output(ctx, 0, &y);
  kiln_gradient_context_output_grad(ctx, 0, &gy);
  (void)y;
  kiln_value bx = op2(g, "Mul", x, scalar(g, (float)beta));
  kiln_value s = op1(g, "Sigmoid", bx);
  kiln_value one_minus = op2(g, "Sub", scalar(g, 1.0f), s);
  kiln_value d = op2(g, "Add", s, op2(g, "Mul", op2(g, "Mul", bx, s), one_minus));
  return kiln_gradient_context_set_input_grad(ctx, 0, op2(g, "Mul", gy, d));
}

static kiln_status gradient_refuses(kiln_gradient_context *ctx, kiln_graph *g, void *user_data) {
  (void)g;
  (void)user_data;
  kiln_gradient_context_set_error(ctx, "no gradient today");
  return KILN_STATUS_INVALID_GRAPH;
}

static kiln_custom_op swish_def(const char *name, int *destroy_counter) {
  kiln_custom_op d;
  memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.version = KILN_CUSTOM_OP_VERSION;
  d.domain = "com.example";
  d.name = name;
  d.min_inputs = 1;
  d.max_inputs = 1;
  d.num_outputs = 1;
  d.flags = KILN_CUSTOM_OP_PURE | KILN_CUSTOM_OP_MAY_RUN_IN_PLACE;
  d.infer = swish_infer;
  d.compute = swish_compute;
  d.gradient = swish_gradient;
  d.user_data = destroy_counter;
  d.destroy = count_destroy;
  return d;
}

static kiln_attr beta_attr(double beta) {
  kiln_attr a;
  memset(&a, 0, sizeof a);
  a.name = "beta";
  a.kind = KILN_ATTR_FLOAT;
  a.f = beta;
  return a;
}

/* loss = mean((swish(x) * w)^2) with swish custom or built in; outputs loss, y and
 * d loss / d x. */
static kiln_graph *swish_graph(const char *op, double beta, int with_gradient) {
  kiln_graph *g = NULL;
  OK(kiln_graph_new(&g));
  int64_t dims[2] = {-1, D};
  kiln_value x, y, loss, gx;
  size_t n = 0;
  OK(kiln_graph_add_parameter(g, "x", KILN_DTYPE_F32, dims, NULL, 2, &x));
  if (op) {
    kiln_attr a = beta_attr(beta);
    OK(kiln_graph_add_op(g, op, &x, 1, &a, 1, &y, 1, &n));
  } else {
    y = op2(g, "Mul", x, op1(g, "Sigmoid", op2(g, "Mul", x, scalar(g, (float)beta))));
  }
  kiln_value sq = op2(g, "Mul", y, y);
  kiln_attr keep0;
  memset(&keep0, 0, sizeof keep0);
  keep0.name = "keepdims";
  keep0.kind = KILN_ATTR_INT;
  keep0.i = 0;
  OK(kiln_graph_add_op(g, "ReduceMean", &sq, 1, &keep0, 1, &loss, 1, &n));
  OK(kiln_graph_set_output(g, "loss", loss));
  OK(kiln_graph_set_output(g, "y", y));
  if (with_gradient) {
    OK(kiln_graph_add_gradients(g, loss, &x, 1, &gx));
    OK(kiln_graph_set_output(g, "gx", gx));
  }
  return g;
}

/* Runs `g` on `backend` with x; writes y and gx (N*D each) and returns the loss. */
static float run_swish(const kiln_graph *g, const char *backend, const float *x, float *y, float *gx) {
  kiln_compile_options *o = NULL;
  kiln_executable *e = NULL;
  OK(kiln_compile_options_new(&o));
  OK(kiln_compile_options_set_backend(o, backend));
  OK(kiln_compile(g, o, &e));
  kiln_compile_options_free(o);
  int64_t dims[2] = {N, D};
  kiln_tensor *xt = NULL;
  OK(kiln_tensor_wrap(KILN_DTYPE_F32, dims, 2, (void *)x, N * D * sizeof(float), &xt));
  kiln_tensor *outs[3] = {NULL, NULL, NULL};
  const kiln_tensor *ins[1] = {xt};
  float loss = NAN;
  if (e) {
    OK(kiln_executable_run(e, ins, 1, outs, kiln_executable_output_count(e)));
    if (outs[0]) loss = *(const float *)kiln_tensor_data(outs[0]);
    if (outs[1]) memcpy(y, kiln_tensor_data(outs[1]), N * D * sizeof(float));
    if (outs[2]) memcpy(gx, kiln_tensor_data(outs[2]), N * D * sizeof(float));
  }
  for (int i = 0; i < 3; i++) kiln_tensor_free(outs[i]);
  kiln_tensor_free(xt);
  kiln_executable_free(e);
  return loss;
}

static float max_abs_diff(const float *a, const float *b, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(a[i] - b[i]));
  return m;
}

static void differential(void) {
  destroyed = 0;
  kiln_custom_op d = swish_def("ScaledSwish", &destroyed);
  OK(kiln_register_op(&d));
  float x[N * D];
  for (int i = 0; i < N * D; i++) x[i] = 0.37f * (float)(i - 13) + 0.05f * (float)(i % 3);
  const char *backends[2] = {"interp", "cpu"};
  kiln_graph *custom = swish_graph("com.example::ScaledSwish", 1.7, 1);
  kiln_graph *builtin = swish_graph(NULL, 1.7, 1);
  float ref_y[N * D], ref_g[N * D];
  float ref_loss = run_swish(builtin, "interp", x, ref_y, ref_g);
  for (int b = 0; b < 2; b++) {
    float y[N * D], g[N * D], by[N * D], bg[N * D];
    float loss = run_swish(custom, backends[b], x, y, g);
    float bloss = run_swish(builtin, backends[b], x, by, bg);
    CHECK(fabsf(loss - ref_loss) <= 1e-5f * fabsf(ref_loss) + 1e-6f);
    CHECK(fabsf(bloss - ref_loss) <= 1e-5f * fabsf(ref_loss) + 1e-6f);
    CHECK(max_abs_diff(y, ref_y, N * D) <= 2e-6f);
    CHECK(max_abs_diff(g, ref_g, N * D) <= 2e-6f);
    CHECK(max_abs_diff(by, y, N * D) <= 2e-6f);
  }
  /* The text dump names the op domain::name, and reads back while it is registered. */
  char *text = NULL;
  OK(kiln_graph_to_text(custom, &text));
  CHECK(text && strstr(text, "com.example::ScaledSwish") != NULL);
  kiln_graph *parsed = NULL;
  OK(kiln_graph_parse(text, &parsed));
  kiln_graph_free(parsed);
  /* Compiled before unregistering: keeps running after; the destructor waits for it. */
  kiln_compile_options *o = NULL;
  kiln_executable *e = NULL;
  OK(kiln_compile_options_new(&o));
  OK(kiln_compile_options_set_backend(o, "cpu"));
  OK(kiln_compile(custom, o, &e));
  kiln_compile_options_free(o);
  OK(kiln_unregister_op("com.example", "ScaledSwish"));
  EXPECT_STATUS(KILN_STATUS_UNKNOWN_OP, "no op 'com.example::ScaledSwish' is registered",
                kiln_unregister_op("com.example", "ScaledSwish"));
  EXPECT_STATUS(KILN_STATUS_PARSE, "com.example::ScaledSwish", kiln_graph_parse(text, &parsed));
  kiln_string_free(text);
  CHECK(destroyed == 0);
  kiln_value xv, yv;
  size_t n = 0;
  kiln_graph *later = NULL;
  OK(kiln_graph_new(&later));
  int64_t dims[2] = {N, D};
  OK(kiln_graph_add_parameter(later, "x", KILN_DTYPE_F32, dims, NULL, 2, &xv));
  EXPECT_STATUS(KILN_STATUS_UNKNOWN_OP, "not a registered op",
                kiln_graph_add_op(later, "com.example::ScaledSwish", &xv, 1, NULL, 0, &yv, 1, &n));
  kiln_graph_free(later);
  {
    /* A new input shape compiles a new program from the pinned op. */
    int64_t d2[2] = {2, D};
    kiln_tensor *xt = NULL;
    OK(kiln_tensor_wrap(KILN_DTYPE_F32, d2, 2, x, 2 * D * sizeof(float), &xt));
    kiln_tensor *outs[3] = {NULL, NULL, NULL};
    const kiln_tensor *ins[1] = {xt};
    OK(kiln_executable_run(e, ins, 1, outs, 3));
    if (outs[1]) CHECK(max_abs_diff(kiln_tensor_data(outs[1]), ref_y, 2 * D) <= 2e-6f);
    for (int i = 0; i < 3; i++) kiln_tensor_free(outs[i]);
    kiln_tensor_free(xt);
  }
  kiln_graph_free(custom);
  kiln_graph_free(builtin);
  CHECK(destroyed == 0);
  kiln_executable_free(e);
  CHECK(destroyed == 1);
}

static void registration_errors(void) {
  int counter = 0;
  kiln_custom_op d = swish_def("Checked", &counter);
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "def is NULL", kiln_register_op(NULL));
  kiln_custom_op bad = d;
  bad.name = NULL;
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "def->name", kiln_register_op(&bad));
  bad = d;
  bad.domain = "com example";
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "def->domain 'com example'", kiln_register_op(&bad));
  bad = d;
  bad.infer = NULL;
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "def->infer is NULL", kiln_register_op(&bad));
  bad = d;
  bad.compute = NULL;
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "def->compute is NULL", kiln_register_op(&bad));
  bad = d;
  bad.num_outputs = 0;
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "num_outputs is 0", kiln_register_op(&bad));
  bad = d;
  bad.max_inputs = 0;
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "less than def->min_inputs", kiln_register_op(&bad));
  bad = d;
  bad.version = KILN_CUSTOM_OP_VERSION + 1;
  EXPECT_STATUS(KILN_STATUS_UNSUPPORTED_VERSION, "def->version is 2", kiln_register_op(&bad));
  bad = d;
  bad.struct_size = 8;
  EXPECT_STATUS(KILN_STATUS_UNSUPPORTED_VERSION, "struct_size is 8", kiln_register_op(&bad));
  bad = d;
  bad.flags = 1u << 7;
  EXPECT_STATUS(KILN_STATUS_UNSUPPORTED_VERSION, "flags has bits", kiln_register_op(&bad));
  CHECK(counter == 0); /* failed registrations never call destroy */

  OK(kiln_register_op(&d));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "already registered", kiln_register_op(&d));
  CHECK(counter == 0); /* ...nor does a refused duplicate */
  OK(kiln_unregister_op("com.example", "Checked"));
  CHECK(counter == 1); /* no graph used it: dropped at once */
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "domain", kiln_unregister_op(NULL, "Checked"));
}

/* A library built against an older header (struct_size covers only the required
 * fields) and one built against a newer header (unknown trailing fields, zero). */
static void versioning(void) {
  int counter = 0;
  kiln_custom_op d = swish_def("Older", &counter);
  /* Past struct_size Kiln must not look: a garbage gradient pointer there is ignored. */
  d.struct_size = KILN_CUSTOM_OP_MIN_SIZE;
  d.gradient = (kiln_custom_gradient_fn)(uintptr_t)1;
  OK(kiln_register_op(&d));
  kiln_graph *g = swish_graph("com.example::Older", 0.5, 0);
  kiln_value loss, x, gx;
  OK(kiln_graph_output_value(g, 0, &loss));
  OK(kiln_graph_input_value(g, 0, &x));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "has 1 inputs", kiln_graph_input_value(g, 1, &x));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "has 2 outputs", kiln_graph_output_value(g, 2, &loss));
  /* No gradient field: differentiating is an error naming the node. */
  EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "no gradient rule for com.example::Older",
                kiln_graph_add_gradients(g, loss, &x, 1, &gx));
  float xs[N * D], y[N * D], unused[N * D];
  for (int i = 0; i < N * D; i++) xs[i] = 0.1f * (float)i - 1.0f;
  run_swish(g, "cpu", xs, y, unused);
  CHECK(fabsf(y[3] - xs[3] / (1.0f + expf(-0.5f * xs[3]))) < 1e-6f);
  kiln_graph_free(g);
  OK(kiln_unregister_op("com.example", "Older"));
  CHECK(counter == 1);

  struct newer {
    kiln_custom_op base;
    uint64_t future_field;
  } nd;
  memset(&nd, 0, sizeof nd);
  nd.base = swish_def("Newer", &counter);
  nd.base.struct_size = sizeof nd;
  OK(kiln_register_op(&nd.base));
  OK(kiln_unregister_op("com.example", "Newer"));
  CHECK(counter == 2);
  nd.future_field = 1;
  EXPECT_STATUS(KILN_STATUS_UNSUPPORTED_VERSION, "does not know", kiln_register_op(&nd.base));
  CHECK(counter == 2);
}

/* A kernel that asks for an output of the wrong shape, one that forgets its output,
 * and an infer callback that sets an output index the op does not have. */
static kiln_status wrong_shape_compute(kiln_kernel_context *ctx, void *user_data) {
  (void)user_data;
  kiln_tensor_view x, y;
  kiln_kernel_context_input(ctx, 0, &x);
  int64_t dims[2] = {x.dims[0], x.dims[1] + 1};
  /* Ignores the status on purpose: Kiln must fail the run anyway. */
  kiln_kernel_context_output(ctx, 0, dims, 2, &y);
  return KILN_STATUS_OK;
}

static kiln_status forgetful_compute(kiln_kernel_context *ctx, void *user_data) {
  (void)user_data;
  CHECK(kiln_kernel_context_num_inputs(ctx) == 2);
  CHECK(kiln_kernel_context_num_outputs(ctx) == 1);
  kiln_tensor_view v;
  OK(kiln_kernel_context_input(ctx, 1, &v));
  CHECK(v.data == NULL && v.dtype == KILN_DTYPE_INVALID); /* the omitted optional input */
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "has 2 inputs", kiln_kernel_context_input(ctx, 2, &v));
  return KILN_STATUS_OK;
}

static kiln_status symbolic_infer(kiln_infer_context *ctx, void *user_data) {
  (void)user_data;
  int64_t size = 0;
  const char *sym = NULL;
  kiln_dtype dt;
  size_t rank;
  if (kiln_infer_context_input(ctx, 1, &dt, &rank) != KILN_STATUS_OK || dt != KILN_DTYPE_INVALID)
    return KILN_STATUS_INVALID_GRAPH;
  kiln_infer_context_input_dim(ctx, 0, 0, &size, &sym);
  int64_t d0 = size;
  kiln_infer_context_input_dim(ctx, 0, 1, &size, &sym);
  /* Output: [input's dim 0 (fixed or its symbol), a fresh symbol]. */
  int64_t dims[2] = {d0 < 0 ? -1 : d0, -1};
  const char *syms[2] = {NULL, NULL};
  if (d0 < 0) kiln_infer_context_input_dim(ctx, 0, 0, &size, &syms[0]);
  if (kiln_infer_context_set_output(ctx, 5, KILN_DTYPE_F32, dims, syms, 2) == KILN_STATUS_OK)
    return KILN_STATUS_INTERNAL; /* index 5 must be refused */
  return kiln_infer_context_set_output(ctx, 0, KILN_DTYPE_F32, dims, syms, 2);
}

static void run_errors(void) {
  int counter = 0;
  kiln_custom_op d = swish_def("Swish2", &counter);
  OK(kiln_register_op(&d));
  kiln_custom_op w = swish_def("WrongShape", &counter);
  w.compute = wrong_shape_compute;
  OK(kiln_register_op(&w));
  kiln_custom_op f = swish_def("Forgetful", &counter);
  f.compute = forgetful_compute;
  f.infer = symbolic_infer;
  f.max_inputs = 2;
  f.flags = 0;
  f.gradient = gradient_refuses;
  OK(kiln_register_op(&f));

  const char *backends[2] = {"interp", "cpu"};
  for (int b = 0; b < 2; b++) {
    kiln_graph *g = NULL;
    OK(kiln_graph_new(&g));
    int64_t dims[2] = {N, D};
    kiln_value x, y1, y2, y3, v;
    size_t n = 0;
    OK(kiln_graph_add_parameter(g, "x", KILN_DTYPE_F32, dims, NULL, 2, &x));
    kiln_attr fail[2] = {beta_attr(2.0), beta_attr(0)};
    fail[1].name = "fail";
    fail[1].kind = KILN_ATTR_INT;
    fail[1].i = 1;
    OK(kiln_graph_add_op(g, "com.example::Swish2", &x, 1, fail, 2, &y1, 1, &n));
    OK(kiln_graph_add_op(g, "com.example::WrongShape", &x, 1, NULL, 0, &y2, 1, &n));
    kiln_value opt[2] = {x, {KILN_VALUE_NONE_NODE, 0}};
    OK(kiln_graph_add_op(g, "com.example::Forgetful", opt, 2, NULL, 0, &y3, 1, &n));
    /* The infer callback's error, quoted, naming the node. */
    kiln_attr sbeta = beta_attr(0);
    sbeta.kind = KILN_ATTR_STRING;
    sbeta.s = "big";
    EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "attribute 'beta' is string, not a float",
                  kiln_graph_add_op(g, "com.example::Swish2", &x, 1, &sbeta, 1, &v, 1, &n));
    EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "takes 1 inputs, got 2",
                  kiln_graph_add_op(g, "com.example::Swish2", opt, 2, NULL, 0, &v, 1, &n));
    /* The gradient callback's error names the node. */
    kiln_value loss = op1(g, "ReduceSum", y3), gx;
    EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "no gradient today", kiln_graph_add_gradients(g, loss, &x, 1, &gx));
    const char *want[3] = {"the user's kernel refused (fail = 1)", "inconsistent with inference",
                           "without producing output 0"};
    const char *node[3] = {"com.example::Swish2", "com.example::WrongShape",
                           "com.example::Forgetful"};
    kiln_value ys[3] = {y1, y2, y3};
    for (int k = 0; k < 3; k++) {
      /* One graph per failing op: the interpreter runs every node of a graph. */
      kiln_graph *one = NULL;
      kiln_value ox, oy;
      OK(kiln_graph_new(&one));
      OK(kiln_graph_add_parameter(one, "x", KILN_DTYPE_F32, dims, NULL, 2, &ox));
      kiln_value oin[2] = {ox, {KILN_VALUE_NONE_NODE, 0}};
      OK(kiln_graph_add_op(one, node[k], oin, k == 2 ? 2 : 1, k == 0 ? fail : NULL, k == 0 ? 2 : 0,
                           &oy, 1, &n));
      OK(kiln_graph_set_output(one, "y", oy));
      (void)ys[k];
      kiln_compile_options *o = NULL;
      kiln_executable *e = NULL;
      OK(kiln_compile_options_new(&o));
      OK(kiln_compile_options_set_backend(o, backends[b]));
      OK(kiln_compile(one, o, &e));
      kiln_compile_options_free(o);
      kiln_graph_free(one);
      float xs[N * D] = {0};
      kiln_tensor *xt = NULL, *out = NULL;
      OK(kiln_tensor_wrap(KILN_DTYPE_F32, dims, 2, xs, sizeof xs, &xt));
      const kiln_tensor *ins[1] = {xt};
      EXPECT_STATUS(KILN_STATUS_RUN_FAILED, want[k], kiln_executable_run(e, ins, 1, &out, 1));
      CHECK(strstr(kiln_last_error_message(), node[k]) != NULL);
      kiln_tensor_free(out);
      kiln_tensor_free(xt);
      kiln_executable_free(e);
    }
    kiln_graph_free(g);
  }
  OK(kiln_unregister_op("com.example", "Swish2"));
  OK(kiln_unregister_op("com.example", "WrongShape"));
  OK(kiln_unregister_op("com.example", "Forgetful"));
  CHECK(counter == 3);
}

/* Attribute accessors on every kind, and their errors. */
static kiln_status attrs_compute(kiln_kernel_context *ctx, void *user_data) {
  (void)user_data;
  const kiln_attrs *a = kiln_kernel_context_attrs(ctx);
  const int64_t *ints = NULL;
  const double *floats = NULL;
  size_t len = 99;
  int64_t i = 0;
  OK(kiln_attrs_get_ints(a, "ints", &ints, &len));
  CHECK(len == 2 && ints[0] == 3 && ints[1] == -4);
  OK(kiln_attrs_get_floats(a, "floats", &floats, &len));
  CHECK(len == 1 && floats[0] == 0.25);
  OK(kiln_attrs_get_floats(a, "absent", &floats, &len));
  CHECK(len == 0 && floats == NULL);
  OK(kiln_attrs_get_int(a, "absent", 42, &i));
  CHECK(i == 42);
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "is ints, not an int", kiln_attrs_get_int(a, "ints", 0, &i));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "not ints", kiln_attrs_get_ints(a, "floats", &ints, &len));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "not floats", kiln_attrs_get_floats(a, "ints", &floats, &len));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "attrs", kiln_attrs_get_int(NULL, "ints", 0, &i));
  return swish_compute(ctx, user_data);
}

static void attributes(void) {
  int counter = 0;
  kiln_custom_op d = swish_def("Attrs", &counter);
  d.compute = attrs_compute;
  OK(kiln_register_op(&d));
  kiln_graph *g = NULL;
  OK(kiln_graph_new(&g));
  int64_t dims[1] = {3};
  kiln_value x, y;
  size_t n = 0;
  OK(kiln_graph_add_parameter(g, "x", KILN_DTYPE_F32, dims, NULL, 1, &x));
  int64_t iv[2] = {3, -4};
  double fv[1] = {0.25};
  kiln_attr a[2];
  memset(a, 0, sizeof a);
  a[0].name = "ints";
  a[0].kind = KILN_ATTR_INTS;
  a[0].ints = iv;
  a[0].len = 2;
  a[1].name = "floats";
  a[1].kind = KILN_ATTR_FLOATS;
  a[1].floats = fv;
  a[1].len = 1;
  OK(kiln_graph_add_op(g, "com.example::Attrs", &x, 1, a, 2, &y, 1, &n));
  OK(kiln_graph_set_output(g, "y", y));
  kiln_executable *e = NULL;
  OK(kiln_compile(g, NULL, &e));
  float xs[3] = {1, 2, 3};
  kiln_tensor *xt = NULL, *out = NULL;
  OK(kiln_tensor_wrap(KILN_DTYPE_F32, dims, 1, xs, sizeof xs, &xt));
  const kiln_tensor *ins[1] = {xt};
  OK(kiln_executable_run(e, ins, 1, &out, 1));
  kiln_tensor_free(out);
  kiln_tensor_free(xt);
  kiln_executable_free(e);
  kiln_graph_free(g);
  OK(kiln_unregister_op("com.example", "Attrs"));
  CHECK(counter == 1);
  /* NULL contexts are errors or zeros, never crashes. */
  CHECK(kiln_infer_context_num_inputs(NULL) == 0);
  CHECK(kiln_kernel_context_num_inputs(NULL) == 0);
  CHECK(kiln_kernel_context_num_outputs(NULL) == 0);
  CHECK(kiln_gradient_context_num_inputs(NULL) == 0);
  CHECK(kiln_gradient_context_num_outputs(NULL) == 0);
  CHECK(kiln_infer_context_attrs(NULL) == NULL);
  CHECK(kiln_kernel_context_attrs(NULL) == NULL);
  CHECK(kiln_gradient_context_attrs(NULL) == NULL);
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "ctx", kiln_infer_context_set_error(NULL, "x"));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "ctx", kiln_kernel_context_set_error(NULL, "x"));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "ctx", kiln_gradient_context_set_error(NULL, "x"));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "ctx", kiln_gradient_context_set_input_grad(NULL, 0, x));
}

/* The CPU backend hands the kernel the planned buffers: with
 * KILN_CUSTOM_OP_MAY_RUN_IN_PLACE the output of Relu -> op -> Neg is the dying input's
 * buffer; without it, never. */
static int ran_in_place = 0, ran = 0;
static kiln_status probe_compute(kiln_kernel_context *ctx, void *user_data) {
  (void)user_data;
  kiln_tensor_view x, y;
  kiln_status s = kiln_kernel_context_input(ctx, 0, &x);
  if (s == KILN_STATUS_OK) s = kiln_kernel_context_output(ctx, 0, x.dims, x.rank, &y);
  if (s != KILN_STATUS_OK) return s;
  ran++;
  if (x.data == y.data) ran_in_place++;
  CHECK(x.strides[x.rank - 1] == 1 && y.strides[0] == x.dims[1]);
  size_t n = elements(&x);
  for (size_t i = 0; i < n; i++) ((float *)y.data)[i] = 2.0f * ((const float *)x.data)[i];
  return KILN_STATUS_OK;
}

static void in_place(void) {
  int counter = 0;
  for (int allowed = 0; allowed < 2; allowed++) {
    kiln_custom_op d = swish_def(allowed ? "Twice" : "TwiceCopying", &counter);
    d.compute = probe_compute;
    d.flags = allowed ? KILN_CUSTOM_OP_MAY_RUN_IN_PLACE : 0;
    OK(kiln_register_op(&d));
    kiln_graph *g = NULL;
    OK(kiln_graph_new(&g));
    int64_t dims[2] = {N, D};
    kiln_value x, y;
    size_t n = 0;
    OK(kiln_graph_add_parameter(g, "x", KILN_DTYPE_F32, dims, NULL, 2, &x));
    kiln_value r = op1(g, "Relu", x);
    OK(kiln_graph_add_op(g, allowed ? "com.example::Twice" : "com.example::TwiceCopying", &r, 1, NULL, 0, &y, 1, &n));
    OK(kiln_graph_set_output(g, "y", op1(g, "Neg", y)));
    ran = ran_in_place = 0;
    float xs[N * D];
    for (int i = 0; i < N * D; i++) xs[i] = (float)(i % 7) - 3.0f;
    kiln_executable *e = NULL;
    OK(kiln_compile(g, NULL, &e)); /* the default backend: cpu */
    kiln_tensor *xt = NULL, *out = NULL;
    OK(kiln_tensor_wrap(KILN_DTYPE_F32, dims, 2, xs, sizeof xs, &xt));
    const kiln_tensor *ins[1] = {xt};
    OK(kiln_executable_run(e, ins, 1, &out, 1));
    const float *ys = out ? kiln_tensor_data(out) : NULL;
    for (int i = 0; ys && i < N * D; i++) CHECK(ys[i] == -2.0f * fmaxf(xs[i], 0.0f));
    kiln_tensor_free(out);
    kiln_tensor_free(xt);
    kiln_executable_free(e);
    CHECK(ran == 1);
    CHECK(ran_in_place == allowed);
    kiln_graph_free(g);
    OK(kiln_unregister_op("com.example", allowed ? "Twice" : "TwiceCopying"));
  }
  CHECK(counter == 2);
}

int main(void) {
  differential();
  registration_errors();
  versioning();
  run_errors();
  attributes();
  in_place();
  return check_report("custom_op");
}
