// The apply passes: projection + snapshot (g <- g - coeff * p, then p <- the
// old or the new g), and snapshot only (p <- g). Element by element, with
// the CPU kernels' semantics: fp32 arithmetic on the loaded values, stores
// rounded to nearest even, the snapshot of the projected gradient taken from
// the value as stored in the gradient's type. Entry points by name, as in
// stats_kernels.cu.
#include "agent/src/cuda/device_util.cuh"
#ifndef __CUDACC_RTC__
#include "agent/src/cuda/kernels.h"
#endif

namespace gac::agent::cuda::kernels {
namespace {

template <typename G, typename P, bool kSnapshotProjected>
struct ProjectVisitor {
  G* __restrict__ g;
  P* __restrict__ p;
  float coeff;

  // One fused multiply-add: within one fp32 rounding of the CPU kernels.
  __device__ __forceinline__ void Element(float x, float y, float& new_g, float& new_p) const {
    new_g = fmaf(-coeff, y, x);
    new_p = kSnapshotProjected ? device::RoundTrip<G>(new_g) : x;
  }
  __device__ __forceinline__ void Vector(int i) const {
    float x[kVecElements], y[kVecElements], new_g[kVecElements], new_p[kVecElements];
    device::Load8(g + i, x);
    device::Load8(p + i, y);
    GAC_UNROLL
    for (int j = 0; j < kVecElements; ++j) Element(x[j], y[j], new_g[j], new_p[j]);
    device::Store8(g + i, new_g);
    device::Store8(p + i, new_p);
  }
  __device__ __forceinline__ void Scalar(int i, int) const {
    float new_g, new_p;
    Element(device::ToFloat(g[i]), device::ToFloat(p[i]), new_g, new_p);
    g[i] = device::FromFloat<G>(new_g);
    p[i] = device::FromFloat<P>(new_p);
  }
};

template <typename G, typename P>
struct SnapshotVisitor {
  const G* __restrict__ g;
  P* __restrict__ p;

  __device__ __forceinline__ void Vector(int i) const {
    if constexpr (std::is_same_v<G, P>) {
      device::Copy8(g + i, p + i);
    } else {
      float x[kVecElements];
      device::Load8(g + i, x);
      device::Store8(p + i, x);
    }
  }
  __device__ __forceinline__ void Scalar(int i, int) const {
    if constexpr (std::is_same_v<G, P>) {
      p[i] = g[i];
    } else {
      p[i] = device::FromFloat<P>(device::ToFloat(g[i]));
    }
  }
};

template <typename P, typename Table>
__device__ __forceinline__ void Project(const Table& table, const PassArgs& args) {
  const ChunkDesc c = table.chunks[blockIdx.x];
  const TensorDesc t = table.tensors[c.tensor];
  const std::int64_t offset = ChunkOffset(c);
  const int len = ChunkLength(t, c);
  P* p = static_cast<P*>(t.p) + offset;
  const int tid = static_cast<int>(threadIdx.x);
  device::WithGradType(t.gt, t.g, [&](auto* g_base) {
    using G = std::remove_pointer_t<decltype(g_base)>;
    G* g = g_base + offset;
    const int head = device::Head(g, p, len);
    if (args.flag != 0) {
      ProjectVisitor<G, P, true> v{g, p, args.coeff};
      VisitChunk(tid, kBlockThreads, len, head, v);
    } else {
      ProjectVisitor<G, P, false> v{g, p, args.coeff};
      VisitChunk(tid, kBlockThreads, len, head, v);
    }
  });
}

template <typename P, typename Table>
__device__ __forceinline__ void Snapshot(const Table& table, const PassArgs& args) {
  const ChunkDesc c = table.chunks[blockIdx.x];
  const TensorDesc t = table.tensors[c.tensor];
  const std::int64_t offset = ChunkOffset(c);
  const int len = ChunkLength(t, c);
  P* p = static_cast<P*>(t.p) + offset;
  device::WithGradType(t.gt, t.g, [&](auto* g_base) {
    using G = std::remove_pointer_t<decltype(g_base)>;
    const G* g = g_base + offset;
    SnapshotVisitor<G, P> v{g, p};
    VisitChunk(static_cast<int>(threadIdx.x), kBlockThreads, len, device::Head(g, p, len), v);
  });
}

}  // namespace

#define GAC_APPLY_KERNEL(name, pass, P, Table)                                                           \
  extern "C" __global__ void __launch_bounds__(kBlockThreads)                                            \
      name(const __grid_constant__ Table table, const __grid_constant__ PassArgs args) {                 \
    pass<P>(table, args);                                                                                \
  }
GAC_APPLY_KERNEL(gac_project_f32_inline, Project, float, InlineTable)
GAC_APPLY_KERNEL(gac_project_f32_device, Project, float, DeviceTable)
GAC_APPLY_KERNEL(gac_project_bf16_inline, Project, device::Bf16, InlineTable)
GAC_APPLY_KERNEL(gac_project_bf16_device, Project, device::Bf16, DeviceTable)
GAC_APPLY_KERNEL(gac_snapshot_f32_inline, Snapshot, float, InlineTable)
GAC_APPLY_KERNEL(gac_snapshot_f32_device, Snapshot, float, DeviceTable)
GAC_APPLY_KERNEL(gac_snapshot_bf16_inline, Snapshot, device::Bf16, InlineTable)
GAC_APPLY_KERNEL(gac_snapshot_bf16_device, Snapshot, device::Bf16, DeviceTable)
#undef GAC_APPLY_KERNEL

// One element per thread and step of a grid-stride loop: the strided path is
// for the rare gradient that is not dense in its snapshot's layout.
extern "C" __global__ void __launch_bounds__(kBlockThreads)
    gac_strided_copy(const __grid_constant__ StridedCopyArgs args) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * kBlockThreads;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x; i < args.n; i += step) {
    std::int64_t rest = i;
    std::int64_t src = 0;
    std::int64_t dst = 0;
    for (int d = args.ndim - 1; d >= 0; --d) {
      const std::int64_t index = rest % args.sizes[d];
      rest /= args.sizes[d];
      src += index * args.src_strides[d];
      dst += index * args.dst_strides[d];
    }
    if (args.elem_bytes == 4) {
      static_cast<std::uint32_t*>(args.dst)[dst] = static_cast<const std::uint32_t*>(args.src)[src];
    } else {
      static_cast<std::uint16_t*>(args.dst)[dst] = static_cast<const std::uint16_t*>(args.src)[src];
    }
  }
}

