/* An executable's variables from C: listing, reading, writing, and checkpoints: train a
 * few Adam steps, save, perturb, load, and continue exactly where the saved run would
 * have; truncated, corrupt and other-graph files fail with the right status and leave
 * the variables unchanged. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <unistd.h>

#include "check.h"

#define N 8

/* A linear model y = x·w + b fitted by mean squared error with Adam; `in` is the width
   of x (2 for the model under test, 3 for "another graph"). */
static kiln_graph *linear_graph(int64_t in) {
  kiln_graph *g = NULL;
  OK(kiln_graph_new(&g));
  int64_t xd[2] = {N, in}, wd[2] = {in, 1}, bd[1] = {1}, yd[2] = {N, 1};
  float w0[3] = {0.1f, -0.2f, 0.3f}, b0[1] = {0.0f};
  kiln_value x, y, w, b, lr, v[1], loss, vars[2], grads[2];
  size_t n = 0;
  OK(kiln_graph_add_parameter(g, "x", KILN_DTYPE_F32, xd, NULL, 2, &x));
  OK(kiln_graph_add_parameter(g, "y", KILN_DTYPE_F32, yd, NULL, 2, &y));
  OK(kiln_graph_add_parameter(g, "lr", KILN_DTYPE_F32, NULL, NULL, 0, &lr));
  OK(kiln_graph_add_variable(g, "w", KILN_DTYPE_F32, wd, 2, w0, (size_t)in * sizeof(float), &w));
  OK(kiln_graph_add_variable(g, "b", KILN_DTYPE_F32, bd, 1, b0, sizeof b0, &b));
  kiln_value mm[2] = {x, w};
  OK(kiln_graph_add_op(g, "MatMul", mm, 2, NULL, 0, v, 1, &n));
  kiln_value add[2] = {v[0], b};
  OK(kiln_graph_add_op(g, "Add", add, 2, NULL, 0, v, 1, &n));
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
  vars[0] = w;
  vars[1] = b;
  OK(kiln_graph_add_gradients(g, loss, vars, 2, grads));
  kiln_optimizer *o = NULL;
  OK(kiln_optimizer_new("adam", &o));
  OK(kiln_graph_add_optimizer(g, o, vars, grads, 2, lr));
  kiln_optimizer_free(o);
  OK(kiln_graph_set_output(g, "loss", loss));
  return g;
}

static kiln_executable *compile_interp(const kiln_graph *g) {
  kiln_compile_options *o = NULL;
  kiln_executable *e = NULL;
  OK(kiln_compile_options_new(&o));
  OK(kiln_compile_options_set_backend(o, "interp"));
  OK(kiln_compile(g, o, &e));
  kiln_compile_options_free(o);
  return e;
}

static float xv[N * 2], yv[N];

/* One training step; returns its loss. */
static float step(kiln_executable *e) {
  int64_t xd[2] = {N, 2}, yd[2] = {N, 1};
  float lr = 0.05f, loss = -1.0f;
  kiln_tensor *xt = NULL, *yt = NULL, *lt = NULL, *out = NULL;
  OK(kiln_tensor_wrap(KILN_DTYPE_F32, xd, 2, xv, sizeof xv, &xt));
  OK(kiln_tensor_wrap(KILN_DTYPE_F32, yd, 2, yv, sizeof yv, &yt));
  OK(kiln_tensor_wrap(KILN_DTYPE_F32, NULL, 0, &lr, sizeof lr, &lt));
  const kiln_tensor *ins[3] = {xt, yt, lt};
  OK(kiln_executable_run(e, ins, 3, &out, 1));
  if (out) loss = *(const float *)kiln_tensor_data(out);
  kiln_tensor_free(out);
  kiln_tensor_free(xt);
  kiln_tensor_free(yt);
  kiln_tensor_free(lt);
  return loss;
}

#define MAX_VARS 16
#define MAX_BYTES 64

/* Every variable's bytes, in order; returns the count. */
static size_t snapshot(const kiln_executable *e, unsigned char bytes[MAX_VARS][MAX_BYTES]) {
  size_t n = kiln_executable_variable_count(e);
  CHECK(n <= MAX_VARS);
  for (size_t i = 0; i < n && i < MAX_VARS; i++) {
    const char *name = NULL;
    kiln_tensor *t = NULL;
    OK(kiln_executable_variable_info(e, i, &name, NULL, NULL, NULL));
    OK(kiln_executable_read_variable(e, name, &t));
    memset(bytes[i], 0, MAX_BYTES);
    CHECK(kiln_tensor_nbytes(t) <= MAX_BYTES);
    if (t && kiln_tensor_nbytes(t) <= MAX_BYTES) memcpy(bytes[i], kiln_tensor_data(t), kiln_tensor_nbytes(t));
    kiln_tensor_free(t);
  }
  return n;
}

