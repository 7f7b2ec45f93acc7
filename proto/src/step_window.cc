#include "gac/proto/step_window.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <utility>
#include <vector>

#include "gac/proto/convert.h"

namespace gac::proto {

std::optional<double> RecordWindowCosine(const v1::StepRecord& record) {
  if (!record.has_cosine() || !std::isfinite(record.cosine()) || record.regime() == v1::REGIME_INVALID ||
      record.regime() == v1::REGIME_SPIKE) {
    return std::nullopt;
  }
  return record.cosine();
}

int ListingWindow(const v1::RunConfig& config) {
  return std::clamp(WindowFromProto(config.window()), 1, controller::kMaxWindow);
}

StepWindowMeans::StepWindowMeans(int window, std::int64_t first_step, RankStepsReader read)
    : window_(window), first_step_(first_step), read_(std::move(read)) {}

base::StatusOr<std::optional<double>> StepWindowMeans::Next(const v1::StepRecord& record) {
  auto it = ranks_.find(record.rank());
  if (it == ranks_.end()) {
    GAC_ASSIGN_OR_RETURN(controller::AlignmentWindow earlier, LookBack(record.rank(), record.step()));
    it = ranks_.emplace(record.rank(), std::move(earlier)).first;
  }
  if (const std::optional<double> c = RecordWindowCosine(record)) it->second.Add(*c);
  return it->second.mean();
}

base::StatusOr<std::vector<std::optional<double>>> StepWindowMeans::Next(
    const google::protobuf::RepeatedPtrField<v1::StepRecord>& records) {
  std::vector<std::optional<double>> means;
  means.reserve(static_cast<std::size_t>(records.size()));
  for (const v1::StepRecord& r : records) {
    GAC_ASSIGN_OR_RETURN(std::optional<double> m, Next(r));
    means.push_back(m);
  }
  return means;
}

base::StatusOr<controller::AlignmentWindow> StepWindowMeans::LookBack(std::uint32_t rank, std::int64_t before) const {
  // The newest W window cosines before `before` (W, not W-1: the listed
  // record may have none), oldest first, gathered from the newest range
  // backwards.
  const std::size_t need = static_cast<std::size_t>(window_);
  std::deque<double> held;
  std::int64_t end = before;
  std::int64_t span = window_;
  while (held.size() < need && end > first_step_) {
    const std::int64_t start = end - first_step_ <= span ? first_step_ : end - span;
    std::vector<double> range;
    GAC_RETURN_IF_ERROR(read_(rank, start, end, [&](const v1::StepRecord& r) {
      if (const std::optional<double> c = RecordWindowCosine(r)) range.push_back(*c);
    }));
    // Older than everything held: only the newest of them that still fit.
    const std::size_t take = std::min(range.size(), need - held.size());
    held.insert(held.begin(), range.end() - static_cast<std::ptrdiff_t>(take), range.end());
    end = start;
    span = span > std::numeric_limits<std::int64_t>::max() / 4 ? std::numeric_limits<std::int64_t>::max() : span * 4;
  }
  controller::AlignmentWindow window(window_);
  for (double c : held) window.Add(c);
  return window;
}

}  // namespace gac::proto
