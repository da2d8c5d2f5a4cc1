/* An external op from C: registers "scaled swish" (y = x * sigmoid(beta * x)) in the
 * domain "com.example" with a CPU kernel and a gradient, imports an MLP that uses it from
 * ONNX (examples/data/swish_mlp.onnx, written by scripts/make-swish-mlp.py), and trains
 * it a few steps by gradient descent beside the same MLP built from built-in ops: the
 * losses, gradients and weights must agree at every step.
 *
 *   custom_op [path/to/swish_mlp.onnx]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

#ifndef KILN_SWISH_MLP_PATH
#define KILN_SWISH_MLP_PATH "examples/data/swish_mlp.onnx"
#endif

#define N 16
#define IN 4
#define HID 8
#define OUT 3
#define BETA 1.5
#define STEPS 5
#define LR 0.2f

static void check(kiln_status s, const char *what) {
  if (s != KILN_STATUS_OK) {
    fprintf(stderr, "%s: %s: %s\n", what, kiln_status_string(s), kiln_last_error_message());
    exit(1);
  }
}

/* ---- the op ------------------------------------------------------------------ */

static kiln_status swish_infer(kiln_infer_context *ctx, void *user_data) {
  (void)user_data;
  kiln_dtype dtype;
  size_t rank;
  kiln_status s = kiln_infer_context_input(ctx, 0, &dtype, &rank);
  if (s != KILN_STATUS_OK) return s;
  if (dtype != KILN_DTYPE_F32) {
    kiln_infer_context_set_error(ctx, "ScaledSwish computes f32 only");
    return KILN_STATUS_INVALID_GRAPH;
  }
  return kiln_infer_context_set_output_like(ctx, 0, 0); /* same type, symbols and all */
}

static kiln_status swish_compute(kiln_kernel_context *ctx, void *user_data) {
  (void)user_data;
  double beta;
  kiln_tensor_view x, y;
  kiln_status s = kiln_attrs_get_float(kiln_kernel_context_attrs(ctx), "beta", 1.0, &beta);
  if (s == KILN_STATUS_OK) s = kiln_kernel_context_input(ctx, 0, &x);
  if (s == KILN_STATUS_OK) s = kiln_kernel_context_output(ctx, 0, x.dims, x.rank, &y);
  if (s != KILN_STATUS_OK) return s;
  size_t n = 1;
  for (uint32_t k = 0; k < x.rank; k++) n *= (size_t)x.dims[k];
  const float *xs = x.data;
  float *ys = y.data;
  /* Read each element before writing it: the op declares it may run in place. */
  for (size_t i = 0; i < n; i++) {
    float v = xs[i];
    ys[i] = v / (1.0f + expf(-(float)beta * v));
  }
  return KILN_STATUS_OK;
}

static kiln_value add1(kiln_graph *g, const char *op, kiln_value a) {
  kiln_value out;
  size_t n;
  check(kiln_graph_add_op(g, op, &a, 1, NULL, 0, &out, 1, &n), op);
  return out;
}

static kiln_value add2(kiln_graph *g, const char *op, kiln_value a, kiln_value b) {
  kiln_value in[2] = {a, b}, out;
  size_t n;
  check(kiln_graph_add_op(g, op, in, 2, NULL, 0, &out, 1, &n), op);
  return out;
}

static kiln_value scalar(kiln_graph *g, float v) {
  kiln_value out;
  check(kiln_graph_add_constant(g, NULL, KILN_DTYPE_F32, NULL, 0, &v, sizeof v, &out), "constant");
  return out;
}

/* dL/dx = dL/dy * (s + beta x s (1 - s)), s = sigmoid(beta x): built with graph ops. */
static kiln_status swish_gradient(kiln_gradient_context *ctx, kiln_graph *g, void *user_data) {
  (void)user_data;
  double beta;
  kiln_value x, gy;
  kiln_status s = kiln_attrs_get_float(kiln_gradient_context_attrs(ctx), "beta", 1.0, &beta);
  if (s == KILN_STATUS_OK) s = kiln_gradient_context_input(ctx, 0, &x);
  if (s == KILN_STATUS_OK) s = kiln_gradient_context_output_grad(ctx, 0, &gy);
  if (s != KILN_STATUS_OK) return s;
  kiln_value bx = add2(g, "Mul", x, scalar(g, (float)beta));
  kiln_value sg = add1(g, "Sigmoid", bx);
  kiln_value one_minus = add2(g, "Sub", scalar(g, 1.0f), sg);
  kiln_value d = add2(g, "Add", sg, add2(g, "Mul", add2(g, "Mul", bx, sg), one_minus));
  return kiln_gradient_context_set_input_grad(ctx, 0, add2(g, "Mul", gy, d));
}

