// The emulated threads. Every thread of a block is a fiber of the host
// thread that runs the launch; a scheduler on the host stack resumes the
// block's threads in turn, each running until it waits at a barrier
// (__syncthreads, __shfl_xor_sync) or exits, then completes the barriers
// that every participant has reached, and repeats; if none can complete,
// the block has diverged and fails. Deterministic: the same order at every
// run. The fibers (their stacks mapped once, with a guard page) live as
// long as their host thread and serve every launch it runs; a block that
// fails is unwound by throwing from the barrier each thread waits at.
//
// On x86-64 a fiber switch is a dozen instructions (below); elsewhere it is
// swapcontext, a system call slower. The switches are announced to
// AddressSanitizer (the fiber's stack bounds, its fake stack) and
// ThreadSanitizer (a fiber context per emulated thread, switched with
// synchronization: the threads of a block run in a total order).
#include "src/executor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define GAC_EMU_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define GAC_EMU_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GAC_EMU_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define GAC_EMU_TSAN 1
#endif
#endif
#ifdef GAC_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef GAC_EMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif
#ifndef __x86_64__
#include <ucontext.h>
#endif

#include "gac_cuda_emu/device.h"

#ifdef __x86_64__
// Saves the callee-saved registers, MXCSR and the x87 control word on the
// current stack, stores the stack pointer in *save, and restores the same
// from `load`: the System V ABI's whole callee-saved state.
extern "C" void gac_cuda_emu_switch(void** save, void* load);
asm(R"(
  .pushsection .text
  .p2align 4
  .globl gac_cuda_emu_switch
  .hidden gac_cuda_emu_switch
  .type gac_cuda_emu_switch, @function
gac_cuda_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size gac_cuda_emu_switch, .-gac_cuda_emu_switch
  .popsection
)");
#endif  // __x86_64__

namespace gac_cuda_emu::internal {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned int kFullMask = 0xFFFFFFFFu;
// gac's kernels use about 13 KiB of it at most (measured under
// AddressSanitizer, a 4 KiB parameter copy included); only the touched pages
// cost memory.
constexpr std::size_t kStackBytes = std::size_t{256} << 10;

[[noreturn]] void Fatal(const char* what) {
  std::fprintf(stderr, "gac_cuda_emu: %s\n", what);
  std::abort();
}

// ---- Machine contexts: the saved stack pointer of a suspended fiber.

#ifdef __x86_64__
struct Context {
  void* sp = nullptr;
};

// A frame that gac_cuda_emu_switch "returns" from into entry(), with the
// default floating-point control state and a null frame pointer (the end of
// the frame chain).
void InitContext(Context* c, char* stack, std::size_t bytes, void (*entry)()) {
  const std::uintptr_t top = (reinterpret_cast<std::uintptr_t>(stack) + bytes) & ~std::uintptr_t{15};
  // 9 words: entry() starts with the stack aligned as after a call.
  auto* frame = reinterpret_cast<std::uint64_t*>(top - 9 * sizeof(std::uint64_t));
  frame[0] = 0x1F80u | (std::uint64_t{0x037F} << 32);  // MXCSR, x87 control word
  for (int i = 1; i <= 6; ++i) frame[i] = 0;           // r15, r14, r13, r12, rbx, rbp
  frame[7] = reinterpret_cast<std::uintptr_t>(entry);
  frame[8] = 0;  // entry() never returns
  c->sp = frame;
}

void SwitchContext(Context* from, Context* to) { gac_cuda_emu_switch(&from->sp, to->sp); }
#else
struct Context {
  ucontext_t uc;
};

void InitContext(Context* c, char* stack, std::size_t bytes, void (*entry)()) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = bytes;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, entry, 0);
}

