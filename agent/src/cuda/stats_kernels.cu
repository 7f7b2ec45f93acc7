// The statistics pass: per-chunk fp32 partials (dot, |g|^2, |p|^2), then a
// small kernel that sums them in fp64, per segment too, and counts the
// chunks whose partials are not finite.
//
// The kernels are extern "C" entry points, found by name: nvcc's build
// launches them below; the NVRTC build of the wheel compiles this file as
// device code only (__CUDACC_RTC__) and kernel_library.cc launches them.
//
// Numerics: a thread accumulates its elements of a chunk in 4 fp32 lanes per
// sum (element j of a vector step goes to lane j % 4: at most 16 terms per
// lane and chunk), the lanes are added pairwise, then the block's threads in
// a fixed tree; chunks are summed in fp64. Same order at every run: the
// result depends only on the data and the chunk layout.
#include "agent/src/cuda/device_util.cuh"
#ifndef __CUDACC_RTC__
#include "agent/src/cuda/kernels.h"
#endif

namespace gac::agent::cuda::kernels {
namespace {

using device::BlockSum;

constexpr int kLanes = 4;

template <typename G, typename P, bool kWithP>
struct StatsVisitor {
  const G* __restrict__ g;
  const P* __restrict__ p;
  float dot[kLanes];
  float gg[kLanes];
  float pp[kLanes];

