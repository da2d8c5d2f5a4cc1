/* A tiny assertion kit for the C ABI tests: each failure prints where, the status name
 * and this thread's last error message, and makes the program exit non-zero. */
#ifndef KILN_TEST_CHECK_H
#define KILN_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

static int check_failures = 0;

static const char *check_show(const char *s) { return s ? s : "(null)"; }

/* Whether `hay` contains `needle`; a NULL needle matches anything. */
static int check_contains(const char *hay, const char *needle) {
  return needle == NULL || strstr(hay, needle) != NULL;
}

static int check_count = 0;

#define CHECK(cond)                                                                    \
  do {                                                                                 \
    check_count++;                                                                     \
    if (!(cond)) {                                                                     \
      check_failures++;                                                                \
      fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: %s)\n", __FILE__, __LINE__, \
              #cond, kiln_last_error_message());                                       \
    }                                                                                  \
  } while (0)

/* Calls `call` and expects status `want`; when `needle` is not NULL, the message must
 * contain it. */
#define EXPECT_STATUS(want, needle, call)                                                \
  do {                                                                                   \
    kiln_status got_ = (call);                                                           \
    check_count++;                                                                       \
    if (got_ != (want)) {                                                                \
      check_failures++;                                                                  \
      fprintf(stderr, "%s:%d: %s gave %s, wanted %s (last error: %s)\n", __FILE__,       \
              __LINE__, #call, kiln_status_string(got_), kiln_status_string(want),       \
              kiln_last_error_message());                                                \
    } else if ((want) != KILN_STATUS_OK &&                                               \
               !check_contains(kiln_last_error_message(), (needle))) {                   \
      check_failures++;                                                                  \
      fprintf(stderr, "%s:%d: %s: message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__,    \
              #call, kiln_last_error_message(), check_show(needle));                     \
    }                                                                                    \
  } while (0)

#define OK(call) EXPECT_STATUS(KILN_STATUS_OK, NULL, call)

static int check_report(const char *name) {
  printf("%s: %d checks, %d failed\n", name, check_count, check_failures);
  return check_failures == 0 ? 0 : 1;
}

#endif