static void register_swish(void) {
  kiln_custom_op def;
  memset(&def, 0, sizeof def);
  def.struct_size = sizeof def; /* the versioning handshake: see kiln_custom_op */
  def.version = KILN_CUSTOM_OP_VERSION;
  def.domain = "com.example";
  def.name = "ScaledSwish";
  def.min_inputs = 1;
  def.max_inputs = 1;
  def.num_outputs = 1;
  def.flags = KILN_CUSTOM_OP_PURE | KILN_CUSTOM_OP_MAY_RUN_IN_PLACE;
  def.infer = swish_infer;
  def.compute = swish_compute;
  def.gradient = swish_gradient;
  check(kiln_register_op(&def), "kiln_register_op");
}

/* ---- the models ---------------------------------------------------------------- */

/* Appends loss = mean((y - t)^2) and its gradients with respect to the weights
 * params[1..4]; outputs after y: loss, then the four gradients. */
static void add_training(kiln_graph *g, kiln_value y, const kiln_value params[5]) {
  int64_t tdims[2] = {N, OUT};
  kiln_value t, loss, grads[4];
  size_t n;
  check(kiln_graph_add_parameter(g, "t", KILN_DTYPE_F32, tdims, NULL, 2, &t), "t");
  kiln_value d = add2(g, "Sub", y, t);
  kiln_value sq = add2(g, "Mul", d, d);
  kiln_attr keep0;
  memset(&keep0, 0, sizeof keep0);
  keep0.name = "keepdims";
  keep0.kind = KILN_ATTR_INT;
  keep0.i = 0;
  check(kiln_graph_add_op(g, "ReduceMean", &sq, 1, &keep0, 1, &loss, 1, &n), "ReduceMean");
  check(kiln_graph_add_gradients(g, loss, params + 1, 4, grads), "kiln_graph_add_gradients");
  check(kiln_graph_set_output(g, "loss", loss), "loss");
  const char *names[4] = {"dW1", "db1", "dW2", "db2"};
  for (int i = 0; i < 4; i++) check(kiln_graph_set_output(g, names[i], grads[i]), names[i]);
}

/* The imported model: inputs x, W1, b1, W2, b2 (then t); outputs y, then the loss and
 * gradients. */
static kiln_graph *imported(const char *path) {
  kiln_graph *g;
  check(kiln_graph_import_onnx(path, &g), path);
  kiln_value params[5], y;
  for (int i = 0; i < 5; i++) check(kiln_graph_input_value(g, (size_t)i, &params[i]), "input");
  check(kiln_graph_output_value(g, 0, &y), "output");
  add_training(g, y, params);
  return g;
}

/* The same model from built-in ops: swish as x * Sigmoid(beta * x). */
static kiln_graph *builtin(void) {
  kiln_graph *g;
  check(kiln_graph_new(&g), "graph");
  int64_t xd[2] = {-1, IN}, w1d[2] = {IN, HID}, b1d[1] = {HID}, w2d[2] = {HID, OUT}, b2d[1] = {OUT};
  const char *axis_n[2] = {"N", NULL};
  kiln_value p[5];
  check(kiln_graph_add_parameter(g, "x", KILN_DTYPE_F32, xd, axis_n, 2, &p[0]), "x");
  check(kiln_graph_add_parameter(g, "W1", KILN_DTYPE_F32, w1d, NULL, 2, &p[1]), "W1");
  check(kiln_graph_add_parameter(g, "b1", KILN_DTYPE_F32, b1d, NULL, 1, &p[2]), "b1");
  check(kiln_graph_add_parameter(g, "W2", KILN_DTYPE_F32, w2d, NULL, 2, &p[3]), "W2");
  check(kiln_graph_add_parameter(g, "b2", KILN_DTYPE_F32, b2d, NULL, 1, &p[4]), "b2");
  kiln_value h = add2(g, "Add", add2(g, "MatMul", p[0], p[1]), p[2]);
  kiln_value a = add2(g, "Mul", h, add1(g, "Sigmoid", add2(g, "Mul", h, scalar(g, (float)BETA))));
  kiln_value y = add2(g, "Add", add2(g, "MatMul", a, p[3]), p[4]);
  check(kiln_graph_set_output(g, "y", y), "y");
  add_training(g, y, p);
  return g;
}

static kiln_executable *compile(const kiln_graph *g) {
  kiln_compile_options *o;
  kiln_executable *e;
  check(kiln_compile_options_new(&o), "options");
  check(kiln_compile_options_set_backend(o, "cpu"), "backend");
  check(kiln_compile(g, o, &e), "kiln_compile");
  kiln_compile_options_free(o);
  return e;
}

