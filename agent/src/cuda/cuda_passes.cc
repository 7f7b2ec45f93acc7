#include "agent/src/cuda/cuda_passes.h"

#include <cuda_runtime_api.h>
#ifdef GAC_CUDA_WITH_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <cstring>
#include <string>

#include "agent/src/cuda/cuda_util.h"
#include "agent/src/cuda/kernels.h"

namespace gac::agent::cuda {

namespace {

// Segments beyond this are refused: each is a block of the finalize kernel
// and three entries of the result that is copied back at every step.
constexpr int kMaxSegments = 1 << 16;

}  // namespace

MultiTensorPasses::MultiTensorPasses(int device, ElemType snapshot_type, int num_segments)
    : device_(device),
      snapshot_type_(snapshot_type),
      num_segments_(num_segments),
      table_(num_segments),
      inline_(std::make_unique<InlineTable>()) {}

base::StatusOr<std::unique_ptr<MultiTensorPasses>> MultiTensorPasses::Create(ElemType snapshot_type, int num_segments) {
  if (snapshot_type != ElemType::kF32 && snapshot_type != ElemType::kBF16) {
    return base::Status::InvalidArgument("the snapshot type must be float32 or bfloat16");
  }
  if (num_segments < 0 || num_segments > kMaxSegments) {
    return base::Status::InvalidArgument("num_segments must be in [0, " + std::to_string(kMaxSegments) + "], got " +
                                   std::to_string(num_segments));
  }
  int device = -1;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return CudaStatus("no usable CUDA device", e);
  std::unique_ptr<MultiTensorPasses> passes(new MultiTensorPasses(device, snapshot_type, num_segments));
  for (cudaEvent_t* ev : {&passes->upload_done_, &passes->order_, &passes->result_ready_}) {
    e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
    if (e != cudaSuccess) return CudaStatus("cudaEventCreate", e);
  }
  // Not cleared: the reduction writes every entry at every step (a memset on
  // the legacy stream would not be ordered before a non-blocking stream's
  // kernels anyway).
  const std::size_t result_bytes = passes->result_size() * sizeof(double);
  e = cudaMalloc(reinterpret_cast<void**>(&passes->result_dev_), result_bytes);
  if (e != cudaSuccess) return CudaStatus("cudaMalloc of the statistics buffer", e);
  e = cudaMallocHost(reinterpret_cast<void**>(&passes->result_host_), result_bytes);
  if (e != cudaSuccess) return CudaStatus("cudaMallocHost of the statistics buffer", e);
  return passes;
}

// cudaFree waits for the device, so no kernel still reads what is freed.
MultiTensorPasses::~MultiTensorPasses() {
  DeviceScope scope;
  (void)scope.Enter(device_);
  if (upload_pending_) cudaEventSynchronize(upload_done_);
  cudaFree(table_dev_);
  cudaFree(partials_dev_);
  cudaFree(result_dev_);
  cudaFreeHost(staging_);
  cudaFreeHost(result_host_);
  for (cudaEvent_t ev : {upload_done_, order_, result_ready_}) {
    if (ev != nullptr) cudaEventDestroy(ev);
  }
}

base::Status MultiTensorPasses::Begin(DeviceScope& scope, cudaStream_t stream) {
  GAC_RETURN_IF_ERROR(scope.Enter(device_));
  GAC_RETURN_IF_ERROR(CheckNotCapturing(stream));
  // After this object's work on another stream, through the event recorded
  // there when that work was enqueued (that stream may be gone by now).
  if (ordered_ && stream != order_stream_) {
    const cudaError_t e = cudaStreamWaitEvent(stream, order_, 0);
    if (e != cudaSuccess) return CudaStatus("ordering after the previous stream", e);
  }
  return base::Status::Ok();
}

base::Status MultiTensorPasses::Enqueued(cudaStream_t stream) {
  const cudaError_t e = cudaEventRecord(order_, stream);
  if (e != cudaSuccess) return CudaStatus("recording the passes' order", e);
  ordered_ = true;
  order_stream_ = stream;
  return base::Status::Ok();
}

DeviceTable MultiTensorPasses::device_table() const {
  if (table_dev_ == nullptr || table_.fits_inline()) return DeviceTable{nullptr, nullptr};
  const char* base = static_cast<const char*>(table_dev_);
  return DeviceTable{reinterpret_cast<const TensorDesc*>(base),
                     reinterpret_cast<const ChunkDesc*>(base + table_.tensor_bytes())};
}

base::Status MultiTensorPasses::CheckReady() const {
  if (!have_tensors_) return base::Status::FailedPrecondition("SetTensors() has not succeeded yet");
  return base::Status::Ok();
}

base::Status MultiTensorPasses::SetTensors(const TensorRef* refs, std::size_t count, cudaStream_t stream) {
  DeviceScope scope;
  GAC_RETURN_IF_ERROR(Begin(scope, stream));
  base::StatusOr<ChunkTable::Change> change = table_.Update(refs, count);
  if (!change.ok()) {
    have_tensors_ = false;  // no pass may run on the previous list by mistake
    return change.status();
  }
  if (*change == ChunkTable::Change::kNone) {
    have_tensors_ = true;
    return scope.Exit();
  }
  base::Status st;
  if (*change == ChunkTable::Change::kLayout) st = ReservePartials(stream);
  if (st.ok()) {
    if (table_.fits_inline()) {
      table_.FillInline(inline_.get());
    } else {
      st = Upload(*change, stream);
      if (st.ok()) st = Enqueued(stream);
    }
  }
  if (!st.ok()) {
    // The device does not hold the new tables: forget them, so that the next
    // call rebuilds and uploads everything, and refuse passes until then.
    table_ = ChunkTable(num_segments_);
    have_tensors_ = false;
    return st;
  }
  have_tensors_ = true;
  return scope.Exit();
}

base::Status MultiTensorPasses::ReservePartials(cudaStream_t stream) {
  const std::int64_t needed = table_.num_chunks();
  if (needed <= partials_capacity_) return base::Status::Ok();
  // Enqueued kernels may still use the old buffer.
  cudaError_t e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return CudaStatus("cudaStreamSynchronize", e);
  cudaFree(partials_dev_);
  partials_dev_ = nullptr;
  partials_capacity_ = 0;
  const std::int64_t capacity = std::max<std::int64_t>(needed, 256);
  e = cudaMalloc(reinterpret_cast<void**>(&partials_dev_), static_cast<std::size_t>(capacity) * sizeof(ChunkPartial));
  if (e != cudaSuccess) return CudaStatus("cudaMalloc of the chunk partials", e);
  partials_capacity_ = capacity;
  return base::Status::Ok();
}

base::Status MultiTensorPasses::Upload(ChunkTable::Change change, cudaStream_t stream) {
  const std::size_t tensor_bytes = table_.tensor_bytes();
  const std::size_t needed = tensor_bytes + table_.chunk_bytes();
  // kTensors: the chunk entries and their place are unchanged (a new buffer
  // gets everything).
  bool whole = change == ChunkTable::Change::kLayout;
  cudaError_t e = cudaSuccess;
  if (needed > table_capacity_) {
    whole = true;
    // Enqueued kernels may still read the old table, an upload the staging copy.
    e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return CudaStatus("cudaStreamSynchronize", e);
    upload_pending_ = false;
    cudaFree(table_dev_);
    cudaFreeHost(staging_);
    table_dev_ = nullptr;
    staging_ = nullptr;
    table_capacity_ = 0;
    const std::size_t capacity = std::max<std::size_t>(needed + needed / 2, 4096);
    e = cudaMalloc(&table_dev_, capacity);
    if (e != cudaSuccess) return CudaStatus("cudaMalloc of the chunk table", e);
    e = cudaMallocHost(reinterpret_cast<void**>(&staging_), capacity);
    if (e != cudaSuccess) return CudaStatus("cudaMallocHost of the chunk table", e);
    table_capacity_ = capacity;
  } else if (upload_pending_) {
    // The previous upload may still be reading the staging copy.
    e = cudaEventSynchronize(upload_done_);
    if (e != cudaSuccess) return CudaStatus("waiting for the previous chunk-table upload", e);
    upload_pending_ = false;
  }
  std::memcpy(staging_, table_.tensors().data(), tensor_bytes);
  if (whole) std::memcpy(staging_ + tensor_bytes, table_.chunks().data(), table_.chunk_bytes());
  e = cudaMemcpyAsync(table_dev_, staging_, whole ? needed : tensor_bytes, cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) e = cudaEventRecord(upload_done_, stream);
  if (e != cudaSuccess) return CudaStatus("uploading the chunk table", e);
  upload_pending_ = true;
  ++table_uploads_;
  return base::Status::Ok();
}

base::Status MultiTensorPasses::EnqueueStatistics(bool with_p, cudaStream_t stream) {
  DeviceScope scope;
  GAC_RETURN_IF_ERROR(CheckReady());
  GAC_RETURN_IF_ERROR(Begin(scope, stream));
  const int num_chunks = static_cast<int>(table_.num_chunks());
  if (num_chunks > 0) {
    const PassArgs args{partials_dev_, 0.0f, with_p ? 1 : 0};
    ++launches_;
    const cudaError_t e = kernels::LaunchStats(snapshot_type_, table_.fits_inline() ? inline_.get() : nullptr,
                                               device_table(), args, num_chunks, stream);
    if (e != cudaSuccess) return CudaStatus("launching the statistics kernel", e);
  }
  ++launches_;
  const cudaError_t e = kernels::LaunchFinalize(partials_dev_, num_chunks, num_segments_, result_dev_, stream);
  if (e != cudaSuccess) return CudaStatus("launching the statistics reduction", e);
  GAC_RETURN_IF_ERROR(Enqueued(stream));
  return scope.Exit();
}

base::Status MultiTensorPasses::EnqueueAllReduce(ncclComm_t comm, cudaStream_t stream) {
#ifdef GAC_CUDA_WITH_NCCL
  DeviceScope scope;
  GAC_RETURN_IF_ERROR(Begin(scope, stream));
  const ncclResult_t r = ncclAllReduce(result_dev_, result_dev_, result_size(), ncclFloat64, ncclSum, comm, stream);
  if (r != ncclSuccess) return base::Status::Unavailable(std::string("ncclAllReduce: ") + ncclGetErrorString(r));
  GAC_RETURN_IF_ERROR(Enqueued(stream));
  return scope.Exit();
#else
  (void)comm;
  (void)stream;
  return base::Status::Unimplemented("gac::agent_cuda was built without NCCL");
#endif
}

base::StatusOr<StatsView> MultiTensorPasses::ReadResult(cudaStream_t stream) {
  DeviceScope scope;
  GAC_RETURN_IF_ERROR(Begin(scope, stream));
  cudaError_t e =
      cudaMemcpyAsync(result_host_, result_dev_, result_size() * sizeof(double), cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaEventRecord(result_ready_, stream);
  if (e == cudaSuccess) e = cudaEventSynchronize(result_ready_);
  if (e != cudaSuccess) return CudaStatus("reading the statistics back", e);
  // Everything enqueued before, on any stream, is done: `stream` waited for it.
  ordered_ = false;
  GAC_RETURN_IF_ERROR(scope.Exit());
  return StatsView{result_host_, num_segments_};
}

base::Status MultiTensorPasses::LaunchApply(bool project, float coeff, bool snapshot_projected, cudaStream_t stream) {
  DeviceScope scope;
  GAC_RETURN_IF_ERROR(CheckReady());
  GAC_RETURN_IF_ERROR(Begin(scope, stream));
  const int num_chunks = static_cast<int>(table_.num_chunks());
  if (num_chunks == 0) return scope.Exit();
  const PassArgs args{nullptr, coeff, snapshot_projected ? 1 : 0};
  const InlineTable* inline_table = table_.fits_inline() ? inline_.get() : nullptr;
  ++launches_;
  const cudaError_t e =
      project ? kernels::LaunchProjectSnapshot(snapshot_type_, inline_table, device_table(), args, num_chunks, stream)
              : kernels::LaunchSnapshot(snapshot_type_, inline_table, device_table(), args, num_chunks, stream);
  if (e != cudaSuccess) {
    return CudaStatus(project ? "launching the projection kernel" : "launching the snapshot kernel", e);
  }
  GAC_RETURN_IF_ERROR(Enqueued(stream));
  return scope.Exit();
}

base::Status MultiTensorPasses::EnqueueProjectSnapshot(float coeff, bool snapshot_projected, cudaStream_t stream) {
  return LaunchApply(true, coeff, snapshot_projected, stream);
}

base::Status MultiTensorPasses::EnqueueSnapshot(cudaStream_t stream) { return LaunchApply(false, 0.0f, false, stream); }

base::Status MultiTensorPasses::EnqueueStridedCopy(const StridedCopyArgs& args, cudaStream_t stream) {
  if (args.ndim < 0 || args.ndim > kMaxStridedDims || (args.elem_bytes != 2 && args.elem_bytes != 4) || args.n < 0) {
    return base::Status::InvalidArgument("a strided copy of " + std::to_string(args.ndim) + " dimensions and " +
                                         std::to_string(args.elem_bytes) + "-byte elements");
  }
  if (args.n == 0) return base::Status::Ok();
  DeviceScope scope;
  GAC_RETURN_IF_ERROR(Begin(scope, stream));
  ++launches_;
  const cudaError_t e = kernels::LaunchStridedCopy(args, stream);
  if (e != cudaSuccess) return CudaStatus("launching the strided copy", e);
  GAC_RETURN_IF_ERROR(Enqueued(stream));
  return scope.Exit();
}

}  // namespace gac::agent::cuda