void SwitchContext(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
#endif

// ---- Emulated threads.

enum class Wait : std::uint8_t { kNone, kBarrier, kShuffle, kExited };

struct EmuThread {
  uint3 idx{};
  Wait wait = Wait::kNone;
  // At a shuffle: what it asked for and offers; then what it receives. The
  // scheduler computes every lane's result before any lane resumes, so a
  // lane that runs ahead to the next shuffle overwrites nothing still read.
  unsigned int mask = 0;
  int lane_mask = 0;
  int width = 0;
  int bytes = 0;
  std::uint64_t offered = 0;
  std::uint64_t received = 0;
};

// Thrown from the barrier a thread waits at when its block has failed:
// unwinds the kernel's frames off the fiber's stack.
struct Abort {};

class Fiber {
 public:
  explicit Fiber(void (*entry)()) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    mapping_bytes_ = kStackBytes + page;
    void* m = mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) Fatal("cannot map a fiber stack");
    mapping_ = static_cast<char*>(m);
    mprotect(mapping_, page, PROT_NONE);  // an overflow faults
    stack = mapping_ + page;
    InitContext(&context, stack, kStackBytes, entry);
#ifdef GAC_EMU_TSAN
    tsan = __tsan_create_fiber(0);
    __tsan_set_fiber_name(tsan, "gac_cuda_emu GPU thread");
#endif
  }
  ~Fiber() {
#ifdef GAC_EMU_TSAN
    __tsan_destroy_fiber(tsan);
#endif
    munmap(mapping_, mapping_bytes_);
  }
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  Context context;
  char* stack = nullptr;
  bool started = false;
  void* tsan = nullptr;
  void* fake_stack = nullptr;  // AddressSanitizer's, while suspended

 private:
  char* mapping_ = nullptr;
  std::size_t mapping_bytes_ = 0;
};

// The fibers of one host thread and the block they run.
class Runner {
 public:
  // The calling host thread's runner.
  static Runner& ForThisThread() {
    thread_local Runner runner;
    return runner;
  }
  // The runner whose emulated thread is running (device functions).
  static Runner& Active() {
    if (active_ == nullptr || !active_->in_fiber_) Fatal("a device function was called outside a kernel");
    return *active_;
  }

  Runner() {
#ifdef GAC_EMU_TSAN
    host_tsan_ = __tsan_get_current_fiber();
#endif
  }
  // Lets every fiber leave its loop and end (ASan frees its fake stack).
  ~Runner() {
    quitting_ = true;
    active_ = this;
    for (std::size_t i = 0; i < fibers_.size(); ++i) {
      if (fibers_[i]->started) Resume(i);
    }
    active_ = nullptr;
  }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  std::string Run(const KernelInfo& kernel, const BoundKernel& params, dim3 grid, dim3 block,
                  const BlockFilter& run_block, std::uint64_t* blocks_run);

  EmuThread& current() { return threads_[current_]; }
  uint3 block_idx() const { return block_idx_; }
  dim3 block_dim() const { return block_dim_; }
  dim3 grid_dim() const { return grid_dim_; }

  // In an emulated thread: waits at a barrier until the scheduler completes
  // it; throws Abort if the block fails instead.
  void Suspend(Wait why) {
    const std::size_t index = current_;
    threads_[index].wait = why;
    Leave(index, false);
    if (aborting_) throw Abort{};
  }

 private:
  enum class Step { kProgress, kDone, kStuck };

  [[noreturn]] static void FiberMain();
  void FiberLoop(std::size_t index);
  void Resume(std::size_t index);
  void Leave(std::size_t index, bool ending);
  std::string RunBlock();
  Step Release(std::string* why);
  bool ReleaseShuffle(std::size_t first, std::string* why);

  static thread_local Runner* active_;

  std::vector<std::unique_ptr<Fiber>> fibers_;  // fiber i runs thread i of a block
  std::vector<EmuThread> threads_;
  std::size_t current_ = 0;
  bool in_fiber_ = false;
  bool aborting_ = false;
  bool quitting_ = false;
  bool threw_ = false;
  const BoundKernel* params_ = nullptr;
  uint3 block_idx_{};
  dim3 block_dim_, grid_dim_;
  Context host_;
#ifdef GAC_EMU_TSAN
  void* host_tsan_ = nullptr;
#endif
#ifdef GAC_EMU_ASAN
  const void* host_stack_bottom_ = nullptr;
  std::size_t host_stack_size_ = 0;
#endif
};

thread_local Runner* Runner::active_ = nullptr;