  __device__ __forceinline__ void Add(float x, float y, int lane) {
    gg[lane] = fmaf(x, x, gg[lane]);
    if constexpr (kWithP) {
      dot[lane] = fmaf(x, y, dot[lane]);
      pp[lane] = fmaf(y, y, pp[lane]);
    }
  }
  __device__ __forceinline__ void Vector(int i) {
    float x[kVecElements];
    float y[kVecElements] = {};
    device::Load8(g + i, x);
    if constexpr (kWithP) device::Load8(p + i, y);
    GAC_UNROLL
    for (int j = 0; j < kVecElements; ++j) Add(x[j], y[j], j % kLanes);
  }
  __device__ __forceinline__ void Scalar(int i, int lane) {
    Add(device::ToFloat(g[i]), kWithP ? device::ToFloat(p[i]) : 0.0f, lane % kLanes);
  }
};

// (lane 0 + lane 2) + (lane 1 + lane 3).
__device__ __forceinline__ float SumLanes(const float (&l)[kLanes]) { return (l[0] + l[2]) + (l[1] + l[3]); }

template <typename G, typename P, bool kWithP>
__device__ __forceinline__ void ChunkStats(const G* g, const P* p, int len, float (&out)[3]) {
  StatsVisitor<G, P, kWithP> v{g, p, {}, {}, {}};
  // p is not read without kWithP, so only g's alignment matters then.
  const int head = kWithP ? device::Head(g, p, len) : device::Head(g, g, len);
  VisitChunk(static_cast<int>(threadIdx.x), kBlockThreads, len, head, v);
  out[0] = SumLanes(v.dot);
  out[1] = SumLanes(v.gg);
  out[2] = SumLanes(v.pp);
}

template <typename P, typename Table>
__device__ __forceinline__ void Stats(const Table& table, const PassArgs& args) {
  const ChunkDesc c = table.chunks[blockIdx.x];
  const TensorDesc t = table.tensors[c.tensor];
  if ((t.flags & kTensorUncounted) != 0) {  // another rank counts it; the whole block returns here
    if (threadIdx.x == 0) args.partials[blockIdx.x] = ChunkPartial{0.0f, 0.0f, 0.0f, t.segment};
    return;
  }
  const std::int64_t offset = ChunkOffset(c);
  const int len = ChunkLength(t, c);
  const P* p = static_cast<const P*>(t.p) + offset;
  float sums[3];
  device::WithGradType(t.gt, t.g, [&](auto* g_base) {
    using G = std::remove_pointer_t<decltype(g_base)>;
    const G* g = g_base + offset;
    if (args.flag != 0) {
      ChunkStats<G, P, true>(g, p, len, sums);
    } else {
      ChunkStats<G, P, false>(g, p, len, sums);
    }
  });
  BlockSum<kBlockThreads>(sums);
  if (threadIdx.x == 0) args.partials[blockIdx.x] = ChunkPartial{sums[0], sums[1], sums[2], t.segment};
}

}  // namespace

#define GAC_STATS_KERNEL(name, P, Table)                                                                 \
  extern "C" __global__ void __launch_bounds__(kBlockThreads)                                            \
      name(const __grid_constant__ Table table, const __grid_constant__ PassArgs args) {                 \
    Stats<P>(table, args);                                                                               \
  }
GAC_STATS_KERNEL(gac_stats_f32_inline, float, InlineTable)
GAC_STATS_KERNEL(gac_stats_f32_device, float, DeviceTable)
GAC_STATS_KERNEL(gac_stats_bf16_inline, device::Bf16, InlineTable)
GAC_STATS_KERNEL(gac_stats_bf16_device, device::Bf16, DeviceTable)
#undef GAC_STATS_KERNEL

// The first of partials[0, num_chunks) whose segment is >= s: the partials
// are in segment order (ChunkTable orders the chunks so).
__device__ __forceinline__ int FirstOfSegment(const ChunkPartial* __restrict__ partials, int num_chunks, int s) {
  int lo = 0;
  int hi = num_chunks;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (partials[mid].segment < s) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Block 0 sums every chunk in fp64 and counts the non-finite partials; block
// b > 0 sums the chunks of segment b - 1, a contiguous range it finds by
// binary search. Linear in chunks + segments (each chunk is read by block 0
// and by its segment's block).
extern "C" __global__ void __launch_bounds__(kFinalizeThreads)
    gac_finalize(const ChunkPartial* __restrict__ partials, int num_chunks, int num_segments,
                 double* __restrict__ out) {
  const int segment = static_cast<int>(blockIdx.x) - 1;
  const int first = segment < 0 ? 0 : FirstOfSegment(partials, num_chunks, segment);
  const int end = segment < 0 ? num_chunks : FirstOfSegment(partials, num_chunks, segment + 1);
  double sums[4] = {0.0, 0.0, 0.0, 0.0};
  for (int c = first + static_cast<int>(threadIdx.x); c < end; c += kFinalizeThreads) {
    const ChunkPartial q = partials[c];
    sums[0] += q.dot;
    sums[1] += q.gg;
    sums[2] += q.pp;
    sums[3] += isfinite(q.dot) && isfinite(q.gg) && isfinite(q.pp) ? 0.0 : 1.0;
  }
  BlockSum<kFinalizeThreads>(sums);
  if (threadIdx.x != 0) return;
  const std::size_t at = segment < 0 ? kResultDot : ResultSegment(segment);
  out[at + 0] = sums[0];
  out[at + 1] = sums[1];
  out[at + 2] = sums[2];
  if (segment < 0) out[ResultNonFinite(num_segments)] = sums[3];
}

#ifndef __CUDACC_RTC__

cudaError_t LaunchStats(ElemType pt, const InlineTable* table, const DeviceTable& device_table, const PassArgs& args,
                        int num_chunks, cudaStream_t stream) {
  const bool bf16 = pt == ElemType::kBF16;
  if (table != nullptr && bf16) {
    gac_stats_bf16_inline<<<num_chunks, kBlockThreads, 0, stream>>>(*table, args);
  } else if (table != nullptr) {
    gac_stats_f32_inline<<<num_chunks, kBlockThreads, 0, stream>>>(*table, args);
  } else if (bf16) {
    gac_stats_bf16_device<<<num_chunks, kBlockThreads, 0, stream>>>(device_table, args);
  } else {
    gac_stats_f32_device<<<num_chunks, kBlockThreads, 0, stream>>>(device_table, args);
  }
  return cudaGetLastError();
}

cudaError_t LaunchFinalize(const ChunkPartial* partials, int num_chunks, int num_segments, double* out,
                           cudaStream_t stream) {
  gac_finalize<<<1 + num_segments, kFinalizeThreads, 0, stream>>>(partials, num_chunks, num_segments, out);
  return cudaGetLastError();
}
#endif  // __CUDACC_RTC__

}  // namespace gac::agent::cuda::kernels
