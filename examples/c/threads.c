/* Eight threads run one compiled executable at once, each on its own inputs and batch
 * sizes, and check every result against plain C. Exits non-zero on any mismatch. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln.h"

#define THREADS 8
#define RUNS 100

struct job {
  const kiln_executable *exe;
  int id;
  int errors;
};

/* y = relu(x @ w + 1) with w = [[1, -1], [2, 0.5], [-1, 1]], x: f32[N, 3]. */
static const float w[6] = {1.0f, -1.0f, 2.0f, 0.5f, -1.0f, 1.0f};

static void *worker(void *arg) {
  struct job *j = arg;
  for (int r = 0; r < RUNS; r++) {
    int64_t batch = 1 + (j->id + r) % 5;
    int64_t dims[2] = {batch, 3};
    kiln_tensor *x = NULL, *y = NULL;
    if (kiln_tensor_new(KILN_DTYPE_F32, dims, 2, &x) != KILN_STATUS_OK) {
      j->errors++;
      continue;
    }
    float *xd = kiln_tensor_data(x);
    for (int64_t i = 0; i < batch * 3; i++) xd[i] = (float)((j->id * 31 + r * 7 + i) % 13) * 0.25f - 1.5f;
    const kiln_tensor *ins[1] = {x};
    if (kiln_executable_run(j->exe, ins, 1, &y, 1) != KILN_STATUS_OK) {
      fprintf(stderr, "thread %d: %s\n", j->id, kiln_last_error_message());
      j->errors++;
    } else {
      const float *yd = kiln_tensor_data(y);
      for (int64_t b = 0; b < batch; b++) {
        for (int k = 0; k < 2; k++) {
          float acc = 1.0f;
          for (int i = 0; i < 3; i++) acc += xd[b * 3 + i] * w[i * 2 + k];
          float want = acc > 0.0f ? acc : 0.0f;
          float d = yd[b * 2 + k] - want;
          if (d > 1e-5f || d < -1e-5f) j->errors++;
        }
      }
      kiln_tensor_free(y);
    }
    kiln_tensor_free(x);
  }
  return NULL;
}

int main(void) {
  const char *text =
      "graph \"threads\" {\n"
      "  %0 \"x\" = Parameter : f32[N, 3]\n"
      "  %1 \"w\" = Constant : f32[3, 2] = [1.0, -1.0, 2.0, 0.5, -1.0, 1.0]\n"
      "  %2 \"one\" = Constant : f32[] = [1.0]\n"
      "  %3 \"xw\" = MatMul(%0, %1) : f32[N, 2]\n"
      "  %4 \"z\" = Add(%3, %2) : f32[N, 2]\n"
      "  %5 \"y\" = Relu(%4) : f32[N, 2]\n"
      "  return \"y\" = %5\n"
      "}\n";
  kiln_graph *g = NULL;
  kiln_executable *exe = NULL;
  if (kiln_graph_parse(text, &g) != KILN_STATUS_OK || kiln_compile(g, NULL, &exe) != KILN_STATUS_OK) {
    fprintf(stderr, "build: %s\n", kiln_last_error_message());
    kiln_graph_free(g);
    return 1;
  }
  kiln_graph_free(g);
  pthread_t threads[THREADS];
  struct job jobs[THREADS];
  for (int i = 0; i < THREADS; i++) {
    jobs[i] = (struct job){exe, i, 0};
    if (pthread_create(&threads[i], NULL, worker, &jobs[i]) != 0) return 1;
  }
  int errors = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(threads[i], NULL);
    errors += jobs[i].errors;
  }
  kiln_executable_free(exe);
  printf("%d threads x %d runs: %d errors\n", THREADS, RUNS, errors);
  return errors != 0;
}
