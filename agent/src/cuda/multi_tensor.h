// The multi-tensor harness of the CUDA passes: what the host code that
// builds the chunk tables (C++ compiler) and the kernels (nvcc) share.
//
// A pass covers any number of tensors in one launch. Every tensor is cut
// into chunks of kChunkElements elements (the last one shorter); a thread
// block handles one chunk. The block finds its chunk in a table: the chunk
// names its tensor, the tensor entry holds the pointers, the length, the
// gradient's element type and the segment (parameter group) the tensor's
// statistics are also summed into. The table travels in the kernel's
// argument struct when it fits the 4 KiB kernel-parameter limit
// (InlineTable), otherwise it lives in device memory (DeviceTable) and is
// uploaded only when the tensor list changes.
//
// Plain C++: no CUDA header is needed to include this file, and what it
// defines for both sides (VisitChunk, ChunkLength) is compiled by both, so
// the CPU tests check the very indexing the kernels use.
#ifndef GAC_AGENT_SRC_CUDA_MULTI_TENSOR_H_
#define GAC_AGENT_SRC_CUDA_MULTI_TENSOR_H_

#if defined(__CUDACC_RTC__)
#include "agent/src/cuda/rtc_std.h"
#else
#include <cstddef>
#include <cstdint>
#endif

#if defined(__CUDACC__)
#define GAC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define GAC_HOST_DEVICE inline
#endif
// Unrolling for device code only: the host compiler does not know the pragma.
#if defined(__CUDA_ARCH__)
#define GAC_UNROLL _Pragma("unroll")
#else
#define GAC_UNROLL
#endif

