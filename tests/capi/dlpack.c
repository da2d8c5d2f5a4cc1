/* DLPack 1.0 in and out: exports share Kiln's memory and outlive the handle, compact
 * imports are wrapped, strided ones copied once in the right order, and every producer's
 * deleter runs exactly once (never on a failed import: the caller keeps the tensor). */
#include <stdint.h>

#include "check.h"

/* dlpack.h v1.0's structs, as a caller that does not install dlpack.h declares them
 * (kiln.h names them only; tests/capi must build from this tree alone). */
typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;
typedef struct {
  int device_type; /* DLDeviceType: kDLCPU = 1, kDLCUDA = 2 */
  int32_t device_id;
} DLDevice;
typedef struct {
  uint8_t code; /* kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLComplex 5, kDLBool 6 */
  uint8_t bits;
  uint16_t lanes;
} DLDataType;
typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
};
#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)

/* A producer's tensor: its managed struct, storage, and how often it was deleted. */
typedef struct {
  struct DLManagedTensorVersioned managed;
  DLManagedTensor legacy;
  float storage[16];
  int64_t shape[2];
  int64_t strides[2];
  int deleted;
} producer;

static void delete_versioned(struct DLManagedTensorVersioned *self) {
  ((producer *)self->manager_ctx)->deleted++;
}

static void delete_legacy(DLManagedTensor *self) { ((producer *)self->manager_ctx)->deleted++; }

/* A 3×4 f32 matrix m[i][j] = i * 4 + j in `storage`, described as `rows`×`cols` with
 * `strides` (NULL: compact). */
static void produce(producer *p, int64_t rows, int64_t cols, const int64_t *strides) {
  memset(p, 0, sizeof *p);
  for (int i = 0; i < 16; i++) p->storage[i] = (float)i;
  p->shape[0] = rows;
  p->shape[1] = cols;
  DLTensor t = {p->storage, {1, 0}, 2, {2, 32, 1}, p->shape, NULL, 0};
  if (strides) {
    p->strides[0] = strides[0];
    p->strides[1] = strides[1];
    t.strides = p->strides;
  }
  p->managed.version.major = 1;
  p->managed.version.minor = 0;
  p->managed.manager_ctx = p;
  p->managed.deleter = delete_versioned;
  p->managed.dl_tensor = t;
  p->legacy.dl_tensor = t;
  p->legacy.manager_ctx = p;
  p->legacy.deleter = delete_legacy;
}

static void round_trip_shares_memory(void) {
  const int64_t dims[2] = {2, 3};
  kiln_tensor *t = NULL;
  OK(kiln_tensor_new(KILN_DTYPE_F32, dims, 2, &t));
  float *data = kiln_tensor_data(t);
  for (int i = 0; i < 6; i++) data[i] = (float)i + 0.5f;

  struct DLManagedTensorVersioned *m = NULL;
  OK(kiln_tensor_to_dlpack(t, &m));
  CHECK(m && m->version.major == 1 && m->version.minor == 0 && m->flags == 0);
  CHECK(m->dl_tensor.data == (void *)data && m->dl_tensor.byte_offset == 0);
  CHECK(m->dl_tensor.device.device_type == 1 && m->dl_tensor.device.device_id == 0);
  CHECK(m->dl_tensor.ndim == 2 && m->dl_tensor.shape[0] == 2 && m->dl_tensor.shape[1] == 3);
  CHECK(m->dl_tensor.strides[0] == 3 && m->dl_tensor.strides[1] == 1);
  CHECK(m->dl_tensor.dtype.code == 2 && m->dl_tensor.dtype.bits == 32 &&
        m->dl_tensor.dtype.lanes == 1);
  /* The export keeps the memory: valgrind would see a read after free. */
  kiln_tensor_free(t);
  CHECK(((float *)m->dl_tensor.data)[5] == 5.5f);

  /* Back into Kiln: wrapped, the same memory; freeing it runs Kiln's deleter. */
  kiln_tensor *back = NULL;
  OK(kiln_tensor_from_dlpack(m, &back));
  CHECK(kiln_tensor_data(back) == (void *)data);
  CHECK(kiln_tensor_rank(back) == 2 && kiln_tensor_dims(back)[1] == 3);
  CHECK(kiln_tensor_dtype(back) == KILN_DTYPE_F32 && kiln_tensor_nbytes(back) == 24);
  CHECK(((float *)kiln_tensor_data(back))[4] == 4.5f);
  kiln_tensor_free(back);

  /* The same through the unversioned struct. */
  const int64_t one[1] = {4};
  OK(kiln_tensor_new(KILN_DTYPE_BOOL, one, 1, &t));
  ((uint8_t *)kiln_tensor_data(t))[2] = 1;
  DLManagedTensor *legacy = NULL;
  OK(kiln_tensor_to_dlpack_legacy(t, &legacy));
  CHECK(legacy->dl_tensor.dtype.code == 6 && legacy->dl_tensor.dtype.bits == 8);
  CHECK(legacy->dl_tensor.data == kiln_tensor_data(t));
  kiln_tensor_free(t);
  OK(kiln_tensor_from_dlpack_legacy(legacy, &back));
  CHECK(kiln_tensor_dtype(back) == KILN_DTYPE_BOOL && ((uint8_t *)kiln_tensor_data(back))[2] == 1);
  kiln_tensor_free(back);

  /* A deleter called directly frees the export too. */
  OK(kiln_tensor_new(KILN_DTYPE_I64, NULL, 0, &t));
  OK(kiln_tensor_to_dlpack(t, &m));
  CHECK(m->dl_tensor.ndim == 0 && m->dl_tensor.dtype.code == 0 && m->dl_tensor.dtype.bits == 64);
  kiln_tensor_free(t);
  m->deleter(m);
}