void Runner::FiberMain() {
  Runner* runner = active_;
  const std::size_t index = runner->current_;
#ifdef GAC_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &runner->host_stack_bottom_, &runner->host_stack_size_);
#endif
  runner->FiberLoop(index);
  runner->Leave(index, true);
  Fatal("an ended fiber was resumed");
}

// One emulated thread after another, one per block.
void Runner::FiberLoop(std::size_t index) {
  while (!quitting_) {
    try {
      params_->Run();
    } catch (const Abort&) {
      // The block failed; its threads end here.
    } catch (...) {
      threw_ = true;
    }
    threads_[index].wait = Wait::kExited;
    Leave(index, false);
  }
}

void Runner::Resume(std::size_t index) {
  Fiber& f = *fibers_[index];
  current_ = index;
  f.started = true;
  in_fiber_ = true;
#ifdef GAC_EMU_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, f.stack, kStackBytes);
#endif
#ifdef GAC_EMU_TSAN
  __tsan_switch_to_fiber(f.tsan, 0);
#endif
  SwitchContext(&host_, &f.context);
#ifdef GAC_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
  in_fiber_ = false;
}

void Runner::Leave(std::size_t index, bool ending) {
  Fiber& f = *fibers_[index];
#ifdef GAC_EMU_ASAN
  __sanitizer_start_switch_fiber(ending ? nullptr : &f.fake_stack, host_stack_bottom_, host_stack_size_);
#endif
#ifdef GAC_EMU_TSAN
  __tsan_switch_to_fiber(host_tsan_, 0);
#endif
  SwitchContext(&f.context, &host_);
#ifdef GAC_EMU_ASAN
  __sanitizer_finish_switch_fiber(f.fake_stack, &host_stack_bottom_, &host_stack_size_);
#endif
  (void)ending;
}

std::string Runner::Run(const KernelInfo& kernel, const BoundKernel& params, dim3 grid, dim3 block,
                        const BlockFilter& run_block, std::uint64_t* blocks_run) {
  const std::size_t n = std::size_t{block.x} * block.y * block.z;
  while (fibers_.size() < n) fibers_.push_back(std::make_unique<Fiber>(&Runner::FiberMain));
  threads_.assign(n, EmuThread{});
  params_ = &params;
  block_dim_ = block;
  grid_dim_ = grid;
  threw_ = false;
  active_ = this;
  std::string failure;
  for (unsigned int z = 0; z < grid.z && failure.empty(); ++z) {
    for (unsigned int y = 0; y < grid.y && failure.empty(); ++y) {
      for (unsigned int x = 0; x < grid.x && failure.empty(); ++x) {
        if (run_block && !run_block(kernel.name, x)) continue;
        block_idx_ = uint3{x, y, z};
        ++*blocks_run;
        failure = RunBlock();
        if (failure.empty() && threw_) failure = "a thread threw an exception";
        if (!failure.empty()) {
          failure = std::string("kernel ") + kernel.name + ", block (" + std::to_string(x) + "," +
                    std::to_string(y) + "," + std::to_string(z) + "): " + failure;
        }
      }
    }
  }
  active_ = nullptr;
  return failure;
}

std::string Runner::RunBlock() {
  const std::size_t n = threads_.size();
  for (std::size_t t = 0; t < n; ++t) {
    const auto i = static_cast<unsigned int>(t);
    threads_[t] = EmuThread{};
    threads_[t].idx = uint3{i % block_dim_.x, i / block_dim_.x % block_dim_.y, i / (block_dim_.x * block_dim_.y)};
  }
  for (;;) {
    for (std::size_t t = 0; t < n; ++t) {
      if (threads_[t].wait == Wait::kNone) Resume(t);
    }
    std::string why;
    switch (Release(&why)) {
      case Step::kProgress: continue;
      case Step::kDone: return "";
      case Step::kStuck: break;
    }
    // Unwind the threads still waiting.
    aborting_ = true;
    for (std::size_t t = 0; t < n; ++t) {
      if (threads_[t].wait != Wait::kExited) Resume(t);
    }
    aborting_ = false;
    return why;
  }
}

