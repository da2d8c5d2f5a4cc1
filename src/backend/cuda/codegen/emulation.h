// Host emulation of the CUDA C subset Kiln's generated kernels use, so that g++ can
// compile them and their arithmetic can be checked without a GPU.
//
// A launch runs the grid's blocks one after another. A block's threads run as fibers
// (ucontext) on one OS thread, switching only at __syncthreads() and warp shuffles, so
// those are real barriers: a thread waits there until every live thread of its block
// (or warp) has arrived. A kernel that uses neither runs each thread straight through
// (KILN_EMU_COOPERATIVE 0). A barrier no thread can pass aborts with a message.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <functional>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x, y, z;
};
struct float4 {
  float x, y, z, w;
};
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

static uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;

static inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
static inline int __float_as_int(float f) {
  int i;
  memcpy(&i, &f, 4);
  return i;
}
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fdividef(float a, float b) { return a / b; }

namespace kiln_emu {

struct Fiber {
  ucontext_t ctx;
  uint3 tid;
  bool done;
};

static const size_t kStack = 64 * 1024;
static ucontext_t g_sched;
static std::vector<Fiber> g_fibers;
static std::vector<char> g_stacks;
static std::function<void()> g_body;
static bool g_cooperative = false;
static int g_current = -1;
// Block barrier: arrivals and a generation that advances when all live threads arrived.
static unsigned g_live = 0, g_arrived = 0;
static unsigned long long g_gen = 0;
// Warp barriers, the same per warp, and the values lanes exchange.
static std::vector<unsigned> g_warp_live, g_warp_arrived;
static std::vector<unsigned long long> g_warp_gen;
static std::vector<unsigned long long> g_slots;
// Progress made since the scheduler last looked (arrivals, releases, exits).
static unsigned long long g_events = 0;

static inline unsigned linear_tid() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

static void yield() {
  if (!g_cooperative) {
    fprintf(stderr, "kiln_emu: a barrier in a kernel launched without fibers\n");
    exit(3);
  }
  swapcontext(&g_fibers[g_current].ctx, &g_sched);
}

__attribute__((noinline)) static void syncthreads() {
  unsigned long long gen = g_gen;
  ++g_events;
  if (++g_arrived == g_live) {
    g_arrived = 0;
    ++g_gen;
    return;
  }
  while (g_gen == gen) yield();
}

static void warp_barrier(unsigned w) {
  unsigned long long gen = g_warp_gen[w];
  ++g_events;
  if (++g_warp_arrived[w] == g_warp_live[w]) {
    g_warp_arrived[w] = 0;
    ++g_warp_gen[w];
    return;
  }
  while (g_warp_gen[w] == gen) yield();
}

// Every lane publishes its value, then reads lane `src` of its warp (its own value when
// `src` is out of range), and the warp waits again before the slots are reused.
template <typename T>
__attribute__((noinline)) static T shuffle(T v, int src_lane, bool in_range) {
  static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
  unsigned t = linear_tid(), w = t / 32;
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof(T));
  g_slots[t] = bits;
  warp_barrier(w);
  unsigned src = w * 32 + (unsigned)src_lane;
  T r = v;
  if (in_range && src < g_fibers.size() && !g_fibers[src].done) memcpy(&r, &g_slots[src], sizeof(T));
  warp_barrier(w);
  return r;
}

static void exit_thread() {
  unsigned t = linear_tid(), w = t / 32;
  g_fibers[g_current].done = true;
  ++g_events;
  --g_live;
  if (g_arrived > 0 && g_arrived == g_live) {
    g_arrived = 0;
    ++g_gen;
  }
  --g_warp_live[w];
  if (g_warp_arrived[w] > 0 && g_warp_arrived[w] == g_warp_live[w]) {
    g_warp_arrived[w] = 0;
    ++g_warp_gen[w];
  }
}

static void trampoline() {
  g_body();
  exit_thread();
  // uc_link returns to the scheduler.
}