/* ---- training -------------------------------------------------------------------- */

typedef struct {
  float w1[IN * HID], b1[HID], w2[HID * OUT], b2[OUT];
} weights;

static float *weight_ptr(weights *w, int i) {
  float *p[4] = {w->w1, w->b1, w->w2, w->b2};
  return p[i];
}

static const size_t weight_len[4] = {IN * HID, HID, HID * OUT, OUT};

/* One step: loss and gradients at `w`, then w -= LR * gradient. Returns the loss. */
static float step(kiln_executable *e, weights *w, const float *x, const float *t, float grads_out[4][IN * HID]) {
  int64_t xd[2] = {N, IN}, w1d[2] = {IN, HID}, b1d[1] = {HID}, w2d[2] = {HID, OUT}, b2d[1] = {OUT},
          td[2] = {N, OUT};
  kiln_tensor *in[6];
  check(kiln_tensor_wrap(KILN_DTYPE_F32, xd, 2, (void *)x, N * IN * sizeof(float), &in[0]), "x");
  check(kiln_tensor_wrap(KILN_DTYPE_F32, w1d, 2, w->w1, sizeof w->w1, &in[1]), "W1");
  check(kiln_tensor_wrap(KILN_DTYPE_F32, b1d, 1, w->b1, sizeof w->b1, &in[2]), "b1");
  check(kiln_tensor_wrap(KILN_DTYPE_F32, w2d, 2, w->w2, sizeof w->w2, &in[3]), "W2");
  check(kiln_tensor_wrap(KILN_DTYPE_F32, b2d, 1, w->b2, sizeof w->b2, &in[4]), "b2");
  check(kiln_tensor_wrap(KILN_DTYPE_F32, td, 2, (void *)t, N * OUT * sizeof(float), &in[5]), "t");
  kiln_tensor *out[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
  check(kiln_executable_run(e, (const kiln_tensor *const *)in, 6, out, 6), "kiln_executable_run");
  float loss = *(const float *)kiln_tensor_data(out[1]);
  for (int i = 0; i < 4; i++) {
    const float *g = kiln_tensor_data(out[i + 2]);
    float *p = weight_ptr(w, i);
    for (size_t k = 0; k < weight_len[i]; k++) {
      grads_out[i][k] = g[k];
      p[k] -= LR * g[k];
    }
  }
  for (int i = 0; i < 6; i++) kiln_tensor_free(in[i]);
  for (int i = 0; i < 6; i++) kiln_tensor_free(out[i]);
  return loss;
}

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : KILN_SWISH_MLP_PATH;
  register_swish();
  kiln_graph *gc = imported(path), *gb = builtin();
  kiln_executable *ec = compile(gc), *eb = compile(gb);
  kiln_graph_free(gc);
  kiln_graph_free(gb);

  float x[N * IN], t[N * OUT];
  for (int i = 0; i < N * IN; i++) x[i] = sinf(0.7f * (float)i) * 1.5f;
  for (int r = 0; r < N; r++)
    for (int c = 0; c < OUT; c++) t[r * OUT + c] = tanhf(x[r * IN + c] - 0.5f * x[r * IN + c + 1]);
  weights wc, wb;
  for (int i = 0; i < 4; i++)
    for (size_t k = 0; k < weight_len[i]; k++) weight_ptr(&wc, i)[k] = 0.4f * cosf(1.3f * (float)(k + 7 * (size_t)i));
  wb = wc;

  static float gc_[4][IN * HID], gb_[4][IN * HID];
  float first = 0, last = 0, worst = 0;
  for (int s = 0; s < STEPS; s++) {
    float lc = step(ec, &wc, x, t, gc_);
    float lb = step(eb, &wb, x, t, gb_);
    float diff = fabsf(lc - lb);
    for (int i = 0; i < 4; i++)
      for (size_t k = 0; k < weight_len[i]; k++) diff = fmaxf(diff, fabsf(gc_[i][k] - gb_[i][k]));
    worst = fmaxf(worst, diff);
    printf("step %d: loss %.6f (built-in ops: %.6f), max |difference| in loss and gradients %.2e\n", s, lc, lb, diff);
    if (s == 0) first = lc;
    last = lc;
  }
  kiln_executable_free(ec);
  kiln_executable_free(eb);
  check(kiln_unregister_op("com.example", "ScaledSwish"), "kiln_unregister_op");
  int ok = worst <= 1e-5f && last < first;
  printf("%s: the custom op %s the built-in ops (max difference %.2e); loss %.6f -> %.6f\n", ok ? "ok" : "FAILED",
         worst <= 1e-5f ? "matches" : "does not match", worst, first, last);
  return ok ? 0 : 1;
}
