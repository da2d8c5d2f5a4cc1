/* Versions, status strings, per-thread errors, and tensors. */
#include <pthread.h>
#include <stdint.h>

#include "check.h"

static void versions_and_statuses(void) {
  CHECK(kiln_version_number() == KILN_VERSION_NUMBER);
  CHECK(strcmp(kiln_version_string(), KILN_VERSION_STRING) == 0);
  CHECK(strcmp(kiln_status_string(KILN_STATUS_OK), "KILN_STATUS_OK") == 0);
  const kiln_status all[] = {KILN_STATUS_NULL_ARGUMENT,   KILN_STATUS_INVALID_ARGUMENT,
                             KILN_STATUS_BUFFER_TOO_SMALL, KILN_STATUS_IO,
                             KILN_STATUS_INVALID_GRAPH,    KILN_STATUS_UNKNOWN_OP,
                             KILN_STATUS_PARSE,            KILN_STATUS_UNSUPPORTED,
                             KILN_STATUS_UNSUPPORTED_VERSION, KILN_STATUS_COMPILE_FAILED,
                             KILN_STATUS_RUN_FAILED,       KILN_STATUS_RUN_BAD_INPUT,
                             KILN_STATUS_DEVICE_UNAVAILABLE, KILN_STATUS_INTERNAL};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    const char *s = kiln_status_string(all[i]);
    CHECK(strncmp(s, "KILN_STATUS_", 12) == 0 && strcmp(s, "KILN_STATUS_UNKNOWN") != 0);
  }
  CHECK(strcmp(kiln_status_string(12345), "KILN_STATUS_UNKNOWN") == 0);
}

static void *fail_on_another_thread(void *arg) {
  (void)arg;
  CHECK(strcmp(kiln_last_error_message(), "") == 0); /* a fresh thread has no error */
  kiln_tensor *t = NULL;
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "dtype", kiln_tensor_new(99, NULL, 0, &t));
  return NULL;
}

static void errors_are_per_thread(void) {
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "out", kiln_tensor_new(KILN_DTYPE_F32, NULL, 0, NULL));
  pthread_t th;
  CHECK(pthread_create(&th, NULL, fail_on_another_thread, NULL) == 0);
  CHECK(pthread_join(th, NULL) == 0);
  /* This thread's message is still its own. */
  CHECK(strstr(kiln_last_error_message(), "out is NULL") != NULL);
}

static void owned_tensors(void) {
  int64_t dims[2] = {2, 3};
  kiln_tensor *t = NULL;
  OK(kiln_tensor_new(KILN_DTYPE_F64, dims, 2, &t));
  CHECK(kiln_tensor_dtype(t) == KILN_DTYPE_F64);
  CHECK(kiln_tensor_rank(t) == 2);
  CHECK(kiln_tensor_dims(t)[0] == 2 && kiln_tensor_dims(t)[1] == 3);
  CHECK(kiln_tensor_nbytes(t) == 48);
  double *d = kiln_tensor_data(t);
  CHECK(d != NULL && ((uintptr_t)d % 64) == 0);
  for (int i = 0; i < 6; i++) CHECK(d[i] == 0.0);
  kiln_tensor_free(t);

  /* Every dtype, and rank 0 and empty tensors. */
  for (kiln_dtype dt = KILN_DTYPE_F32; dt <= KILN_DTYPE_BOOL; dt++) {
    kiln_tensor *s = NULL;
    OK(kiln_tensor_new(dt, NULL, 0, &s));
    CHECK(kiln_tensor_rank(s) == 0 && kiln_tensor_nbytes(s) > 0);
    kiln_tensor_free(s);
  }
  int64_t empty[2] = {0, 5};
  OK(kiln_tensor_new(KILN_DTYPE_I32, empty, 2, &t));
  CHECK(kiln_tensor_nbytes(t) == 0 && kiln_tensor_data(t) != NULL);
  kiln_tensor_free(t);

  /* Bad arguments leave the out-parameter alone. */
  kiln_tensor *untouched = (kiln_tensor *)0x1;
  int64_t neg[1] = {-2};
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "dims[0] is -2", kiln_tensor_new(KILN_DTYPE_F32, neg, 1, &untouched));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "not a kiln_dtype", kiln_tensor_new(KILN_DTYPE_INVALID, dims, 2, &untouched));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "dims", kiln_tensor_new(KILN_DTYPE_F32, NULL, 2, &untouched));
  int64_t huge[3] = {INT64_MAX / 2, 4, 4};
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "too many", kiln_tensor_new(KILN_DTYPE_F32, huge, 3, &untouched));
  CHECK(untouched == (kiln_tensor *)0x1);

  /* NULL handles: getters give neutral values, free is a no-op. */
  CHECK(kiln_tensor_data(NULL) == NULL);
  CHECK(kiln_tensor_dims(NULL) == NULL);
  CHECK(kiln_tensor_rank(NULL) == 0 && kiln_tensor_nbytes(NULL) == 0);
  CHECK(kiln_tensor_dtype(NULL) == KILN_DTYPE_INVALID);
  kiln_tensor_free(NULL);
}

static void wrapped_tensors(void) {
  float buf[6] = {1, 2, 3, 4, 5, 6};
  int64_t dims[2] = {3, 2};
  kiln_tensor *t = NULL;
  OK(kiln_tensor_wrap(KILN_DTYPE_F32, dims, 2, buf, sizeof buf, &t));
  CHECK(kiln_tensor_data(t) == buf); /* zero copy */
  buf[0] = 42.0f;
  CHECK(((float *)kiln_tensor_data(t))[0] == 42.0f);
  kiln_tensor_free(t); /* leaves buf alone */
  CHECK(buf[5] == 6.0f);

  kiln_tensor *untouched = NULL;
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "nbytes is 20", kiln_tensor_wrap(KILN_DTYPE_F32, dims, 2, buf, 20, &untouched));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "data", kiln_tensor_wrap(KILN_DTYPE_F32, dims, 2, NULL, sizeof buf, &untouched));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "out", kiln_tensor_wrap(KILN_DTYPE_F32, dims, 2, buf, sizeof buf, NULL));
  CHECK(untouched == NULL);
  int64_t zero[1] = {0};
  OK(kiln_tensor_wrap(KILN_DTYPE_U8, zero, 1, NULL, 0, &t));
  kiln_tensor_free(t);
}

int main(void) {
  versions_and_statuses();
  errors_are_per_thread();
  owned_tensors();
  wrapped_tensors();
  return check_report("basics");
}
