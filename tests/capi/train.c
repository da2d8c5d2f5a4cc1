/* Training from C: gradients and an optimizer appended to a graph, then steps run on
 * one executable (its variables persist); and the optimizer builder's errors. */
#include <math.h>
#include <stdint.h>

#include "check.h"

#define N 8

/* Fits w (2×1) to y = x·[2, -3]ᵀ by mean squared error; returns the loss of the last of
   `steps` runs and the weights it left. */
static float fit(const char *kind, double momentum, int steps, float w_out[2]) {
  kiln_graph *g = NULL;
  OK(kiln_graph_new(&g));
  int64_t xd[2] = {N, 2}, wd[2] = {2, 1}, yd[2] = {N, 1};
  float w0[2] = {0.0f, 0.0f};
  kiln_value x, y, w, lr, v[1], loss, seen, gw;
  size_t n = 0;
  OK(kiln_graph_add_parameter(g, "x", KILN_DTYPE_F32, xd, NULL, 2, &x));
  OK(kiln_graph_add_parameter(g, "y", KILN_DTYPE_F32, yd, NULL, 2, &y));
  OK(kiln_graph_add_parameter(g, "lr", KILN_DTYPE_F32, NULL, NULL, 0, &lr));
  OK(kiln_graph_add_variable(g, "w", KILN_DTYPE_F32, wd, 2, w0, sizeof w0, &w));
  kiln_value mm[2] = {x, w};
  OK(kiln_graph_add_op(g, "MatMul", mm, 2, NULL, 0, v, 1, &n));
  kiln_value sub[2] = {v[0], y};
  OK(kiln_graph_add_op(g, "Sub", sub, 2, NULL, 0, v, 1, &n));
  kiln_value sq[2] = {v[0], v[0]};
  OK(kiln_graph_add_op(g, "Mul", sq, 2, NULL, 0, v, 1, &n));
  kiln_attr keep0;
  memset(&keep0, 0, sizeof keep0);
  keep0.name = "keepdims";
  keep0.kind = KILN_ATTR_INT;
  keep0.i = 0;
  OK(kiln_graph_add_op(g, "ReduceMean", v, 1, &keep0, 1, &loss, 1, &n));
  OK(kiln_graph_add_gradients(g, loss, &w, 1, &gw));

  kiln_optimizer *o = NULL;
  OK(kiln_optimizer_new(kind, &o));
  if (momentum > 0) OK(kiln_optimizer_set(o, "momentum", momentum));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "must be a float scalar", kiln_graph_add_optimizer(g, o, &w, &gw, 1, x));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "'x' is a Parameter", kiln_graph_add_optimizer(g, o, &x, &gw, 1, lr));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "grads", kiln_graph_add_optimizer(g, o, &w, NULL, 1, lr));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "o is NULL", kiln_graph_add_optimizer(g, NULL, &w, &gw, 1, lr));
  OK(kiln_graph_add_optimizer(g, o, &w, &gw, 1, lr));
  kiln_optimizer_free(o);
  OK(kiln_graph_add_op(g, "Identity", &w, 1, NULL, 0, &seen, 1, &n));
  OK(kiln_graph_set_output(g, "loss", loss));
  OK(kiln_graph_set_output(g, "w", seen));
  kiln_executable *e = NULL;
  OK(kiln_compile(g, NULL, &e));
  kiln_graph_free(g);

  float xv[N * 2], yv[N], lr_v = 0.05f;
  for (int i = 0; i < N; i++) {
    xv[2 * i] = (float)(i % 4) - 1.5f;
    xv[2 * i + 1] = (float)(i / 4) - 0.5f + 0.1f * (float)i;
    yv[i] = 2.0f * xv[2 * i] - 3.0f * xv[2 * i + 1];
  }
  kiln_tensor *xt = NULL, *yt = NULL, *lt = NULL;
  OK(kiln_tensor_wrap(KILN_DTYPE_F32, xd, 2, xv, sizeof xv, &xt));
  OK(kiln_tensor_wrap(KILN_DTYPE_F32, yd, 2, yv, sizeof yv, &yt));
  OK(kiln_tensor_wrap(KILN_DTYPE_F32, NULL, 0, &lr_v, sizeof lr_v, &lt));
  const kiln_tensor *ins[3] = {xt, yt, lt};
  float first = 0, last = 0;
  for (int s = 0; s < steps; s++) {
    kiln_tensor *outs[2] = {NULL, NULL};
    OK(kiln_executable_run(e, ins, 3, outs, 2));
    last = ((const float *)kiln_tensor_data(outs[0]))[0];
    if (s == 0) first = last;
    const float *wv = kiln_tensor_data(outs[1]);
    w_out[0] = wv[0];
    w_out[1] = wv[1];
    kiln_tensor_free(outs[0]);
    kiln_tensor_free(outs[1]);
  }
  CHECK(last < first);
  kiln_tensor_free(xt);
  kiln_tensor_free(yt);
  kiln_tensor_free(lt);
  kiln_executable_free(e);
  return last;
}

static void optimizer_settings(void) {
  kiln_optimizer *o = (kiln_optimizer *)0x1;
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "unknown optimizer 'rmsprop'", kiln_optimizer_new("rmsprop", &o));
  CHECK(o == (kiln_optimizer *)0x1);
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "kind", kiln_optimizer_new(NULL, &o));
  OK(kiln_optimizer_new("adamw", &o));
  OK(kiln_optimizer_set(o, "beta1", 0.8));
  OK(kiln_optimizer_set(o, "weight_decay", 0.01));
  OK(kiln_optimizer_set(o, "clip_norm", 1.0));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "no setting 'momentum'", kiln_optimizer_set(o, "momentum", 0.9));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "below 1", kiln_optimizer_set(o, "beta2", 1.5));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "finite", kiln_optimizer_set(o, "epsilon", NAN));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "o is NULL", kiln_optimizer_set(NULL, "beta1", 0.5));
  kiln_optimizer_free(o);
  kiln_optimizer_free(NULL);
}

int main(void) {
  optimizer_settings();
  float w[2];
  /* Plain SGD, SGD with momentum and Adam all fit the line. */
  CHECK(fit("sgd", 0.0, 300, w) < 1e-3f && fabsf(w[0] - 2.0f) < 0.05f && fabsf(w[1] + 3.0f) < 0.05f);
  CHECK(fit("sgd", 0.9, 150, w) < 1e-3f && fabsf(w[0] - 2.0f) < 0.05f && fabsf(w[1] + 3.0f) < 0.05f);
  CHECK(fit("adam", 0.0, 400, w) < 1e-2f && fabsf(w[0] - 2.0f) < 0.1f && fabsf(w[1] + 3.0f) < 0.1f);
  return check_report("train");
}