static int same_variables(const kiln_executable *e, unsigned char want[MAX_VARS][MAX_BYTES]) {
  static unsigned char now[MAX_VARS][MAX_BYTES];
  size_t n = snapshot(e, now);
  return memcmp(now, want, n * MAX_BYTES) == 0;
}

static char path[256], bad_path[256];

static void write_file(const char *p, const unsigned char *data, size_t len) {
  FILE *f = fopen(p, "wb");
  CHECK(f != NULL);
  if (!f) return;
  CHECK(fwrite(data, 1, len, f) == len);
  fclose(f);
}

static size_t read_file(const char *p, unsigned char *data, size_t cap) {
  FILE *f = fopen(p, "rb");
  CHECK(f != NULL);
  if (!f) return 0;
  size_t len = fread(data, 1, cap, f);
  fclose(f);
  return len;
}

static void listing_and_access(kiln_executable *e) {
  /* w, b, then Adam's state: w_m, w_v, b_m, b_v and the step count. */
  CHECK(kiln_executable_variable_count(e) >= 4);
  CHECK(kiln_executable_variable_count(NULL) == 0);
  const char *name = NULL;
  kiln_dtype dtype = KILN_DTYPE_INVALID;
  const int64_t *dims = NULL;
  size_t rank = 0;
  OK(kiln_executable_variable_info(e, 0, &name, &dtype, &dims, &rank));
  CHECK(strcmp(name, "w") == 0 && dtype == KILN_DTYPE_F32 && rank == 2 && dims[0] == 2 && dims[1] == 1);
  OK(kiln_executable_variable_info(e, 1, &name, NULL, NULL, &rank));
  CHECK(strcmp(name, "b") == 0 && rank == 1);
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "out of range",
                kiln_executable_variable_info(e, 99, &name, NULL, NULL, NULL));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "e is NULL", kiln_executable_variable_info(NULL, 0, &name, NULL, NULL, NULL));

  kiln_tensor *w = NULL;
  OK(kiln_executable_read_variable(e, "w", &w));
  CHECK(kiln_tensor_dtype(w) == KILN_DTYPE_F32 && kiln_tensor_rank(w) == 2 && kiln_tensor_nbytes(w) == 8);
  CHECK(((const float *)kiln_tensor_data(w))[0] == 0.1f);
  /* Writing changes what the next read and run see. */
  ((float *)kiln_tensor_data(w))[0] = 2.5f;
  OK(kiln_executable_write_variable(e, "w", w));
  kiln_tensor *again = NULL;
  OK(kiln_executable_read_variable(e, "w", &again));
  CHECK(((const float *)kiln_tensor_data(again))[0] == 2.5f);
  kiln_tensor_free(again);
  ((float *)kiln_tensor_data(w))[0] = 0.1f;
  OK(kiln_executable_write_variable(e, "w", w));
  kiln_tensor_free(w);

  kiln_tensor *sentinel = (kiln_tensor *)0x1;
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "no variable 'nope' (the executable's variables: w, b",
                kiln_executable_read_variable(e, "nope", &sentinel));
  CHECK(sentinel == (kiln_tensor *)0x1);
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "e is NULL", kiln_executable_read_variable(NULL, "w", &sentinel));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "name is NULL", kiln_executable_read_variable(e, NULL, &sentinel));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "out is NULL", kiln_executable_read_variable(e, "w", NULL));

  int64_t d3[2] = {3, 1};
  kiln_tensor *wrong = NULL;
  OK(kiln_tensor_new(KILN_DTYPE_F32, d3, 2, &wrong));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "variable 'w' is f32[2, 1], the value given is f32[3, 1]",
                kiln_executable_write_variable(e, "w", wrong));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "no variable 'nope'", kiln_executable_write_variable(e, "nope", wrong));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "value is NULL", kiln_executable_write_variable(e, "w", NULL));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "name is NULL", kiln_executable_write_variable(e, NULL, wrong));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "e is NULL", kiln_executable_write_variable(NULL, "w", wrong));
  kiln_tensor_free(wrong);
}

