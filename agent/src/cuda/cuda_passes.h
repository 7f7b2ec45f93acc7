// MultiTensorPasses: the agent's statistics, projection and snapshot passes
// over a list of GPU tensors, as fused multi-tensor kernels. Raw device
// pointers and a stream; no LibTorch. Target gac::agent_cuda.
//
// A step enqueues at most three kernel launches for any number of tensors:
//   SetTensors(refs)            no launch; an upload of the chunk table only
//                               when the pointers or sizes changed and the
//                               list does not fit the kernel arguments
//   EnqueueStatistics()         2 launches: per-chunk fp32 partials, then the
//                               fp64 sums into device_result()
//   [EnqueueAllReduce(comm)]    ncclAllReduce of device_result() (NCCL)
//   ReadResult()                one device-to-host copy of the sums, and a
//                               wait for that copy only: the step's one sync
//   EnqueueProjectSnapshot() or EnqueueSnapshot()   1 launch, not waited for
//
// Every call may use a different stream: a call on a new stream is ordered
// after everything this object enqueued before, through an event recorded on
// the earlier stream when that work was enqueued (never later: the caller's
// stream may be destroyed between calls). The object works on the device
// that was current at Create() and makes it current for each call, putting
// back what was current (gac/agent/src/cuda/cuda_util.h). A call on a stream
// that is capturing a CUDA graph is refused (FailedPrecondition) before
// anything is enqueued. Not thread-safe: one thread (the trainer's) uses it.
#ifndef GAC_AGENT_SRC_CUDA_CUDA_PASSES_H_
#define GAC_AGENT_SRC_CUDA_CUDA_PASSES_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "agent/src/cuda/chunk_table.h"
#include "agent/src/cuda/multi_tensor.h"
#include "gac/base/status.h"

// The same opaque handle types as cuda_runtime_api.h and nccl.h declare.
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef struct ncclComm* ncclComm_t;

namespace gac::agent::cuda {

class DeviceScope;

// The statistics of a step, as ReadResult() returns them (host copy).
struct StatsView {
  const double* values = nullptr;  // ResultSize(num_segments) entries, see multi_tensor.h
  int num_segments = 0;
  double dot() const { return values[kResultDot]; }
  double gg() const { return values[kResultGg]; }
  double pp() const { return values[kResultPp]; }
  double segment_dot(int s) const { return values[ResultSegment(s)]; }
  double segment_gg(int s) const { return values[ResultSegment(s) + 1]; }
  double segment_pp(int s) const { return values[ResultSegment(s) + 2]; }
  // Chunks whose fp32 partials were not all finite: a NaN or infinity in the
  // input, or a chunk sum beyond the fp32 range. Non-zero means the fp64
  // sums are not finite either.
  std::int64_t non_finite_chunks() const { return static_cast<std::int64_t>(values[ResultNonFinite(num_segments)]); }
};

class MultiTensorPasses {
 public:
  // snapshot_type: kF32 or kBF16. Statistics are also summed per segment
  // [0, num_segments). Errors: InvalidArgument; Unavailable without a usable
  // device (no driver, no GPU) or when the buffers cannot be allocated.
  static base::StatusOr<std::unique_ptr<MultiTensorPasses>> Create(ElemType snapshot_type, int num_segments = 0);
  ~MultiTensorPasses();
  MultiTensorPasses(const MultiTensorPasses&) = delete;
  MultiTensorPasses& operator=(const MultiTensorPasses&) = delete;

  // Takes the tensor list of the following passes (see ChunkTable::Update for
  // what is left out and the errors). Cheap when nothing changed: one
  // comparison per tensor. REQUIRES: the pointers address memory of this
  // object's device, valid until the passes that use them have run.
  base::Status SetTensors(const TensorRef* refs, std::size_t count, cudaStream_t stream);

