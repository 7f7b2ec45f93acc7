// ChunkTable: the host side of the multi-tensor harness. Turns a list of
// TensorRefs into the tensor and chunk tables that the kernels read, and
// tells the caller what changed since the previous list, so that the device
// copy is re-uploaded only when the pointers or sizes change. Plain C++ (no
// CUDA); not thread-safe.
#ifndef GAC_AGENT_SRC_CUDA_CHUNK_TABLE_H_
#define GAC_AGENT_SRC_CUDA_CHUNK_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "agent/src/cuda/multi_tensor.h"
#include "gac/base/status.h"

namespace gac::agent::cuda {

class ChunkTable {
 public:
  enum class Change : std::uint8_t {
    kNone = 0,     // same tables as before
    kTensors = 1,  // tensor entries changed (pointers, types, counted); same chunks
    kLayout = 2,   // the chunk list changed too (sizes, segments, or which tensors take part)
  };

  // Segments are numbered [0, num_segments).
  explicit ChunkTable(int num_segments) : num_segments_(num_segments) {}

  // Takes the list for the next passes. Tensors with n == 0 or g == null are
  // left out of the tables (an empty or absent gradient adds nothing and
  // keeps its snapshot). The chunks are in segment order (the tensors of no
  // segment first, then segment 0, 1, ...), each tensor's chunks together
  // and in order, tensors in list order within a segment. The first call
  // reports kLayout.
  // Errors (the previous tables stay in place): InvalidArgument for n < 0, a
  // null p, an unknown element type or segment; OutOfRange for more than
  // 2^31 - 1 chunks or tensors.
  base::StatusOr<Change> Update(const TensorRef* refs, std::size_t count);

  const std::vector<TensorDesc>& tensors() const { return tensors_; }
  const std::vector<ChunkDesc>& chunks() const { return chunks_; }
  std::int64_t num_chunks() const { return static_cast<std::int64_t>(chunks_.size()); }
  // The tables fit the kernel arguments (InlineTable).
  bool fits_inline() const {
    return tensors_.size() <= static_cast<std::size_t>(kInlineTensors) &&
           chunks_.size() <= static_cast<std::size_t>(kInlineChunks);
  }
  // REQUIRES: fits_inline(). Copies the tables into `table`; entries beyond
  // them are left as they are (no kernel reads them).
  void FillInline(InlineTable* table) const;

  // Bytes of the device copy: tensor entries, then chunk entries.
  std::size_t tensor_bytes() const { return tensors_.size() * sizeof(TensorDesc); }
  std::size_t chunk_bytes() const { return chunks_.size() * sizeof(ChunkDesc); }

 private:
  // Which refs take part and with how many elements: the chunk list is a
  // function of this and of the segments.
  static std::int64_t LayoutKey(const TensorRef& r) { return r.g != nullptr && r.n > 0 ? r.n : 0; }

  int num_segments_;
  bool built_ = false;
  std::vector<TensorRef> refs_;  // the previous list
  std::vector<TensorDesc> tensors_;
  std::vector<ChunkDesc> chunks_;
};

}  // namespace gac::agent::cuda

#endif  // GAC_AGENT_SRC_CUDA_CHUNK_TABLE_H_