static void checkpoints(kiln_graph *g, kiln_executable *e) {
  static unsigned char saved[MAX_VARS][MAX_BYTES], now[MAX_VARS][MAX_BYTES];
  for (int s = 0; s < 5; s++) step(e);
  OK(kiln_executable_save_checkpoint(e, path));
  snapshot(e, saved);
  float next = step(e); /* the step after the checkpoint */

  /* Perturb every trainable value, then load: all variables (the optimizer's state too)
     come back, and the next step repeats the one after the checkpoint exactly. */
  int64_t wd[2] = {2, 1};
  float junk[2] = {9.0f, -9.0f};
  kiln_tensor *jt = NULL;
  OK(kiln_tensor_wrap(KILN_DTYPE_F32, wd, 2, junk, sizeof junk, &jt));
  OK(kiln_executable_write_variable(e, "w", jt));
  kiln_tensor_free(jt);
  step(e);
  CHECK(!same_variables(e, saved));
  OK(kiln_executable_load_checkpoint(e, path));
  CHECK(same_variables(e, saved));
  CHECK(step(e) == next);

  /* A fresh executable of the same graph takes the checkpoint too. */
  kiln_executable *fresh = compile_interp(g);
  OK(kiln_executable_load_checkpoint(fresh, path));
  CHECK(same_variables(fresh, saved));
  CHECK(step(fresh) == next);
  kiln_executable_free(fresh);

  /* Bad files: each fails and leaves the variables as they were. */
  static unsigned char file[4096];
  size_t len = read_file(path, file, sizeof file);
  CHECK(len > 40 && len < sizeof file);
  snapshot(e, now);
  write_file(bad_path, file, len / 2);
  EXPECT_STATUS(KILN_STATUS_IO, "truncated", kiln_executable_load_checkpoint(e, bad_path));
  CHECK(same_variables(e, now));
  write_file(bad_path, file, 4);
  EXPECT_STATUS(KILN_STATUS_IO, "not a Kiln checkpoint", kiln_executable_load_checkpoint(e, bad_path));
  file[len - 12] ^= 0x40; /* a bit of the last variable's data */
  write_file(bad_path, file, len);
  EXPECT_STATUS(KILN_STATUS_IO, "checksum mismatch", kiln_executable_load_checkpoint(e, bad_path));
  CHECK(same_variables(e, now));
  EXPECT_STATUS(KILN_STATUS_IO, "no-such-file.ckpt", kiln_executable_load_checkpoint(e, "/nonexistent/no-such-file.ckpt"));

  /* A checkpoint of another graph (w is 3×1 there). */
  kiln_graph *other_g = linear_graph(3);
  kiln_executable *other = compile_interp(other_g);
  kiln_graph_free(other_g);
  OK(kiln_executable_save_checkpoint(other, bad_path));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "variable 'w' is f32[2, 1] in the executable but f32[3, 1] in the file",
                kiln_executable_load_checkpoint(e, bad_path));
  CHECK(check_contains(kiln_last_error_message(), "another graph"));
  CHECK(check_contains(kiln_last_error_message(), "variable 'w_m'"));
  CHECK(same_variables(e, now));
  kiln_executable_free(other);

  EXPECT_STATUS(KILN_STATUS_IO, "no-such-dir", kiln_executable_save_checkpoint(e, "/nonexistent/no-such-dir/x.ckpt"));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "path is NULL", kiln_executable_save_checkpoint(e, NULL));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "e is NULL", kiln_executable_save_checkpoint(NULL, path));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "path is NULL", kiln_executable_load_checkpoint(e, NULL));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "e is NULL", kiln_executable_load_checkpoint(NULL, path));
  remove(path);
  remove(bad_path);
}

int main(void) {
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !*tmp) tmp = "/tmp";
  snprintf(path, sizeof path, "%s/kiln-capi-checkpoint-%ld.ckpt", tmp, (long)getpid());
  snprintf(bad_path, sizeof bad_path, "%s/kiln-capi-checkpoint-%ld.bad", tmp, (long)getpid());
  for (int i = 0; i < N; i++) {
    xv[2 * i] = (float)(i % 4) - 1.5f;
    xv[2 * i + 1] = (float)(i / 4) - 0.5f + 0.1f * (float)i;
    yv[i] = 2.0f * xv[2 * i] - 3.0f * xv[2 * i + 1] + 0.5f;
  }
  kiln_graph *g = linear_graph(2);
  kiln_executable *e = compile_interp(g);
  listing_and_access(e);
  checkpoints(g, e);
  kiln_executable_free(e);
  kiln_graph_free(g);
  return check_report("checkpoint");
}
