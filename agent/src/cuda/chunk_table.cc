#include "agent/src/cuda/chunk_table.h"

#include <algorithm>
#include <limits>
#include <string>

namespace gac::agent::cuda {

namespace {

constexpr std::int64_t kMaxEntries = std::numeric_limits<std::int32_t>::max();

bool SameEntry(const TensorRef& a, const TensorRef& b) {
  return a.g == b.g && a.p == b.p && a.n == b.n && a.gt == b.gt && a.segment == b.segment && a.counted == b.counted;
}

TensorDesc Describe(const TensorRef& r) {
  TensorDesc d{};
  d.g = r.g;
  d.p = r.p;
  d.n = r.n;
  d.segment = r.segment;
  d.gt = static_cast<std::uint8_t>(r.gt);
  d.flags = r.counted ? 0 : kTensorUncounted;
  return d;
}

}  // namespace

base::StatusOr<ChunkTable::Change> ChunkTable::Update(const TensorRef* refs, std::size_t count) {
  // Validate and classify in one pass; nothing is modified before the end.
  bool layout = !built_ || count != refs_.size();
  bool entries = false;
  std::int64_t num_tensors = 0;
  std::int64_t num_chunks = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const TensorRef& r = refs[i];
    if (r.n < 0) return base::Status::InvalidArgument("tensor " + std::to_string(i) + " has a negative length");
    const std::int64_t key = LayoutKey(r);
    if (key == 0) {
      if (!layout && LayoutKey(refs_[i]) != 0) layout = true;
      continue;
    }
    // The chunks' order depends on the segments too.
    if (!layout && (key != LayoutKey(refs_[i]) || r.segment != refs_[i].segment)) layout = true;
    if (r.p == nullptr) return base::Status::InvalidArgument("tensor " + std::to_string(i) + " has no snapshot pointer");
    if (r.gt != ElemType::kF32 && r.gt != ElemType::kBF16 && r.gt != ElemType::kF16) {
      return base::Status::InvalidArgument("tensor " + std::to_string(i) + " has an unknown element type");
    }
    if (r.segment < -1 || r.segment >= num_segments_) {
      return base::Status::InvalidArgument("tensor " + std::to_string(i) + " names segment " + std::to_string(r.segment) +
                                     " of " + std::to_string(num_segments_));
    }
    if (!layout && !entries && !SameEntry(r, refs_[i])) entries = true;
    ++num_tensors;
    num_chunks += (key + kChunkElements - 1) / kChunkElements;
  }
  if (num_tensors > kMaxEntries || num_chunks > kMaxEntries) {
    return base::Status::OutOfRange("the tensor list needs " + std::to_string(num_chunks) + " chunks of " +
                              std::to_string(kChunkElements) + " elements; at most 2^31 - 1 are supported");
  }
  if (!layout && !entries) return Change::kNone;

  refs_.assign(refs, refs + count);
  built_ = true;
  tensors_.clear();
  tensors_.reserve(static_cast<std::size_t>(num_tensors));
  for (const TensorRef& r : refs_) {
    if (LayoutKey(r) != 0) tensors_.push_back(Describe(r));
  }
  if (!layout) return Change::kTensors;

  // In segment order (no segment first), tensor order within a segment: the
  // finalize kernel sums each segment's partials as one contiguous range.
  std::vector<std::int64_t> first(static_cast<std::size_t>(num_segments_) + 2, 0);  // by segment + 1
  for (const TensorDesc& t : tensors_) {
    first[static_cast<std::size_t>(t.segment) + 2] += (t.n + kChunkElements - 1) / kChunkElements;
  }
  for (std::size_t s = 1; s < first.size(); ++s) first[s] += first[s - 1];
  chunks_.resize(static_cast<std::size_t>(num_chunks));
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    std::int64_t& next = first[static_cast<std::size_t>(tensors_[t].segment) + 1];
    for (std::int64_t c = 0; c * kChunkElements < tensors_[t].n; ++c) {
      chunks_[static_cast<std::size_t>(next++)] = ChunkDesc{static_cast<std::int32_t>(t), static_cast<std::int32_t>(c)};
    }
  }
  return Change::kLayout;
}

void ChunkTable::FillInline(InlineTable* table) const {
  std::copy(tensors_.begin(), tensors_.end(), table->tensors);
  std::copy(chunks_.begin(), chunks_.end(), table->chunks);
}

}  // namespace gac::agent::cuda
