// The pieces the commands share: the Context, and the parsing and wording
// that more than one command uses.
#include "cli/src/commands.h"

#include <sstream>

#include "gac/controller/calibration.h"
#include "gac/proto/convert.h"
#include "gac/proto/wire_rules.h"

namespace gac::cli {

GacdClient& Context::client() {
  if (!client_) client_ = std::make_unique<GacdClient>(connection_);
  return *client_;
}

std::int64_t Context::NowNs() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(env_.now().time_since_epoch()).count();
}

void Context::Progress(const std::string& line) {
  if (!env_.progress) return;
  err_ << "\r" << line << "\033[K" << std::flush;
  progress_shown_ = true;
}

void Context::EndProgress() {
  if (!progress_shown_) return;
  err_ << "\r\033[K" << std::flush;
  progress_shown_ = false;
}

base::Status Interrupted() { return base::Status::Cancelled("interrupted"); }

base::StatusOr<Format> FormatFlag(const ParsedFlags& flags) {
  const std::string* f = flags.Get("format");
  if (f == nullptr) return Format::kTable;
  base::StatusOr<Format> format = ParseFormat(*f);
  if (!format.ok()) return base::Status::InvalidArgument("--format: " + format.status().message());
  return format;
}

std::string SettingsText(const v1::RunConfig& config) {
  std::string text = "c_low " + FormatExact(config.thresholds().c_low()) + ", c_high " +
                     FormatExact(config.thresholds().c_high()) + ", alpha " +
                     proto::EnumName(config.thresholds().alpha_mode()) + ", mode " + proto::EnumName(config.mode());
  if (config.trigger() == v1::TRIGGER_WINDOW) {
    const v1::Thresholds& w = config.has_window_thresholds() ? config.window_thresholds() : config.thresholds();
    text += ", trigger window of " + std::to_string(proto::WindowFromProto(config.window())) + " steps (c_low " +
            FormatExact(w.c_low()) + ", c_high " + FormatExact(w.c_high()) + ")";
  }
  if (config.has_spike()) text += ", spike guard " + SpikeText(config);
  return text;
}

std::string SpikeText(const v1::RunConfig& config) {
  base::StatusOr<controller::SpikeSettings> s = proto::SpikeFromProto(config.spike());
  if (!config.has_spike() || !s.ok() || !s->enabled()) return "off";
  std::string text;
  if (s->max_grad_norm > 0) text = "|g| > " + FormatExact(s->max_grad_norm);
  if (s->zscore) {
    text += std::string(text.empty() ? "" : " or ") + "z > " + FormatExact(s->sigma) + " over " +
            std::to_string(s->window) + " steps (after " + std::to_string(s->effective_warmup()) + ")";
  }
  return text;
}

std::string Percent(double fraction) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  s << fraction * 100.0 << " %";
  return s.str();
}

std::string NoSuggestionReason(const v1::CalibrationSummary& calibration) {
  controller::CalibrationStats stats;
  stats.count = calibration.count();
  stats.q90 = calibration.q90();
  stats.max = calibration.max();
  base::StatusOr<controller::Thresholds> suggested = controller::SuggestThresholds(stats);
  return suggested.ok() ? "gacd made no suggestion" : suggested.status().message();
}

std::vector<FlagSpec> StepRangeFlagSpecs() {
  return {
      {"start-step", "N", "first step (default 0)"},
      {"end-step", "N", "the step after the last one: [start, end) (default: to the latest)"},
      DeprecatedFlag("from", "N", "use --start-step"),
      DeprecatedFlag("to", "N", "use --end-step N+1 (--to is inclusive)"),
  };
}

base::Status StepRangeFlags(const ParsedFlags& flags, std::int64_t* start, std::int64_t* end) {
  if (flags.Has("start-step") && flags.Has("from")) {
    return base::Status::InvalidArgument("give --start-step or its former name --from, not both");
  }
  if (flags.Has("end-step") && flags.Has("to")) {
    return base::Status::InvalidArgument("give --end-step or --to, not both");
  }
  GAC_ASSIGN_OR_RETURN(auto s, OptionalInt(flags, flags.Has("from") ? "from" : "start-step", 0, INT64_MAX - 1));
  GAC_ASSIGN_OR_RETURN(auto e, OptionalInt(flags, "end-step", 1, INT64_MAX));
  GAC_ASSIGN_OR_RETURN(auto t, OptionalInt(flags, "to", 0, INT64_MAX - 1));
  *start = s.value_or(0);
  *end = 0;
  if (e) {
    if (*e <= *start) {
      return base::Status::InvalidArgument("--end-step " + std::to_string(*e) + " is not above --start-step " +
                                     std::to_string(*start) + " (the range is [start, end))");
    }
    *end = *e;
  } else if (t) {
    if (*t < *start) {
      return base::Status::InvalidArgument("--to " + std::to_string(*t) + " is below --from " + std::to_string(*start));
    }
    *end = *t + 1;
  }
  return base::Status::Ok();
}

}  // namespace gac::cli