static void run_block(unsigned nthreads) {
  if (!g_cooperative) {
    for (unsigned t = 0; t < nthreads; ++t) {
      threadIdx = uint3{t % blockDim.x, (t / blockDim.x) % blockDim.y, t / (blockDim.x * blockDim.y)};
      g_body();
    }
    return;
  }
  g_fibers.assign(nthreads, Fiber());
  if (g_stacks.size() < nthreads * kStack) g_stacks.resize(nthreads * kStack);
  unsigned warps = (nthreads + 31) / 32;
  g_warp_live.assign(warps, 0);
  g_warp_arrived.assign(warps, 0);
  g_warp_gen.assign(warps, 0);
  g_slots.assign(warps * 32, 0);
  g_live = nthreads;
  g_arrived = 0;
  for (unsigned t = 0; t < nthreads; ++t) {
    Fiber& f = g_fibers[t];
    f.tid = uint3{t % blockDim.x, (t / blockDim.x) % blockDim.y, t / (blockDim.x * blockDim.y)};
    f.done = false;
    ++g_warp_live[t / 32];
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = &g_stacks[t * kStack];
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = &g_sched;
    makecontext(&f.ctx, trampoline, 0);
  }
  unsigned remaining = nthreads;
  while (remaining > 0) {
    unsigned long long before = g_events;
    for (unsigned t = 0; t < nthreads; ++t) {
      if (g_fibers[t].done) continue;
      g_current = (int)t;
      threadIdx = g_fibers[t].tid;
      swapcontext(&g_sched, &g_fibers[t].ctx);
      if (g_fibers[t].done) --remaining;
    }
    if (remaining > 0 && g_events == before) {
      fprintf(stderr, "kiln_emu: deadlock: %u threads of block (%u,%u,%u) wait at a barrier no thread can pass\n",
              remaining, blockIdx.x, blockIdx.y, blockIdx.z);
      exit(3);
    }
  }
  g_current = -1;
}

// Runs `body` (one thread's kernel call) over the whole grid.
static void launch(bool cooperative, dim3 grid, dim3 block, std::function<void()> body) {
  g_cooperative = cooperative;
  g_body = body;
  gridDim = grid;
  blockDim = block;
  unsigned nthreads = block.x * block.y * block.z;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = uint3{x, y, z};
        run_block(nthreads);
      }
}

}  // namespace kiln_emu

static inline void __syncthreads() { kiln_emu::syncthreads(); }

template <typename T>
static inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  int lane = (int)(kiln_emu::linear_tid() % 32);
  int src = lane + (int)delta;
  return kiln_emu::shuffle(v, src, (lane % width) + (int)delta < width);
}
template <typename T>
static inline T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
  int lane = (int)(kiln_emu::linear_tid() % 32);
  int src = lane - (int)delta;
  return kiln_emu::shuffle(v, src, (lane % width) >= (int)delta);
}
template <typename T>
static inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  int lane = (int)(kiln_emu::linear_tid() % 32);
  int src = lane ^ mask;
  return kiln_emu::shuffle(v, src, src / width == lane / width);
}
template <typename T>
static inline T __shfl_sync(unsigned, T v, int src_lane, int width = 32) {
  int lane = (int)(kiln_emu::linear_tid() % 32);
  int src = (lane / width) * width + src_lane % width;
  return kiln_emu::shuffle(v, src, true);
}

// Host programs read and write raw buffers.
namespace kiln_emu {
static void* read_file(const char* path, size_t bytes) {
  void* p = aligned_alloc(64, bytes < 64 ? 64 : (bytes + 63) / 64 * 64);
  FILE* f = fopen(path, "rb");
  if (!f || fread(p, 1, bytes, f) != bytes) {
    fprintf(stderr, "kiln_emu: cannot read %zu bytes of %s\n", bytes, path);
    exit(2);
  }
  fclose(f);
  return p;
}
static void write_file(const char* path, const void* p, size_t bytes) {
  FILE* f = fopen(path, "wb");
  if (!f || fwrite(p, 1, bytes, f) != bytes) {
    fprintf(stderr, "kiln_emu: cannot write %s\n", path);
    exit(2);
  }
  fclose(f);
}
// A pointer of any element type, as the kernel's signature wants it.
struct Buf {
  void* p;
  template <typename T>
  operator T*() const {
    return (T*)p;
  }
};
}  // namespace kiln_emu
