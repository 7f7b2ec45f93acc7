// The launchers of kernels.h for the NVRTC build (GAC_CUDA_NVRTC_ROOT, the
// wheel): the kernels come as a fatbin compiled by NVRTC (build_fatbin.py,
// linked in as kKernelFatbin), loaded on first use with the runtime's
// library API (cudaLibraryLoadData: context-independent, CUDA 12.0 and
// later drivers) and launched with cudaLaunchKernel on their cudaKernel_t
// handles, by the extern "C" names of stats_kernels.cu and apply_kernels.cu.
// The driver picks the fatbin's image for each device: the cubin of its
// architecture, else the PTX, compiled once by the driver.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "agent/src/cuda/kernels.h"

namespace gac::agent::cuda {

extern const unsigned char kKernelFatbin[];
extern const std::size_t kKernelFatbinSize;

namespace kernels {
namespace {

// Each table pass has four kernels: f32 then bf16 snapshot, each with the
// inline then the device table.
enum Kernel {
  kStats,
  kProject = kStats + 4,
  kSnapshot = kProject + 4,
  kFinalize = kSnapshot + 4,
  kStridedCopy,
  kNumKernels,
};
constexpr const char* kNames[kNumKernels] = {
    "gac_stats_f32_inline",    "gac_stats_f32_device",    "gac_stats_bf16_inline",    "gac_stats_bf16_device",
    "gac_project_f32_inline",  "gac_project_f32_device",  "gac_project_bf16_inline",  "gac_project_bf16_device",
    "gac_snapshot_f32_inline", "gac_snapshot_f32_device", "gac_snapshot_bf16_inline", "gac_snapshot_bf16_device",
    "gac_finalize",            "gac_strided_copy"};

struct Library {
  cudaError_t error = cudaSuccess;
  cudaKernel_t kernels[kNumKernels] = {};
};

// Loaded once per process and never unloaded (the runtime may be gone
// before static destructors run). A failure is kept and returned by every
// launch.
const Library& GetLibrary() {
  static const Library library = [] {
    Library l;
    cudaLibrary_t handle = nullptr;
    l.error = cudaLibraryLoadData(&handle, kKernelFatbin, nullptr, nullptr, 0, nullptr, nullptr, 0);
    for (int k = 0; k < kNumKernels && l.error == cudaSuccess; ++k) {
      l.error = cudaLibraryGetKernel(&l.kernels[k], handle, kNames[k]);
    }
    return l;
  }();
  return library;
}

cudaError_t Launch(int kernel, int blocks, int threads, void** params, cudaStream_t stream) {
  const Library& library = GetLibrary();
  if (library.error != cudaSuccess) return library.error;
  const cudaError_t e = cudaLaunchKernel(reinterpret_cast<const void*>(library.kernels[kernel]), dim3(blocks),
                                         dim3(threads), params, 0, stream);
  (void)cudaGetLastError();  // cleared, as nvcc's launchers leave it
  return e;
}

cudaError_t LaunchTablePass(int first, ElemType pt, const InlineTable* table, const DeviceTable& device_table,
                            const PassArgs& args, int num_chunks, cudaStream_t stream) {
  const int kernel = first + (pt == ElemType::kBF16 ? 2 : 0) + (table != nullptr ? 0 : 1);
  void* table_param = table != nullptr ? static_cast<void*>(const_cast<InlineTable*>(table))
                                        : static_cast<void*>(const_cast<DeviceTable*>(&device_table));
  void* params[] = {table_param, const_cast<PassArgs*>(&args)};
  return Launch(kernel, num_chunks, kBlockThreads, params, stream);
}

}  // namespace

cudaError_t LaunchStats(ElemType pt, const InlineTable* table, const DeviceTable& device_table, const PassArgs& args,
                        int num_chunks, cudaStream_t stream) {
  return LaunchTablePass(kStats, pt, table, device_table, args, num_chunks, stream);
}

cudaError_t LaunchFinalize(const ChunkPartial* partials, int num_chunks, int num_segments, double* out,
                           cudaStream_t stream) {
  void* params[] = {&partials, &num_chunks, &num_segments, &out};
  return Launch(kFinalize, 1 + num_segments, kFinalizeThreads, params, stream);
}

cudaError_t LaunchProjectSnapshot(ElemType pt, const InlineTable* table, const DeviceTable& device_table,
                                  const PassArgs& args, int num_chunks, cudaStream_t stream) {
  return LaunchTablePass(kProject, pt, table, device_table, args, num_chunks, stream);
}

cudaError_t LaunchSnapshot(ElemType pt, const InlineTable* table, const DeviceTable& device_table, const PassArgs& args,
                           int num_chunks, cudaStream_t stream) {
  return LaunchTablePass(kSnapshot, pt, table, device_table, args, num_chunks, stream);
}

cudaError_t LaunchStridedCopy(const StridedCopyArgs& args, cudaStream_t stream) {
  void* params[] = {const_cast<StridedCopyArgs*>(&args)};
  return Launch(kStridedCopy, StridedCopyBlocks(args.n), kBlockThreads, params, stream);
}

}  // namespace kernels
}  // namespace gac::agent::cuda
