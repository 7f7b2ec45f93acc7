#include "server/src/queries.h"

#include <google/protobuf/io/coded_stream.h>

#include <charconv>
#include <climits>
#include <exception>
#include <functional>
#include <utility>

#include "gac/controller/calibration.h"
#include "gac/proto/convert.h"
#include "gac/proto/step_window.h"
#include "server/src/validate.h"

namespace gac::server {
namespace {

base::Status MalformedToken() { return base::Status::InvalidArgument("malformed page_token"); }

}  // namespace

base::StatusOr<std::uint32_t> PageSize(std::uint32_t requested, PageLimits limits) {
  if (requested == 0) return limits.default_size;
  if (requested > limits.max_size) {
    return base::Status::InvalidArgument("page_size " + std::to_string(requested) + " above the maximum " +
                                   std::to_string(limits.max_size));
  }
  return requested;
}

std::string EncodeRunToken(const std::string& last_run) { return "r" + last_run; }

base::StatusOr<std::string> DecodeRunToken(const std::string& token) {
  if (token.empty()) return std::string();
  if (token[0] != 'r' || !ValidateRunId(std::string_view(token).substr(1)).ok()) return MalformedToken();
  return token.substr(1);
}

std::string EncodeStepToken(std::int64_t step, std::uint32_t rank) {
  return "s" + std::to_string(step) + "." + std::to_string(rank);
}

base::StatusOr<std::pair<std::int64_t, std::uint32_t>> DecodeStepToken(const std::string& token) {
  // Exactly "s<step>.<rank>", each a decimal number in its type's range.
  const auto dot = token.find('.');
  if (token.size() > 32 || token.size() < 4 || token[0] != 's' || dot == std::string::npos) return MalformedToken();
  std::int64_t step = 0;
  std::uint32_t rank = 0;
  const char* end = token.data() + token.size();
  const auto s = std::from_chars(token.data() + 1, token.data() + dot, step);
  const auto r = std::from_chars(token.data() + dot + 1, end, rank);
  if (s.ec != std::errc() || s.ptr != token.data() + dot || r.ec != std::errc() || r.ptr != end || step < 0 ||
      token[1] == '-' || token[dot + 1] == '-') {
    return MalformedToken();
  }
  return std::make_pair(step, rank);
}

std::string EncodeOffsetToken(std::uint64_t offset) { return "o" + std::to_string(offset); }

base::StatusOr<std::uint64_t> DecodeOffsetToken(const std::string& token) {
  if (token.empty()) return std::uint64_t{0};
  if (token.size() < 2 || token[0] != 'o' || token.find_first_not_of("0123456789", 1) != std::string::npos ||
      token.size() > 21) {
    return MalformedToken();
  }
  try {
    return static_cast<std::uint64_t>(std::stoull(token.substr(1)));
  } catch (const std::exception&) {
    return MalformedToken();
  }
}

base::StatusOr<v1::ListRunsResponse> ListRunsPage(Store& store, const RunRegistry& registry, const Principal& principal,
                                            const v1::ListRunsRequest& request) {
  GAC_ASSIGN_OR_RETURN(std::uint32_t limit, PageSize(request.page_size(), kRunPages));
  GAC_ASSIGN_OR_RETURN(std::string after, DecodeRunToken(request.page_token()));
  v1::ListRunsResponse resp;
  // Runs the principal may not read are skipped, so scan in chunks.
  for (;;) {
    GAC_ASSIGN_OR_RETURN(auto runs, store.ListRuns(after, limit));
    for (v1::RunInfo& info : runs) {
      after = info.run();
      if (!principal.Allows(kRead, info.run())) continue;
      *info.mutable_config() = registry.Get(info.run());
      if (request.include_latest()) {
        GAC_ASSIGN_OR_RETURN(auto latest, store.GetRecentSteps(info.run(), 0, 1));
        if (!latest.empty()) *info.mutable_latest() = std::move(latest.back());
      }
      *resp.add_runs() = std::move(info);
      if (static_cast<std::uint32_t>(resp.runs_size()) == limit) break;
    }
    if (runs.size() < limit) break;  // no more runs
    if (static_cast<std::uint32_t>(resp.runs_size()) == limit) {
      resp.set_next_page_token(EncodeRunToken(after));
      break;
    }
  }
  return resp;
}

base::StatusOr<StepQuery> StepQueryFromRequest(const v1::GetStepsRequest& request) {
  GAC_RETURN_IF_ERROR(ValidateRunId(request.run()));
  if (request.start_step() < 0) return base::Status::InvalidArgument("start_step must be >= 0");
  if (request.end_step() != 0 && request.end_step() <= request.start_step()) {
    return base::Status::InvalidArgument("end_step must be above start_step (or 0 for no limit)");
  }
  GAC_ASSIGN_OR_RETURN(std::uint32_t size, PageSize(request.page_size(), kStepPages));
  StepQuery q;
  q.run = request.run();
  if (!request.page_token().empty()) {
    GAC_ASSIGN_OR_RETURN(auto after, DecodeStepToken(request.page_token()));
    q.after = after;
  }
  q.start_step = request.start_step();
  q.end_step = request.end_step() == 0 ? INT64_MAX : request.end_step();
  if (request.has_rank()) q.rank = request.rank();
  q.include_layers = request.include_layers();
  q.limit = size + 1;
  return q;
}

base::StatusOr<v1::GetStepsResponse> GetStepsPage(Store& store, const StepQuery& query, std::size_t max_bytes) {
  if (auto run = store.GetRun(query.run); !run.ok()) {
    // A store that cannot answer (a database that went away) keeps its code.
    if (run.status().code() != base::StatusCode::kNotFound) return run.status();
    return base::Status::NotFound("unknown run '" + query.run + "'");
  }
  GAC_ASSIGN_OR_RETURN(auto steps, store.GetSteps(query));
  v1::GetStepsResponse resp;
  const std::size_t page = query.limit - 1;
  std::size_t bytes = 0;
  std::size_t taken = 0;
  for (; taken < steps.size() && taken < page; ++taken) {
    // A record's share of the response: its bytes, its tag and its length.
    const std::size_t size = steps[taken].ByteSizeLong();
    const std::size_t share = size + 1 + google::protobuf::io::CodedOutputStream::VarintSize64(size);
    if (taken > 0 && bytes + share > max_bytes) break;
    bytes += share;
    *resp.add_steps() = std::move(steps[taken]);
  }
  if (steps.size() > taken) {
    const v1::StepRecord& last = resp.steps(resp.steps_size() - 1);
    resp.set_next_page_token(EncodeStepToken(last.step(), last.rank()));
  }
  return resp;
}

base::StatusOr<std::vector<std::optional<double>>> PageWindowMeans(Store& store, const RunRegistry& registry,
                                                                   const std::string& run,
                                                                   const v1::GetStepsResponse& page) {
  std::vector<std::optional<double>> means;
  if (page.steps_size() == 0) return means;
  GAC_ASSIGN_OR_RETURN(v1::RunInfo info, store.GetRun(run));
  const auto read = [&store, &run](std::uint32_t rank, std::int64_t start, std::int64_t end,
                                   const std::function<void(const v1::StepRecord&)>& visit) -> base::Status {
    StepQuery q;
    q.run = run;
    q.start_step = start;
    q.end_step = end;
    q.rank = rank;
    q.limit = kStepPages.max_size;
    for (;;) {
      GAC_ASSIGN_OR_RETURN(std::vector<v1::StepRecord> records, store.GetSteps(q));
      for (const v1::StepRecord& r : records) visit(r);
      if (records.size() < q.limit) return base::Status::Ok();
      q.after = std::make_pair(records.back().step(), records.back().rank());
    }
  };
  proto::StepWindowMeans windows(proto::ListingWindow(registry.Get(run)), info.first_step(), read);
  return windows.Next(page.steps());
}

v1::RunSummary SummarizeRun(const v1::RunInfo& info, const v1::RunConfig& config,
                            const std::vector<v1::StepRecord>& steps) {
  v1::RunSummary summary;
  *summary.mutable_info() = info;
  *summary.mutable_info()->mutable_config() = config;
  auto& counts = *summary.mutable_steps_by_regime();
  for (controller::Regime r : controller::kAllRegimes) counts[controller::RegimeName(r)] = 0;
  std::vector<double> cosines;
  cosines.reserve(steps.size());
  for (const v1::StepRecord& r : steps) {
    if (base::StatusOr<controller::Regime> regime = proto::FromProto(r.regime()); regime.ok()) ++counts[controller::RegimeName(*regime)];
    if (r.has_cosine()) cosines.push_back(r.cosine());
  }
  const controller::CalibrationStats cal = controller::ComputeCalibration(cosines, config.thresholds().c_low());
  v1::CalibrationSummary* out = summary.mutable_calibration();
  out->set_count(cal.count);
  out->set_q90(cal.q90);
  out->set_max(cal.max);
  out->set_mean(cal.mean);
  out->set_fraction_le_c_low(cal.frac_le_c_low);
  if (base::StatusOr<controller::Thresholds> suggested = controller::SuggestThresholds(cal); suggested.ok()) {
    out->mutable_suggested()->set_c_low(suggested->c_low);
    out->mutable_suggested()->set_c_high(suggested->c_high);
    out->mutable_suggested()->set_alpha_mode(config.thresholds().alpha_mode());
  }
  if (!steps.empty()) *summary.mutable_latest() = steps.back();
  return summary;
}

base::StatusOr<v1::RunSummary> GetRunSummary(Store& store, const RunRegistry& registry, const std::string& run,
                                       std::uint32_t window) {
  auto info = store.GetRun(run);
  if (!info.ok() && info.status().code() != base::StatusCode::kNotFound) return info.status();
  if (!info.ok()) return base::Status::NotFound("unknown run '" + run + "'");
  GAC_ASSIGN_OR_RETURN(auto steps, store.GetRecentSteps(run, 0, window));
  return SummarizeRun(*info, registry.Get(run), steps);
}

base::StatusOr<v1::ListConfigChangesResponse> ListConfigChangesPage(Store& store,
                                                              const v1::ListConfigChangesRequest& request) {
  GAC_RETURN_IF_ERROR(ValidateRunId(request.run()));
  GAC_ASSIGN_OR_RETURN(std::uint64_t offset, DecodeOffsetToken(request.page_token()));
  GAC_ASSIGN_OR_RETURN(std::uint32_t limit, PageSize(request.page_size(), kConfigChangePages));
  GAC_ASSIGN_OR_RETURN(auto changes, store.ListConfigChanges(request.run(), offset, limit + 1));
  v1::ListConfigChangesResponse resp;
  for (std::size_t i = 0; i < changes.size() && i < limit; ++i) *resp.add_changes() = changes[i];
  if (changes.size() > limit) resp.set_next_page_token(EncodeOffsetToken(offset + limit));
  return resp;
}

}  // namespace gac::server
