/* Training-mode layers from C: dropout with a fresh mask every run, batch normalization
 * that updates its running statistics, MseLoss through kiln_graph_add_op, and their
 * errors. */
#include <math.h>
#include <stdint.h>

#include "check.h"

#define LEN 2000

static void dropout(void) {
  kiln_graph *g = NULL;
  OK(kiln_graph_new(&g));
  int64_t d[1] = {LEN};
  kiln_value x, y, ix;
  OK(kiln_graph_add_parameter(g, "x", KILN_DTYPE_F32, d, NULL, 1, &x));
  OK(kiln_graph_add_parameter(g, "ix", KILN_DTYPE_I32, d, NULL, 1, &ix));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "ratio must be in [0, 1), got 1", kiln_graph_add_dropout(g, x, 1.0, 7, &y));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "dropout of 'ix': x must be a float value",
                kiln_graph_add_dropout(g, ix, 0.5, 7, &y));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "y", kiln_graph_add_dropout(g, x, 0.5, 7, NULL));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "g", kiln_graph_add_dropout(NULL, x, 0.5, 7, &y));
  OK(kiln_graph_add_dropout(g, x, 0.25, 7, &y));
  kiln_value mask = {y.node, 1};
  OK(kiln_graph_set_output(g, "y", y));
  OK(kiln_graph_set_output(g, "mask", mask));
  kiln_executable *e = NULL;
  OK(kiln_compile(g, NULL, &e));
  kiln_graph_free(g);

  static float xv[LEN];
  for (int i = 0; i < LEN; i++) xv[i] = 1.0f + (float)(i % 3);
  kiln_tensor *xt = NULL, *it = NULL;
  OK(kiln_tensor_wrap(KILN_DTYPE_F32, d, 1, xv, sizeof xv, &xt));
  static int32_t iv[LEN];
  OK(kiln_tensor_wrap(KILN_DTYPE_I32, d, 1, iv, sizeof iv, &it));
  const kiln_tensor *ins[2] = {xt, it};
  static unsigned char first[LEN];
  int differ = 0;
  for (int run = 0; run < 2; run++) {
    kiln_tensor *outs[2] = {NULL, NULL};
    OK(kiln_executable_run(e, ins, 2, outs, 2));
    if (outs[0] == NULL || outs[1] == NULL) break;
    const float *yv = kiln_tensor_data(outs[0]);
    const unsigned char *mv = kiln_tensor_data(outs[1]);
    int kept = 0, scaled = 1;
    for (int i = 0; i < LEN; i++) {
      kept += mv[i] != 0;
      float want = mv[i] ? xv[i] / 0.75f : 0.0f;
      scaled &= fabsf(yv[i] - want) <= 1e-6f * want;
      if (run == 0) first[i] = mv[i];
      else differ += first[i] != mv[i];
    }
    CHECK(scaled);
    /* 0.75 ± five standard deviations (0.0097 each). */
    CHECK(fabs((double)kept / LEN - 0.75) < 0.05);
    kiln_tensor_free(outs[0]);
    kiln_tensor_free(outs[1]);
  }
  /* A fresh mask on the second run. */
  CHECK(differ > LEN / 10);
  kiln_tensor_free(xt);
  kiln_tensor_free(it);
  kiln_executable_free(e);
}

