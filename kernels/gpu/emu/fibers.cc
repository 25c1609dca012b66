// Fibers for the emulated backend: one stack per thread of a block (reused across blocks and
// launches). A thread runs up to its next barrier, then switches straight to the next runnable
// thread; the last thread to reach a barrier (or to exit while others wait) releases it. On x86-64
// a switch is six register pushes and pops (samplerd_emu_switch_stacks); elsewhere ucontext, whose
// swapcontext also makes a signal-mask system call per switch (~10x slower).
#include "kernels/gpu/emu/fibers.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "kernels/gpu/emu/launch_hook.h"

namespace samplerd::kernels::gpu::emu {
namespace {

// Kernels keep their locals in registers on a GPU; here they live on these stacks (an unoptimised
// build needs far more than an optimised one). A guard page below each catches an overflow.
constexpr size_t kStackBytes = size_t{512} << 10;

enum class Wait : uint8_t { kNone, kBlock, kWave };

#if defined(__x86_64__)
// Saves the callee-saved registers on the current stack, stores its pointer in *save, and
// resumes the stack `load` saved the same way (or prepared by MakeFiber).
extern "C" void samplerd_emu_switch_stacks(void** save, void* load);
asm(R"(
  .text
  .globl samplerd_emu_switch_stacks
  .type samplerd_emu_switch_stacks, @function
samplerd_emu_switch_stacks:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size samplerd_emu_switch_stacks, . - samplerd_emu_switch_stacks
  .section .note.GNU-stack, "", @progbits
  .text
)");
struct Context {
  void* sp = nullptr;
};
#else
struct Context {
  ucontext_t uc;
};
#endif

struct Fiber {
  Context context;
  Dim3 idx;
  Wait wait = Wait::kNone;
  bool done = false;
  int barrier_result = 0;
  // The values this thread offered to its shuffles, by the shuffle's parity: a lane cannot
  // offer twice before every lane of its wave has read its last offer (the next shuffle's
  // barrier needs them all), so one barrier per shuffle suffices.
  uint64_t slot[2] = {0, 0};
  unsigned exchanges = 0;
};

struct Stack {
  void* base = nullptr;  // the guard page, then kStackBytes of stack
  Stack() = default;
  Stack(const Stack&) = delete;
  Stack(Stack&& other) noexcept : base(other.base) { other.base = nullptr; }
  ~Stack() {
    if (base != nullptr) munmap(base, kStackBytes + static_cast<size_t>(getpagesize()));
  }
};

// One block in progress on this thread.
struct BlockRun {
  const std::function<void()>* body = nullptr;
  std::vector<Fiber> fibers;
  int wave_size = 32;
  int live = 0;
  int block_waiting = 0;
  int block_or = 0;
  std::vector<int> wave_live, wave_waiting;
  int current = -1;
  Context scheduler;
};

thread_local Coordinates coordinates;
thread_local BlockRun* running = nullptr;
thread_local std::vector<Stack> stacks;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "samplerd emulated GPU: %s\n", what);
  std::abort();
}

void* StackTop(int i) {
  while (static_cast<int>(stacks.size()) <= i) {
    const size_t page = static_cast<size_t>(getpagesize());
    void* base = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (base == MAP_FAILED) Fail("cannot map a fiber stack");
    mprotect(base, page, PROT_NONE);
    Stack s;
    s.base = base;
    stacks.push_back(std::move(s));
  }
  return static_cast<char*>(stacks[i].base) + getpagesize();
}

// Switches from `from` (saving it) to `to`.
void Switch(Context* from, Context* to) {
#if defined(__x86_64__)
  samplerd_emu_switch_stacks(&from->sp, to->sp);
#else
  if (swapcontext(&from->uc, &to->uc) != 0) Fail("swapcontext failed");
#endif
}

// Leaves the running fiber (waiting at a barrier, or done) for the next runnable one in
// round-robin order, or for the scheduler when none is (the block is done, or stuck).
void SwitchAway(BlockRun& b) {
  Fiber& from = b.fibers[b.current];
  const int n = static_cast<int>(b.fibers.size());
  for (int i = 1; i <= n; ++i) {
    const int t = (b.current + i) % n;
    Fiber& f = b.fibers[t];
    if (f.done || f.wait != Wait::kNone) continue;
    b.current = t;
    coordinates.thread_idx = f.idx;
    Switch(&from.context, &f.context);
    return;
  }
  Switch(&from.context, &b.scheduler);
}

void ReleaseBlock(BlockRun& b, int result);
void ReleaseWave(BlockRun& b, int w);

// Where a fiber starts: the kernel body; then, as it no longer holds up its block's or its
// wave's barriers, it may release them; then it leaves for good.
[[noreturn]] void FiberMain() {
  BlockRun& b = *running;
  (*b.body)();
  const int t = b.current;
  b.fibers[t].done = true;
  --b.live;
  const int w = t / b.wave_size;
  --b.wave_live[w];
  if (b.block_waiting > 0 && b.block_waiting == b.live) ReleaseBlock(b, b.block_or);
  if (b.wave_waiting[w] > 0 && b.wave_waiting[w] == b.wave_live[w]) ReleaseWave(b, w);
  SwitchAway(b);
  Fail("a finished fiber was resumed");
}