static void strided_imports_are_copied_in_order(void) {
  /* The 4×3 transpose of the 3×4 matrix: element [j][i] at j + 4 i. */
  producer p;
  const int64_t transposed[2] = {1, 4};
  produce(&p, 4, 3, transposed);
  kiln_tensor *t = NULL;
  OK(kiln_tensor_from_dlpack(&p.managed, &t));
  CHECK(p.deleted == 1); /* copied: the producer's memory went back at once */
  const float *got = kiln_tensor_data(t);
  CHECK(got != p.storage);
  CHECK(kiln_tensor_dims(t)[0] == 4 && kiln_tensor_dims(t)[1] == 3);
  int wrong = 0;
  for (int j = 0; j < 4; j++)
    for (int i = 0; i < 3; i++) wrong += got[j * 3 + i] != (float)(i * 4 + j);
  CHECK(wrong == 0);
  kiln_tensor_free(t);
  CHECK(p.deleted == 1);

  /* Every other column (stride 2) from element 1 on, through the legacy struct. */
  const int64_t every_other[2] = {4, 2};
  produce(&p, 3, 2, every_other);
  p.legacy.dl_tensor.byte_offset = sizeof(float);
  OK(kiln_tensor_from_dlpack_legacy(&p.legacy, &t));
  CHECK(p.deleted == 1);
  got = kiln_tensor_data(t);
  CHECK(got[0] == 1.0f && got[1] == 3.0f && got[2] == 5.0f && got[5] == 11.0f);
  kiln_tensor_free(t);
}

static void compact_imports_are_wrapped_at_their_offset(void) {
  producer p;
  const int64_t row_major[2] = {3, 1};
  produce(&p, 2, 3, row_major);
  p.managed.dl_tensor.byte_offset = 2 * sizeof(float);
  p.managed.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  kiln_tensor *t = NULL;
  OK(kiln_tensor_from_dlpack(&p.managed, &t));
  CHECK(kiln_tensor_data(t) == (void *)(p.storage + 2));
  CHECK(p.deleted == 0); /* wrapped: still in use */
  /* Re-exported, it stays read-only and keeps the producer's tensor past the handle. */
  struct DLManagedTensorVersioned *m = NULL;
  OK(kiln_tensor_to_dlpack(t, &m));
  CHECK(m->flags == DLPACK_FLAG_BITMASK_READ_ONLY && m->dl_tensor.data == p.storage + 2);
  kiln_tensor_free(t);
  CHECK(p.deleted == 0);
  m->deleter(m);
  CHECK(p.deleted == 1);

  /* Strides NULL, and a unit dim's stride that does not matter: both wrapped. */
  const int64_t odd_unit_stride[2] = {99, 1};
  produce(&p, 1, 4, odd_unit_stride);
  OK(kiln_tensor_from_dlpack(&p.managed, &t));
  CHECK(kiln_tensor_data(t) == (void *)p.storage && p.deleted == 0);
  kiln_tensor_free(t);
  CHECK(p.deleted == 1);
  produce(&p, 3, 4, NULL);
  OK(kiln_tensor_from_dlpack(&p.managed, &t));
  CHECK(kiln_tensor_data(t) == (void *)p.storage && kiln_tensor_nbytes(t) == 48);
  kiln_tensor_free(t);
  CHECK(p.deleted == 1);
}

