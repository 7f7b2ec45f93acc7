// Kernels as the emulator knows them: a name, the function, its launch
// bound, and how to copy its parameters out of cudaLaunchKernel's `args`
// (at the launch, as the CUDA runtime copies them). gac's kernels are
// registered by the emulator itself (src/gac_kernels.cc); a test registers
// kernels of its own with RegisterKernel and launches them through the
// handle it returns, or by name (cudaLibraryGetKernel).
#ifndef GAC_CUDA_EMU_KERNEL_H_
#define GAC_CUDA_EMU_KERNEL_H_

#include <cstddef>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_runtime_api.h"

namespace gac_cuda_emu {

// A launch's copy of a kernel's parameters. Run() calls the kernel with them
// on the calling emulated thread.
class BoundKernel {
 public:
  virtual ~BoundKernel() = default;
  virtual void Run() const = 0;
};

struct KernelInfo {
  const char* name;         // static storage (a literal)
  int max_threads;          // the kernel's __launch_bounds__, else 1024
  std::size_t param_bytes;  // the parameters laid out with the ABI's padding
  void (*function)();       // type-erased
  // Copies the parameters that args[i] point to.
  std::shared_ptr<const BoundKernel> (*bind)(void (*function)(), void** args);
};

namespace internal {

template <typename... P>
class Bound final : public BoundKernel {
 public:
  Bound(void (*function)(P...), void** args) : function_(function) { Copy(args, std::index_sequence_for<P...>{}); }
  void Run() const override { std::apply(function_, params_); }

 private:
  template <std::size_t... I>
  void Copy(void** args, std::index_sequence<I...>) {
    (std::memcpy(&std::get<I>(params_), args[I], sizeof(P)), ...);
  }

  void (*const function_)(P...);
  std::tuple<P...> params_;
};

template <typename... P>
std::shared_ptr<const BoundKernel> Bind(void (*function)(), void** args) {
  return std::make_shared<const Bound<P...>>(reinterpret_cast<void (*)(P...)>(function), args);
}

template <typename... P>
constexpr std::size_t ParamBytes() {
  std::size_t bytes = 0;
  ((bytes = (bytes + alignof(P) - 1) / alignof(P) * alignof(P) + sizeof(P)), ...);
  return bytes;
}

}  // namespace internal

template <typename... P>
KernelInfo DescribeKernel(const char* name, void (*function)(P...), int max_threads) {
  static_assert((std::is_trivially_copyable_v<P> && ...), "kernel parameters are copied byte for byte");
  return KernelInfo{name, max_threads, internal::ParamBytes<P...>(), reinterpret_cast<void (*)()>(function),
                    &internal::Bind<P...>};
}

// Registers a kernel under its name; registering it again returns the same
// handle, another function under a taken name is fatal. The handle stays
// valid for the process, across Reset().
cudaKernel_t RegisterKernel(const KernelInfo& info);

template <typename... P>
cudaKernel_t RegisterKernel(const char* name, void (*function)(P...), int max_threads = 1024) {
  return RegisterKernel(DescribeKernel(name, function, max_threads));
}

}  // namespace gac_cuda_emu

#endif  // GAC_CUDA_EMU_KERNEL_H_
