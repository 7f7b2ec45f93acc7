// CUDA's built-in vector types as far as gac uses them (dim3 for launches,
// float4 / uint4 for the kernels' 16-byte loads and stores), for the host
// compiler. Included by cuda_runtime_api.h and gac_cuda_emu/device.h.
#ifndef GAC_CUDA_EMU_VECTOR_TYPES_H_
#define GAC_CUDA_EMU_VECTOR_TYPES_H_

struct uint3 {
  unsigned int x, y, z;
};

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};

// 16-byte aligned, as on the GPU: under UndefinedBehaviorSanitizer a load or
// store through a misaligned float4* / uint4* is reported, as the GPU
// reports a misaligned address. may_alias: the kernels read and write float
// and 16-bit data through these types, which the host optimizer must not
// treat as unrelated objects.
struct __attribute__((aligned(16), may_alias)) float4 {
  float x, y, z, w;
};
struct __attribute__((aligned(16), may_alias)) uint4 {
  unsigned int x, y, z, w;
};

inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return uint4{x, y, z, w}; }

#endif  // GAC_CUDA_EMU_VECTOR_TYPES_H_