namespace gac::agent::cuda {

// Element types; the numbering is that of the CPU kernels' ElemType.
enum class ElemType : std::uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

GAC_HOST_DEVICE int ElemSize(ElemType t) { return t == ElemType::kF32 ? 4 : 2; }

// One tensor of a pass, as the caller describes it.
struct TensorRef {
  void* g = nullptr;   // gradient (device memory); null: no gradient, skipped
  void* p = nullptr;   // its snapshot slice: n elements of the snapshot type
  std::int64_t n = 0;  // elements; 0: skipped
  ElemType gt = ElemType::kF32;
  std::int32_t segment = -1;  // also summed into this segment; -1: none
  // False: left out of the statistics (another rank counts the same values),
  // still projected and snapshotted.
  bool counted = true;
};

// Elements per chunk. Chunk offsets are multiples of 16 bytes for every
// element type, so each chunk starts with its tensor's alignment, and the
// chunk index within a tensor fits 32 bits up to 2^45 elements.
constexpr int kChunkElements = 16384;
// Threads per block of the chunk kernels, and of the kernel that sums their
// partials.
constexpr int kBlockThreads = 256;
constexpr int kFinalizeThreads = 512;
// Elements a thread handles per vector step: 16 bytes of a 2-byte type,
// 32 bytes of fp32.
constexpr int kVecElements = 8;

// A tensor as the kernels see it (32 bytes).
struct TensorDesc {
  void* g;
  void* p;
  std::int64_t n;
  std::int32_t segment;
  std::uint8_t gt;     // ElemType
  std::uint8_t flags;  // kTensorUncounted
  std::uint8_t reserved[2];
};
// TensorDesc::flags: the statistics pass writes zero partials for the
// tensor's chunks without reading them (TensorRef::counted false).
constexpr std::uint8_t kTensorUncounted = 1;
static_assert(sizeof(TensorDesc) == 32, "TensorDesc is read as 32 bytes");

// Elements [chunk * kChunkElements, min(n, (chunk + 1) * kChunkElements)) of
// tensor `tensor`.
struct ChunkDesc {
  std::int32_t tensor;
  std::int32_t chunk;
};

// The statistics of one chunk, summed in fp32, and its tensor's segment
// (one 16-byte store).
struct alignas(16) ChunkPartial {
  float dot;
  float gg;
  float pp;
  std::int32_t segment;
};

// Kernel parameters are limited to 4 KiB (CUDA 12.1 raised it to 32 KiB on
// Volta and later; the classic limit keeps every launch's argument copy
// small). PassArgs + InlineTable must fit it.
constexpr std::size_t kKernelParamBytes = 4096;
constexpr int kInlineTensors = 48;
constexpr int kInlineChunks = 304;

struct InlineTable {
  TensorDesc tensors[kInlineTensors];
  ChunkDesc chunks[kInlineChunks];
};

struct DeviceTable {
  const TensorDesc* tensors;
  const ChunkDesc* chunks;
};

// Per-launch arguments besides the table.
struct PassArgs {
  ChunkPartial* partials;  // statistics: one per chunk
  float coeff;             // projection: g <- g - coeff * p
  std::int32_t flag;       // statistics: read p; projection: snapshot the projected g
};

static_assert(sizeof(InlineTable) + sizeof(PassArgs) <= kKernelParamBytes,
              "the inline table must fit the kernel-parameter limit");

// A gradient that is not dense in its snapshot slice's layout (a strided
// view, or a layout that changed since the first step) is copied into
// scratch memory in row-major index order, and back after the apply pass,
// element by element: dst[Σ idx·dst_strides] = src[Σ idx·src_strides] for
// every index idx of `sizes` (strides in elements).
constexpr int kMaxStridedDims = 8;
struct StridedCopyArgs {
  const void* src;
  void* dst;
  std::int64_t n;           // elements: the product of sizes
  std::int32_t ndim;        // at most kMaxStridedDims
  std::int32_t elem_bytes;  // 2 or 4
  std::int64_t sizes[kMaxStridedDims];
  std::int64_t src_strides[kMaxStridedDims];
  std::int64_t dst_strides[kMaxStridedDims];
};
static_assert(sizeof(StridedCopyArgs) <= kKernelParamBytes, "the copy's arguments must fit the parameter limit");

// Blocks of a strided copy of n > 0 elements: a thread per element, at most
// 65,535 blocks (a grid-stride loop covers the rest).
GAC_HOST_DEVICE int StridedCopyBlocks(std::int64_t n) {
  const std::int64_t blocks = (n + kBlockThreads - 1) / kBlockThreads;
  return blocks < 65535 ? static_cast<int>(blocks) : 65535;
}

GAC_HOST_DEVICE std::int64_t ChunkOffset(const ChunkDesc& c) {
  return static_cast<std::int64_t>(c.chunk) * kChunkElements;
}

// Length of chunk c of tensor t: kChunkElements, or less for the last one.
GAC_HOST_DEVICE int ChunkLength(const TensorDesc& t, const ChunkDesc& c) {
  const std::int64_t rest = t.n - ChunkOffset(c);
  return rest < kChunkElements ? static_cast<int>(rest) : kChunkElements;
}

// Where the vector path of a chunk starts: the fewest elements (fewer than
// kVecElements) after which both its gradient (at address g, elements of
// g_size bytes) and its snapshot (p, p_size) sit on a 16-byte boundary, at
// most len; -1 when there is none (the chunk takes the scalar path). Views
// into flat buffers (DDP buckets, FSDP1, DeepSpeed) are often 2- or 4-byte
// aligned, so the snapshot slice is placed with the gradient's misalignment
// (plan.cc) and only this prologue is scalar. Without a snapshot, pass g
// for p.
GAC_HOST_DEVICE int VectorHead(std::uintptr_t g, int g_size, std::uintptr_t p, int p_size, int len) {
  const int to_boundary = static_cast<int>((16 - (g & 15u)) & 15u);
  if (to_boundary % g_size != 0) return -1;
  for (int head = to_boundary / g_size; head < kVecElements; head += 16 / g_size) {
    if (((p + static_cast<std::uintptr_t>(head) * static_cast<std::uintptr_t>(p_size)) & 15u) == 0) {
      return head < len ? head : len;
    }
  }
  return -1;
}

// Hands thread `tid` of `threads` its elements of a chunk of `len` elements:
//  - with a vector path (head >= 0, from VectorHead): elements [0, head), one
//    each to threads [0, head), through v.Scalar(i, 0); then groups of
//    kVecElements elements at offsets i = head + kVecElements * (tid + k *
//    threads) through v.Vector(i), up to the last whole group;
//  - then every remaining element i through v.Scalar(i, lane), lane in
//    [0, kVecElements): one pass hands a thread up to kVecElements elements
//    threads apart, so a warp's accesses stay contiguous and the lane is a
//    compile-time constant after unrolling (accumulators stay in registers).
// Every element of [0, len) is handed out exactly once over all threads.
// REQUIRES: head < threads.
template <typename Visitor>
GAC_HOST_DEVICE void VisitChunk(int tid, int threads, int len, int head, Visitor& v) {
  int vec_end = 0;
  if (head >= 0) {
    if (tid < head) v.Scalar(tid, 0);
    vec_end = head + (len - head) / kVecElements * kVecElements;
    for (int i = head + tid * kVecElements; i < vec_end; i += threads * kVecElements) v.Vector(i);
  }
  for (int base = vec_end + tid; base < len; base += threads * kVecElements) {
    GAC_UNROLL
    for (int lane = 0; lane < kVecElements; ++lane) {
      const int i = base + lane * threads;
      if (i < len) v.Scalar(i, lane);
    }
  }
}

// Layout of the statistics result (fp64, device memory and its host copy):
// dot, |g|^2, |p|^2 of all tensors, the same three per segment, then the
// number of chunks whose fp32 partials are not all finite.
constexpr std::size_t kResultDot = 0;
constexpr std::size_t kResultGg = 1;
constexpr std::size_t kResultPp = 2;
GAC_HOST_DEVICE std::size_t ResultSegment(int segment) { return 3 + 3 * static_cast<std::size_t>(segment); }
GAC_HOST_DEVICE std::size_t ResultNonFinite(int num_segments) { return ResultSegment(num_segments); }
GAC_HOST_DEVICE std::size_t ResultSize(int num_segments) { return ResultNonFinite(num_segments) + 1; }

}  // namespace gac::agent::cuda

#endif  // GAC_AGENT_SRC_CUDA_MULTI_TENSOR_H_
