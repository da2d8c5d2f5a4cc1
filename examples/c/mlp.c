/* An MLP through the Kiln C ABI: build the graph op by op, compile it, run it on a batch
 * of 2, print the class probabilities, and check them against plain C loops.
 * Exits non-zero on any failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln.h"

#define IN 4
#define HIDDEN 8
#define OUT 3
#define BATCH 2

static int fail(const char *what, kiln_status s) {
  fprintf(stderr, "%s: %s: %s\n", what, kiln_status_string(s), kiln_last_error_message());
  return 1;
}

#define TRY(call)                                 \
  do {                                            \
    kiln_status s_ = (call);                      \
    if (s_ != KILN_STATUS_OK) return fail(#call, s_); \
  } while (0)

static float w1[IN * HIDDEN], b1[HIDDEN], w2[HIDDEN * OUT], b2[OUT];

static void init_weights(void) {
  for (int i = 0; i < IN * HIDDEN; i++) w1[i] = (float)((i * 7) % 11 - 5) * 0.1f;
  for (int i = 0; i < HIDDEN; i++) b1[i] = (float)(i % 3 - 1) * 0.05f;
  for (int i = 0; i < HIDDEN * OUT; i++) w2[i] = (float)((i * 5) % 9 - 4) * 0.15f;
  for (int i = 0; i < OUT; i++) b2[i] = (float)i * 0.1f;
}

/* The same network in plain C, for checking. */
static void reference(const float *x, float *probs) {
  for (int b = 0; b < BATCH; b++) {
    float h[HIDDEN], logits[OUT], max = -INFINITY, sum = 0.0f;
    for (int j = 0; j < HIDDEN; j++) {
      float acc = b1[j];
      for (int i = 0; i < IN; i++) acc += x[b * IN + i] * w1[i * HIDDEN + j];
      h[j] = acc > 0.0f ? acc : 0.0f;
    }
    for (int k = 0; k < OUT; k++) {
      float acc = b2[k];
      for (int j = 0; j < HIDDEN; j++) acc += h[j] * w2[j * OUT + k];
      logits[k] = acc;
      if (acc > max) max = acc;
    }
    for (int k = 0; k < OUT; k++) sum += expf(logits[k] - max);
    for (int k = 0; k < OUT; k++) probs[b * OUT + k] = expf(logits[k] - max) / sum;
  }
}

/* Adds a single-output op and returns its value through *out. */
static kiln_status op(kiln_graph *g, const char *type, kiln_value a, kiln_value b, int n_in, kiln_value *out) {
  kiln_value ins[2] = {a, b};
  size_t n = 0;
  return kiln_graph_add_op(g, type, ins, (size_t)n_in, NULL, 0, out, 1, &n);
}

int main(void) {
  printf("Kiln %s\n", kiln_version_string());
  if (kiln_version_number() != KILN_VERSION_NUMBER) {
    fprintf(stderr, "header %d vs library %u\n", KILN_VERSION_NUMBER, kiln_version_number());
    return 1;
  }
  init_weights();
  kiln_graph *g = NULL;
  TRY(kiln_graph_new(&g));
  int64_t x_dims[2] = {-1, IN};
  const char *x_names[2] = {"batch", NULL};
  int64_t d_w1[2] = {IN, HIDDEN}, d_b1[1] = {HIDDEN}, d_w2[2] = {HIDDEN, OUT}, d_b2[1] = {OUT};
  kiln_value x, cw1, cb1, cw2, cb2, h, probs;
  TRY(kiln_graph_add_parameter(g, "x", KILN_DTYPE_F32, x_dims, x_names, 2, &x));
  TRY(kiln_graph_add_constant(g, "w1", KILN_DTYPE_F32, d_w1, 2, w1, sizeof w1, &cw1));
  TRY(kiln_graph_add_constant(g, "b1", KILN_DTYPE_F32, d_b1, 1, b1, sizeof b1, &cb1));
  TRY(kiln_graph_add_constant(g, "w2", KILN_DTYPE_F32, d_w2, 2, w2, sizeof w2, &cw2));
  TRY(kiln_graph_add_constant(g, "b2", KILN_DTYPE_F32, d_b2, 1, b2, sizeof b2, &cb2));
  TRY(op(g, "MatMul", x, cw1, 2, &h));
  TRY(op(g, "Add", h, cb1, 2, &h));
  TRY(op(g, "Relu", h, h, 1, &h));
  TRY(op(g, "MatMul", h, cw2, 2, &h));
  TRY(op(g, "Add", h, cb2, 2, &h));
  kiln_attr axis = {0};
  axis.name = "axis";
  axis.kind = KILN_ATTR_INT;
  axis.i = -1;
  size_t n = 0;
  TRY(kiln_graph_add_op(g, "Softmax", &h, 1, &axis, 1, &probs, 1, &n));
  TRY(kiln_graph_set_output(g, "probs", probs));

  kiln_compile_options *opts = NULL;
  kiln_executable *exe = NULL;
  TRY(kiln_compile_options_new(&opts));
  TRY(kiln_compile_options_set_backend(opts, "cpu"));
  TRY(kiln_compile(g, opts, &exe));
  kiln_compile_options_free(opts);
  kiln_graph_free(g);

  float x_data[BATCH * IN] = {0.5f, -1.0f, 2.0f, 0.25f, 1.5f, 0.0f, -0.5f, 1.0f};
  int64_t in_dims[2] = {BATCH, IN};
  kiln_tensor *input = NULL, *output = NULL;
  TRY(kiln_tensor_wrap(KILN_DTYPE_F32, in_dims, 2, x_data, sizeof x_data, &input));
  const kiln_tensor *inputs[1] = {input};
  TRY(kiln_executable_run(exe, inputs, 1, &output, 1));

  float want[BATCH * OUT];
  reference(x_data, want);
  const float *got = kiln_tensor_data(output);
  int bad = 0;
  for (int b = 0; b < BATCH; b++) {
    printf("probs[%d] =", b);
    for (int k = 0; k < OUT; k++) {
      printf(" %.6f", got[b * OUT + k]);
      if (fabsf(got[b * OUT + k] - want[b * OUT + k]) > 1e-5f) bad = 1;
    }
    printf("\n");
  }
  kiln_tensor_free(output);
  kiln_tensor_free(input);
  kiln_executable_free(exe);
  if (bad) fprintf(stderr, "mismatch against the plain C reference\n");
  return bad;
}