static void failed_imports_leave_the_tensor_to_the_caller(void) {
  producer p;
  kiln_tensor *t = NULL;
  produce(&p, 3, 4, NULL);
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "src", kiln_tensor_from_dlpack(NULL, &t));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "src", kiln_tensor_from_dlpack_legacy(NULL, &t));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "out", kiln_tensor_from_dlpack(&p.managed, NULL));

  p.managed.dl_tensor.device.device_type = 2;
  EXPECT_STATUS(KILN_STATUS_UNSUPPORTED, "src->dl_tensor.device is kDLCUDA (2)",
                kiln_tensor_from_dlpack(&p.managed, &t));
  p.managed.dl_tensor.device.device_type = 1;

  const DLDataType complex64 = {5, 64, 1}, vector = {2, 32, 4}, odd_bits = {0, 12, 1};
  p.managed.dl_tensor.dtype = complex64;
  EXPECT_STATUS(KILN_STATUS_UNSUPPORTED, "src->dl_tensor.dtype is kDLComplex with 64 bits",
                kiln_tensor_from_dlpack(&p.managed, &t));
  p.managed.dl_tensor.dtype = vector;
  EXPECT_STATUS(KILN_STATUS_UNSUPPORTED, "4 lanes", kiln_tensor_from_dlpack(&p.managed, &t));
  p.managed.dl_tensor.dtype = odd_bits;
  EXPECT_STATUS(KILN_STATUS_UNSUPPORTED, "kDLInt with 12 bits",
                kiln_tensor_from_dlpack(&p.managed, &t));
  p.managed.dl_tensor.dtype.code = 2;
  p.managed.dl_tensor.dtype.bits = 32;

  p.managed.version.major = 2;
  EXPECT_STATUS(KILN_STATUS_UNSUPPORTED_VERSION, "src->version is 2.0",
                kiln_tensor_from_dlpack(&p.managed, &t));
  p.managed.version.major = 1;

  p.managed.dl_tensor.shape[0] = -3;
  EXPECT_STATUS(KILN_STATUS_INVALID_ARGUMENT, "src->dl_tensor.shape[0] is -3",
                kiln_tensor_from_dlpack(&p.managed, &t));
  p.managed.dl_tensor.shape[0] = 3;
  p.managed.dl_tensor.data = NULL;
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "src->dl_tensor.data",
                kiln_tensor_from_dlpack(&p.managed, &t));
  CHECK(t == NULL);
  CHECK(p.deleted == 0); /* never called on failure: the tensor is still ours */
  p.managed.deleter(&p.managed);
  CHECK(p.deleted == 1);

  /* Exports: NULLs and dtypes DLPack 1.0 lacks. */
  struct DLManagedTensorVersioned *m = NULL;
  DLManagedTensor *legacy = NULL;
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "t", kiln_tensor_to_dlpack(NULL, &m));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "t", kiln_tensor_to_dlpack_legacy(NULL, &legacy));
  const int64_t dims[1] = {2};
  OK(kiln_tensor_new(KILN_DTYPE_I4, dims, 1, &t));
  EXPECT_STATUS(KILN_STATUS_UNSUPPORTED, "i4 has no DLPack 1.0 data type",
                kiln_tensor_to_dlpack(t, &m));
  EXPECT_STATUS(KILN_STATUS_NULL_ARGUMENT, "out", kiln_tensor_to_dlpack(t, NULL));
  CHECK(m == NULL && legacy == NULL);
  kiln_tensor_free(t);
}

int main(void) {
  round_trip_shares_memory();
  strided_imports_are_copied_in_order();
  compact_imports_are_wrapped_at_their_offset();
  failed_imports_leave_the_tensor_to_the_caller();
  return check_report("dlpack");
}