#ifndef __CUDACC_RTC__

cudaError_t LaunchProjectSnapshot(ElemType pt, const InlineTable* table, const DeviceTable& device_table,
                                  const PassArgs& args, int num_chunks, cudaStream_t stream) {
  const bool bf16 = pt == ElemType::kBF16;
  if (table != nullptr && bf16) {
    gac_project_bf16_inline<<<num_chunks, kBlockThreads, 0, stream>>>(*table, args);
  } else if (table != nullptr) {
    gac_project_f32_inline<<<num_chunks, kBlockThreads, 0, stream>>>(*table, args);
  } else if (bf16) {
    gac_project_bf16_device<<<num_chunks, kBlockThreads, 0, stream>>>(device_table, args);
  } else {
    gac_project_f32_device<<<num_chunks, kBlockThreads, 0, stream>>>(device_table, args);
  }
  return cudaGetLastError();
}

cudaError_t LaunchSnapshot(ElemType pt, const InlineTable* table, const DeviceTable& device_table, const PassArgs& args,
                           int num_chunks, cudaStream_t stream) {
  const bool bf16 = pt == ElemType::kBF16;
  if (table != nullptr && bf16) {
    gac_snapshot_bf16_inline<<<num_chunks, kBlockThreads, 0, stream>>>(*table, args);
  } else if (table != nullptr) {
    gac_snapshot_f32_inline<<<num_chunks, kBlockThreads, 0, stream>>>(*table, args);
  } else if (bf16) {
    gac_snapshot_bf16_device<<<num_chunks, kBlockThreads, 0, stream>>>(device_table, args);
  } else {
    gac_snapshot_f32_device<<<num_chunks, kBlockThreads, 0, stream>>>(device_table, args);
  }
  return cudaGetLastError();
}

cudaError_t LaunchStridedCopy(const StridedCopyArgs& args, cudaStream_t stream) {
  gac_strided_copy<<<StridedCopyBlocks(args.n), kBlockThreads, 0, stream>>>(args);
  return cudaGetLastError();
}
#endif  // __CUDACC_RTC__

}  // namespace gac::agent::cuda::kernels