// Completes what can complete once every runnable thread waits: the
// shuffles whose warp is all there, else the block barrier if every thread
// is at it.
Runner::Step Runner::Release(std::string* why) {
  const std::size_t n = threads_.size();
  std::size_t exited = 0, at_barrier = 0, at_shuffle = 0;
  for (const EmuThread& t : threads_) {
    exited += t.wait == Wait::kExited;
    at_barrier += t.wait == Wait::kBarrier;
    at_shuffle += t.wait == Wait::kShuffle;
  }
  if (exited == n) return Step::kDone;
  bool progress = false;
  for (std::size_t first = 0; first < n; first += kWarpSize) {
    if (n - first < kWarpSize) break;
    bool all = true;
    for (std::size_t l = first; l < first + kWarpSize; ++l) all = all && threads_[l].wait == Wait::kShuffle;
    if (!all) continue;
    if (!ReleaseShuffle(first, why)) return Step::kStuck;
    progress = true;
  }
  if (progress) return Step::kProgress;
  if (at_barrier == n) {
    for (EmuThread& t : threads_) t.wait = Wait::kNone;
    return Step::kProgress;
  }
  *why = "barrier divergence: " + std::to_string(at_barrier) + " of " + std::to_string(n) +
         " threads wait at __syncthreads(), " + std::to_string(at_shuffle) + " at __shfl_xor_sync(), " +
         std::to_string(exited) + " have exited";
  if (n % kWarpSize != 0 && at_shuffle > 0) *why += " (a warp of fewer than 32 threads cannot shuffle)";
  return Step::kStuck;
}

bool Runner::ReleaseShuffle(std::size_t first, std::string* why) {
  const EmuThread& lane0 = threads_[first];
  for (std::size_t l = first; l < first + kWarpSize; ++l) {
    const EmuThread& t = threads_[l];
    if (t.mask != kFullMask || t.lane_mask != lane0.lane_mask || t.width != lane0.width || t.bytes != lane0.bytes ||
        t.width <= 0 || t.width > kWarpSize || (t.width & (t.width - 1)) != 0) {
      *why = "warp " + std::to_string(first / kWarpSize) +
             ": its lanes' __shfl_xor_sync() calls differ in lane mask, width or type, or use a partial mask or "
             "an invalid width (the emulator takes mask 0xFFFFFFFF only)";
      return false;
    }
  }
  for (std::size_t l = first; l < first + kWarpSize; ++l) {
    EmuThread& t = threads_[l];
    // As CUDA defines it: a source lane in a later group of `width` lanes
    // gives the lane its own value.
    const auto lane = static_cast<unsigned int>(l - first);
    const auto width = static_cast<unsigned int>(t.width);
    const unsigned int source = lane ^ static_cast<unsigned int>(t.lane_mask);
    t.received = source < (lane / width + 1) * width ? threads_[first + source].offered : t.offered;
    t.wait = Wait::kNone;
  }
  return true;
}

}  // namespace

std::string RunKernel(const KernelInfo& kernel, const BoundKernel& params, dim3 grid, dim3 block,
                      const BlockFilter& run_block, std::uint64_t* blocks_run) {
  return Runner::ForThisThread().Run(kernel, params, grid, block, run_block, blocks_run);
}

}  // namespace gac_cuda_emu::internal

namespace gac_cuda_emu::device {

using internal::Runner;
using internal::Wait;

uint3 ThreadIdx() { return Runner::Active().current().idx; }
uint3 BlockIdx() { return Runner::Active().block_idx(); }
dim3 BlockDim() { return Runner::Active().block_dim(); }
dim3 GridDim() { return Runner::Active().grid_dim(); }

void SyncThreads() { Runner::Active().Suspend(Wait::kBarrier); }

std::uint64_t ShuffleXor(unsigned int mask, std::uint64_t value, int bytes, int lane_mask, int width) {
  Runner& runner = Runner::Active();
  internal::EmuThread& t = runner.current();
  t.mask = mask;
  t.lane_mask = lane_mask;
  t.width = width;
  t.bytes = bytes;
  t.offered = value;
  runner.Suspend(Wait::kShuffle);
  return runner.current().received;
}

}  // namespace gac_cuda_emu::device
