/* Devices: kiln_has_cuda, kiln_device_available, and compiling for "cuda:N" where the
 * device cannot be used. Passes in both builds (with and without the `cuda` feature)
 * and on a machine with or without a CUDA driver and device. */
#include "check.h"

static const char *AXPY = "graph \"axpy\" {\n"
                          "  %0 \"x\" = Parameter : f32[N]\n"
                          "  %1 \"y\" = Parameter : f32[N]\n"
                          "  %2 \"z\" = Add(%0, %1) : f32[N]\n"
                          "  return \"z\" = %2\n"
                          "}\n";

/* The status of compiling AXPY for `device`; the executable, if any, is freed. */
static kiln_status compile_for(const char *device) {
  kiln_graph *g = NULL;
  kiln_compile_options *o = NULL;
  kiln_executable *e = NULL;
  OK(kiln_graph_parse(AXPY, &g));
  OK(kiln_compile_options_new(&o));
  OK(kiln_compile_options_set_backend(o, device));
  kiln_status s = kiln_compile(g, o, &e);
  CHECK((s == KILN_STATUS_OK) == (e != NULL));
  kiln_executable_free(e);
  kiln_compile_options_free(o);
  kiln_graph_free(g);
  return s;
}

static void host_devices(void) {
  OK(kiln_device_available("cpu"));
  OK(kiln_device_available("interp"));
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "unknown device 'tpu'", kiln_device_available("tpu"));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "device", kiln_device_available(NULL));
  CHECK(compile_for("cpu") == KILN_STATUS_OK);
}

static void cuda_devices(void) {
  CHECK(kiln_has_cuda() == 0 || kiln_has_cuda() == 1);
  /* The in-tree header says 0 unless the build system defines it. */
  CHECK(KILN_HAS_CUDA == 0 || KILN_HAS_CUDA == kiln_has_cuda());
  if (!kiln_has_cuda()) {
    EXPECT_STATUS(KILN_STATUS_DEVICE_UNAVAILABLE, "cuda:0: Kiln was built without CUDA", kiln_device_available("cuda:0"));
    EXPECT_STATUS(KILN_STATUS_DEVICE_UNAVAILABLE, "cuda:0: Kiln was built without CUDA", compile_for("cuda:0"));
    EXPECT_STATUS(KILN_STATUS_DEVICE_UNAVAILABLE, "cuda:3: Kiln was built without CUDA", compile_for("cuda:3"));
    return;
  }
  /* Built with CUDA: no ordinal this large exists, whatever the machine has. */
  EXPECT_STATUS(KILN_STATUS_DEVICE_UNAVAILABLE, "cuda:4000000000: ", kiln_device_available("cuda:4000000000"));
  const char *why = kiln_last_error_message();
  CHECK(strstr(why, "no CUDA driver") || strstr(why, "no such device") || strstr(why, "no CUDA device") || strstr(why, "failed to initialize"));
  kiln_status s = kiln_device_available("cuda:0");
  if (s == KILN_STATUS_OK) {
    printf("device: cuda:0 is available\n");
  } else {
    /* The same reason from kiln_compile as from the probe. */
    CHECK(s == KILN_STATUS_DEVICE_UNAVAILABLE);
    char probe_message[512];
    snprintf(probe_message, sizeof probe_message, "%s", kiln_last_error_message());
    CHECK(strncmp(probe_message, "device unavailable: cuda:0: ", 28) == 0);
    EXPECT_STATUS(KILN_STATUS_DEVICE_UNAVAILABLE, probe_message, compile_for("cuda:0"));
    printf("device: SKIPPED: no CUDA device (%s)\n", probe_message);
  }
}

int main(void) {
  host_devices();
  cuda_devices();
  return check_report("device");
}