  // Enqueues the statistics of the current list into device_result(): dot,
  // |g|^2, |p|^2 with with_p, else |g|^2 only (dot = pp = 0, p not read).
  base::Status EnqueueStatistics(bool with_p, cudaStream_t stream);
  // Enqueues ncclAllReduce(SUM) of device_result() on comm and stream.
  // Collective. Unimplemented in builds without NCCL.
  base::Status EnqueueAllReduce(ncclComm_t comm, cudaStream_t stream);
  // Copies device_result() to pinned host memory and waits for that copy
  // (hence for everything enqueued on `stream` before it). The view stays
  // valid until the next ReadResult().
  base::StatusOr<StatsView> ReadResult(cudaStream_t stream);

  // Enqueues g <- g - coeff * p and p <- (snapshot_projected ? new g : old g)
  // over the current list. Does not wait.
  base::Status EnqueueProjectSnapshot(float coeff, bool snapshot_projected, cudaStream_t stream);
  // Enqueues p <- g (converted, round to nearest even). Does not wait.
  base::Status EnqueueSnapshot(cudaStream_t stream);
  // Enqueues the element-by-element copy of `args` (multi_tensor.h; nothing
  // when args.n is 0). Does not wait. InvalidArgument for more than
  // kMaxStridedDims dimensions or an element size other than 2 or 4.
  base::Status EnqueueStridedCopy(const StridedCopyArgs& args, cudaStream_t stream);

  // fp64 device buffer of result_size() entries (layout in multi_tensor.h),
  // e.g. for another reducer to all-reduce in place.
  double* device_result() const { return result_dev_; }
  std::size_t result_size() const { return ResultSize(num_segments_); }
  int device() const { return device_; }
  int num_segments() const { return num_segments_; }
  ElemType snapshot_type() const { return snapshot_type_; }

  // Kernel launches and chunk-table uploads since Create() (for tests and
  // benchmarks).
  std::uint64_t launches() const { return launches_; }
  std::uint64_t table_uploads() const { return table_uploads_; }
  // The current list travels in the kernel arguments (no device table).
  bool inline_table() const { return table_.fits_inline(); }
  std::int64_t num_chunks() const { return table_.num_chunks(); }

 private:
  MultiTensorPasses(int device, ElemType snapshot_type, int num_segments);
  // Makes this object's device current in `scope`, refuses a capturing
  // stream, and orders `stream` after this object's earlier work.
  base::Status Begin(DeviceScope& scope, cudaStream_t stream);
  // Records that work was enqueued on `stream` (the event later calls on
  // other streams wait for).
  base::Status Enqueued(cudaStream_t stream);
  // Copies the changed tables to the device (device-table mode).
  base::Status Upload(ChunkTable::Change change, cudaStream_t stream);
  // Grows the partials buffer to the current chunk count.
  base::Status ReservePartials(cudaStream_t stream);
  base::Status CheckReady() const;
  // The device copy of the tables (null pointers in inline mode).
  DeviceTable device_table() const;
  base::Status LaunchApply(bool project, float coeff, bool snapshot_projected, cudaStream_t stream);

  // Constant after construction.
  const int device_;
  const ElemType snapshot_type_;
  const int num_segments_;

  ChunkTable table_;
  bool have_tensors_ = false;
  std::unique_ptr<InlineTable> inline_;  // host copy passed by value at launch
  void* table_dev_ = nullptr;            // TensorDesc[] then ChunkDesc[]
  std::size_t table_capacity_ = 0;       // bytes, of table_dev_ and staging_
  char* staging_ = nullptr;              // pinned host copy of the upload
  bool upload_pending_ = false;          // upload_done_ recorded, maybe not reached
  ChunkPartial* partials_dev_ = nullptr;
  std::int64_t partials_capacity_ = 0;
  double* result_dev_ = nullptr;
  double* result_host_ = nullptr;  // pinned
  cudaEvent_t upload_done_ = nullptr;
  cudaEvent_t order_ = nullptr;  // recorded after the last enqueued work
  cudaEvent_t result_ready_ = nullptr;
  bool ordered_ = false;         // order_ holds work not yet waited for
  cudaStream_t order_stream_ = nullptr;  // where order_ was recorded
  std::uint64_t launches_ = 0;
  std::uint64_t table_uploads_ = 0;
};

}  // namespace gac::agent::cuda

#endif  // GAC_AGENT_SRC_CUDA_CUDA_PASSES_H_