// Leaves the running fiber until a barrier releases it.
void Yield(Wait wait) {
  BlockRun& b = *running;
  b.fibers[b.current].wait = wait;
  SwitchAway(b);
}

// Prepares thread t's fiber to start at FiberMain on its stack.
void MakeFiber(Fiber& f, int t, [[maybe_unused]] Context* scheduler) {
  char* top = static_cast<char*>(StackTop(t)) + kStackBytes;  // 16-byte aligned
#if defined(__x86_64__)
  // What samplerd_emu_switch_stacks pops: six registers, then the address it returns to, with
  // the stack then 8 bytes below a multiple of 16, as at any function's entry.
  void** sp = reinterpret_cast<void**>(top) - 8;
  for (int i = 0; i < 6; ++i) sp[i] = nullptr;
  sp[6] = reinterpret_cast<void*>(&FiberMain);
  sp[7] = nullptr;
  f.context.sp = sp;
#else
  if (getcontext(&f.context.uc) != 0) Fail("getcontext failed");
  f.context.uc.uc_stack.ss_sp = top - kStackBytes;
  f.context.uc.uc_stack.ss_size = kStackBytes;
  f.context.uc.uc_link = &scheduler->uc;
  makecontext(&f.context.uc, FiberMain, 0);
#endif
}

// Releases the block barrier: every thread waiting at it gets `result`.
void ReleaseBlock(BlockRun& b, int result) {
  for (Fiber& f : b.fibers) {
    if (f.wait == Wait::kBlock) {
      f.wait = Wait::kNone;
      f.barrier_result = result;
    }
  }
  b.block_waiting = 0;
  b.block_or = 0;
}

// Releases wave w's barrier.
void ReleaseWave(BlockRun& b, int w) {
  const int end = std::min(static_cast<int>(b.fibers.size()), (w + 1) * b.wave_size);
  for (int t = w * b.wave_size; t < end; ++t) {
    if (b.fibers[t].wait == Wait::kWave) b.fibers[t].wait = Wait::kNone;
  }
  b.wave_waiting[w] = 0;
}

// Runs the block from its thread 0; control comes back here once no fiber can run.
void RunBlock(BlockRun& b) {
  b.current = 0;
  coordinates.thread_idx = b.fibers[0].idx;
  Switch(&b.scheduler, &b.fibers[0].context);
  if (b.live > 0) {
    Fail(
        "a block's threads wait at barriers that can never complete (a __syncthreads or "
        "wave operation that not every live thread of its scope reaches)");
  }
}

// launch_hook.h's hook (test-only): run after each grid.
std::function<void()> after_launch;

}  // namespace

Coordinates& Current() { return coordinates; }

std::function<void()> SetAfterLaunchHook(std::function<void()> hook) {
  std::swap(after_launch, hook);
  return hook;
}

void RunGrid(Dim3 grid, Dim3 block, int wave_size, const std::function<void()>& body) {
  if (running != nullptr) Fail("a launch from inside a kernel");
  const int n = static_cast<int>(block.x * block.y * block.z);
  if (n <= 0 || n > 1024) Fail("a block of 1 to 1024 threads expected");
  BlockRun b;
  b.body = &body;
  b.wave_size = wave_size;
  b.fibers.resize(n);
  const int waves = (n + wave_size - 1) / wave_size;
  running = &b;
  coordinates.block_dim = block;
  coordinates.grid_dim = grid;
  for (unsigned bz = 0; bz < grid.z; ++bz) {
    for (unsigned by = 0; by < grid.y; ++by) {
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        coordinates.block_idx = Dim3{bx, by, bz};
        b.live = n;
        b.block_waiting = 0;
        b.block_or = 0;
        b.wave_live.assign(waves, 0);
        b.wave_waiting.assign(waves, 0);
        for (int t = 0; t < n; ++t) {
          Fiber& f = b.fibers[t];
          f = Fiber{};
          f.idx = Dim3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
          ++b.wave_live[t / wave_size];
          MakeFiber(f, t, &b.scheduler);
        }
        RunBlock(b);
      }
    }
  }
  running = nullptr;
  if (after_launch) after_launch();
}

int BlockBarrier(int predicate) {
  BlockRun& b = *running;
  b.block_or |= predicate;
  if (++b.block_waiting == b.live) {  // the last to arrive goes on at once
    const int result = b.block_or;
    ReleaseBlock(b, result);
    return result;
  }
  Yield(Wait::kBlock);
  return b.fibers[b.current].barrier_result;
}

void WaveBarrier() {
  BlockRun& b = *running;
  const int w = b.current / b.wave_size;
  if (++b.wave_waiting[w] == b.wave_live[w]) {
    ReleaseWave(b, w);
    return;
  }
  Yield(Wait::kWave);
}

uint64_t WaveExchange(uint64_t value, int source) {
  BlockRun& b = *running;
  const int self = b.current;
  const unsigned parity = b.fibers[self].exchanges++ & 1u;
  b.fibers[self].slot[parity] = value;
  WaveBarrier();
  const int from = source < 0 ? self : self - self % b.wave_size + source;
  return from < static_cast<int>(b.fibers.size()) ? b.fibers[from].slot[parity] : value;
}

int Lane() { return running->current % running->wave_size; }

}  // namespace samplerd::kernels::gpu::emu
