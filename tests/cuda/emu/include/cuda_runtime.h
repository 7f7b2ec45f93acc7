// The emulator's cuda_runtime.h: the runtime API (cuda_runtime_api.h) and
// the typed overloads that CUDA's C++ header adds to it.
#ifndef GAC_CUDA_EMU_CUDA_RUNTIME_H_
#define GAC_CUDA_EMU_CUDA_RUNTIME_H_

#include "cuda_runtime_api.h"

template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t size) {
  return ::cudaMalloc(reinterpret_cast<void**>(ptr), size);
}

template <typename T>
cudaError_t cudaMallocHost(T** ptr, size_t size) {
  return ::cudaMallocHost(reinterpret_cast<void**>(ptr), size);
}

#endif  // GAC_CUDA_EMU_CUDA_RUNTIME_H_
