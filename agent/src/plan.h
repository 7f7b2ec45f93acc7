// Plan: what the agent knows of a parameter set between steps. The slots
// (one per parameter: identity, shape, snapshot slice, chunks), the flat
// snapshot, the spans the CPU kernels walk, the tasks that split them across
// threads, and the per-step scratch. Built on the first step after the
// agent's creation or Reset(); reused, never reallocated, by every step.
//
// Thread safety: owned by one Agent and used from its training thread; the
// pass tasks touch disjoint spans and partials.
#ifndef GAC_AGENT_SRC_PLAN_H_
#define GAC_AGENT_SRC_PLAN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "agent/src/cpu/kernels.h"
#include "agent/src/device_passes.h"
#include "gac/agent/core.h"
#include "gac/base/status.h"

namespace gac::agent {

// Below this many elements a step runs on the calling thread only: waking
// workers would cost more than it saves.
inline constexpr std::int64_t kSerialElements = std::int64_t{1} << 18;
// Pass tasks per thread. (16 per thread, for statistics tasks that follow the
// gather more closely, measured no better on 2,000 x 4 KiB tensors.)
inline constexpr std::int64_t kTasksPerThread = 4;
// Snapshot slices start on boundaries of 32 elements (128 / 64 bytes of fp32
// / bf16); on a GPU, a few elements after one, with the gradient's
// misalignment (plan.cc, SlicePad).
inline constexpr std::int64_t kSliceAlignElements = 32;

// A tensor's sizes or strides, inline up to 5 dimensions.
class Dims {
 public:
  Dims() = default;
  Dims(const std::int64_t* d, int n) { assign(d, n); }
  void assign(const std::int64_t* d, int n) {
    n_ = n;
    if (n <= kInline) {
      for (int i = 0; i < n; ++i) inline_[i] = d[i];
    } else {
      heap_.assign(d, d + n);
    }
  }
  const std::int64_t* data() const { return n_ <= kInline ? inline_ : heap_.data(); }
  int size() const { return n_; }
  std::int64_t operator[](int i) const { return data()[i]; }

 private:
  static constexpr int kInline = 5;
  std::int64_t inline_[kInline] = {};
  std::vector<std::int64_t> heap_;
  int n_ = 0;
};

// Strides agree on every dimension that has more than one element.
bool SameLayout(const std::int64_t* sizes, int ndim, const std::int64_t* a, const std::int64_t* b);
bool SameSizes(const Dims& a, const std::int64_t* b, int ndim);

struct Plan {
  // What Step() reads for every tensor comes first (~1.5 cache lines).
  struct Slot {
    const void* param = nullptr;  // identity of the parameter (GradientSource::Describe)
    std::int64_t numel = 0;
    std::int64_t first_chunk = 0;
    std::int64_t end_chunk = 0;     // chunks [first_chunk, end_chunk) are this tensor's
    bool snap_contiguous = false;   // snap_strides are the contiguous strides of sizes
    Dims sizes;
    std::int64_t offset = 0;  // first snapshot element
    Dims snap_strides;  // layout of the snapshot slice
  };
  // A gradient that takes the strided (slow) path this step.
  struct Strided {
    const Slot* slot;
    TensorView grad;  // sizes are the slot's; strides point into strided_dims
    std::size_t strides_at;  // index into strided_dims
  };

  // Builds the slots, chunks, tasks and the zeroed snapshot for the
  // parameters of `source`. InvalidArgument for tensors on several devices,
  // or a layer naming a parameter beyond the list; Unimplemented for
  // gradients on a device this build cannot read.
  static base::StatusOr<std::unique_ptr<Plan>> Build(GradientSource& source, const AgentOptions& options);

  std::int64_t num_tasks() const { return static_cast<std::int64_t>(task_first_chunk.size()) - 1; }
  bool front_only() const { return front != nullptr && !checking; }
  // Runs on the calling thread only: one task, or one thread.
  bool serial(int num_threads) const {
    return device_passes == nullptr && (num_tasks() <= 1 || num_threads == 1);
  }
  // The first element of a slot's snapshot slice.
  char* SnapshotAt(const Slot& s) const { return snap_base + s.offset * static_cast<std::int64_t>(snap_elem_size); }
  std::int64_t SlotIndex(const Slot& s) const { return &s - slots.data(); }

  std::vector<Slot> slots;
  // One per chunk, in slot order: the snapshot slice and length are fixed;
  // the gradient pointer and type are set per step (null: no gradient this
  // step, or not dense with the snapshot's layout).
  std::vector<cpu::Span> spans;
  std::vector<std::int64_t> task_first_chunk;  // tasks + 1 entries
  std::vector<cpu::Partial> partials;          // one per chunk (parallel passes)
  std::vector<Strided> strided;                // per step
  std::vector<std::int64_t> strided_dims;      // per step: the strided gradients' strides
  std::vector<int> group_of;                   // per slot: its parameter group, or -1
  std::vector<char> counted;                   // per slot: in this rank's sums (AgentOptions::uncounted)
  // Per step: (dot, grad_sq, ref_sq) of the step, then 3 per group; device plans then
  // the non-finite count. What the all-reduce sums.
  std::vector<double> reduced;
  // Gradients on a GPU: the passes run there (the spans then only carry
  // device pointers for the gather) and the snapshot lives on that device.
  DeviceId device;
  std::unique_ptr<DevicePasses> device_passes;  // null for CPU plans and the front's
  // The front's passes (gac/agent/front_passes.h): the ones in use when no
  // kernels are (front_only()), or, while `checking`, the reference the CUDA
  // kernels are compared with on their first steps on a device.
  std::unique_ptr<FrontPasses> front;
  bool checking = false;
  std::vector<char> present;  // per slot, per step: 0 no gradient, 1 counted, 2 held but not counted
  const char* passes_name = "cpu";  // what the report's `passes` says: "cpu", "cuda" or the front's name
  std::vector<cuda::TensorRef> device_tensors;  // per slot, per step
  std::vector<StridedTensor> device_strided;    // per step: the strided gradients on the device
  std::int64_t chunk_elements = 0;
  // The flat snapshot (snapshot dtype): host memory, or device memory the
  // device passes own.
  std::unique_ptr<char, std::function<void(char*)>> snapshot;
  std::size_t snapshot_bytes = 0;
  char* snap_base = nullptr;
  std::size_t snap_elem_size = 4;
  cpu::ElemType snap_type = cpu::ElemType::kF32;
  bool has_reference = false;  // the snapshot holds a previous gradient
  bool stepped = false;        // a step completed since Build
  std::int64_t last_step = 0;
};

}  // namespace gac::agent

#endif  // GAC_AGENT_SRC_PLAN_H_