static void batch_norm(void) {
  kiln_graph *g = NULL;
  OK(kiln_graph_new(&g));
  int64_t xd[2] = {4, 2}, cd[1] = {2};
  float scale[2] = {2.0f, 0.5f}, bias[2] = {1.0f, -1.0f}, m0[2] = {0.0f, 1.0f}, v0[2] = {1.0f, 2.0f};
  kiln_value x, s, b, rm, rv, y, seen_m, seen_v, wrong;
  size_t n = 0;
  OK(kiln_graph_add_parameter(g, "x", KILN_DTYPE_F32, xd, NULL, 2, &x));
  OK(kiln_graph_add_constant(g, "scale", KILN_DTYPE_F32, cd, 1, scale, sizeof scale, &s));
  OK(kiln_graph_add_constant(g, "bias", KILN_DTYPE_F32, cd, 1, bias, sizeof bias, &b));
  OK(kiln_graph_add_variable(g, "running_mean", KILN_DTYPE_F32, cd, 1, m0, sizeof m0, &rm));
  OK(kiln_graph_add_variable(g, "running_var", KILN_DTYPE_F32, cd, 1, v0, sizeof v0, &rv));
  float zeros[8] = {0};
  OK(kiln_graph_add_constant(g, "wrong", KILN_DTYPE_F32, xd, 2, zeros, sizeof zeros, &wrong));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "running_mean must be a Variable (it is updated in place), 'bias' is a Constant",
                kiln_graph_add_batch_norm_training(g, x, s, b, b, rv, 0.9, 1e-5, &y));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "scale 'wrong' must have type f32[2]",
                kiln_graph_add_batch_norm_training(g, x, wrong, b, rm, rv, 0.9, 1e-5, &y));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "momentum -1 is out of range",
                kiln_graph_add_batch_norm_training(g, x, s, b, rm, rv, -1.0, 1e-5, &y));
  kiln_value bad = {9999, 0};
  CHECK(kiln_graph_add_batch_norm_training(g, bad, s, b, rm, rv, 0.9, 1e-5, &y) != KILN_STATUS_OK);
  OK(kiln_graph_add_batch_norm_training(g, x, s, b, rm, rv, 0.9, 1e-5, &y));
  /* Reads see the value a run starts with: the statistics before its update. */
  OK(kiln_graph_add_op(g, "Identity", &rm, 1, NULL, 0, &seen_m, 1, &n));
  OK(kiln_graph_add_op(g, "Identity", &rv, 1, NULL, 0, &seen_v, 1, &n));
  OK(kiln_graph_set_output(g, "y", y));
  OK(kiln_graph_set_output(g, "mean", seen_m));
  OK(kiln_graph_set_output(g, "var", seen_v));
  kiln_executable *e = NULL;
  OK(kiln_compile(g, NULL, &e));
  kiln_graph_free(g);

  /* Channel 0: 1, 2, 3, 4 (mean 2.5, variance 1.25); channel 1: 0, 0, 2, 2 (1, 1). */
  float xv[8] = {1, 0, 2, 0, 3, 2, 4, 2};
  kiln_tensor *xt = NULL;
  OK(kiln_tensor_wrap(KILN_DTYPE_F32, xd, 2, xv, sizeof xv, &xt));
  const kiln_tensor *ins[1] = {xt};
  float want_m[2] = {m0[0], m0[1]}, want_v[2] = {v0[0], v0[1]};
  const float batch_m[2] = {2.5f, 1.0f}, batch_v[2] = {1.25f, 1.0f};
  for (int run = 0; run < 3; run++) {
    kiln_tensor *outs[3] = {NULL, NULL, NULL};
    OK(kiln_executable_run(e, ins, 1, outs, 3));
    if (outs[0] == NULL) break;
    const float *yv = kiln_tensor_data(outs[0]);
    const float *mv = kiln_tensor_data(outs[1]);
    const float *vv = kiln_tensor_data(outs[2]);
    for (int c = 0; c < 2; c++) {
      CHECK(fabsf(mv[c] - want_m[c]) < 1e-6f && fabsf(vv[c] - want_v[c]) < 1e-6f);
      want_m[c] = 0.9f * want_m[c] + 0.1f * batch_m[c];
      want_v[c] = 0.9f * want_v[c] + 0.1f * batch_v[c];
      for (int i = 0; i < 4; i++) {
        float want = (xv[2 * i + c] - batch_m[c]) / sqrtf(batch_v[c] + 1e-5f) * scale[c] + bias[c];
        CHECK(fabsf(yv[2 * i + c] - want) < 1e-5f);
      }
    }
    for (int k = 0; k < 3; k++) kiln_tensor_free(outs[k]);
  }
  kiln_tensor_free(xt);
  kiln_executable_free(e);
}

static void mse_loss(void) {
  kiln_graph *g = NULL;
  OK(kiln_graph_new(&g));
  int64_t d[1] = {3};
  kiln_value p, t, loss, other;
  size_t n = 0;
  OK(kiln_graph_add_parameter(g, "p", KILN_DTYPE_F32, d, NULL, 1, &p));
  OK(kiln_graph_add_parameter(g, "t", KILN_DTYPE_F32, d, NULL, 1, &t));
  OK(kiln_graph_add_parameter(g, "other", KILN_DTYPE_F32, NULL, NULL, 0, &other));
  kiln_attr sum;
  memset(&sum, 0, sizeof sum);
  sum.name = "reduction";
  sum.kind = KILN_ATTR_STRING;
  sum.s = "sum";
  kiln_value pt[2] = {p, t}, po[2] = {p, other};
  EXPECT_STATUS(KILN_STATUS_INVALID_GRAPH, "input 1 (target) must have the type of input 0",
                kiln_graph_add_op(g, "MseLoss", po, 2, &sum, 1, &loss, 1, &n));
  OK(kiln_graph_add_op(g, "MseLoss", pt, 2, &sum, 1, &loss, 1, &n));
  OK(kiln_graph_set_output(g, "loss", loss));
  kiln_executable *e = NULL;
  OK(kiln_compile(g, NULL, &e));
  kiln_graph_free(g);
  float pv[3] = {1, 2, 3}, tv[3] = {0, 2, 5}, ov = 0;
  kiln_tensor *pt_ = NULL, *tt = NULL, *ot = NULL;
  OK(kiln_tensor_wrap(KILN_DTYPE_F32, d, 1, pv, sizeof pv, &pt_));
  OK(kiln_tensor_wrap(KILN_DTYPE_F32, d, 1, tv, sizeof tv, &tt));
  OK(kiln_tensor_wrap(KILN_DTYPE_F32, NULL, 0, &ov, sizeof ov, &ot));
  const kiln_tensor *ins[3] = {pt_, tt, ot};
  kiln_tensor *out = NULL;
  OK(kiln_executable_run(e, ins, 3, &out, 1));
  CHECK(out != NULL && ((const float *)kiln_tensor_data(out))[0] == 5.0f);
  kiln_tensor_free(out);
  kiln_tensor_free(pt_);
  kiln_tensor_free(tt);
  kiln_tensor_free(ot);
  kiln_executable_free(e);
}

int main(void) {
  dropout();
  batch_norm();
  mse_loss();
  return check_report("train_ops");
}
