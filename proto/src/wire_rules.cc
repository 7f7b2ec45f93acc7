#include "gac/proto/wire_rules.h"

#include <string>

namespace gac::proto {
namespace {

template <typename Enum, std::size_t N>
base::StatusOr<Enum> ParseName(std::string_view what, std::string_view name, const Enum (&values)[N],
                         const char* expected) {
  for (Enum v : values) {
    if (name == EnumName(v)) return v;
  }
  return base::Status::InvalidArgument("unknown " + std::string(what) + " '" + std::string(name) + "' (expected " +
                                 expected + ")");
}

}  // namespace

bool IsRunIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == ':' || c == '/' || c == '-';
}

base::Status CheckRunId(std::string_view run) {
  if (run.empty()) return base::Status::InvalidArgument("run id is empty");
  if (run.size() > kMaxRunIdLength) {
    return base::Status::InvalidArgument("run id longer than " + std::to_string(kMaxRunIdLength) + " characters");
  }
  for (char c : run) {
    if (!IsRunIdChar(c)) {
      return base::Status::InvalidArgument("run id may contain only [A-Za-z0-9._:/-], got '" + std::string(run) + "'");
    }
  }
  return base::Status::Ok();
}

base::Status CheckName(std::string_view what, std::string_view name) {
  if (name.empty()) return base::Status::InvalidArgument(std::string(what) + " is empty");
  if (name.size() > kMaxNameLength) {
    return base::Status::InvalidArgument(std::string(what) + " longer than " + std::to_string(kMaxNameLength) +
                                   " characters");
  }
  for (char c : name) {
    if (c < 0x20 || c > 0x7e) return base::Status::InvalidArgument(std::string(what) + " must be printable ASCII");
  }
  return base::Status::Ok();
}

const char* EnumName(v1::Regime regime) {
  switch (regime) {
    case v1::REGIME_SAFE: return "safe";
    case v1::REGIME_PROJECT: return "project";
    case v1::REGIME_SKIP: return "skip";
    case v1::REGIME_INVALID: return "invalid";
    case v1::REGIME_SPIKE: return "spike";
    default: return kUnknownName;
  }
}

const char* EnumName(v1::ControlMode mode) {
  switch (mode) {
    case v1::CONTROL_MODE_UNSPECIFIED:
    case v1::CONTROL_MODE_MONITOR: return "monitor";
    case v1::CONTROL_MODE_LOCAL: return "local";
    case v1::CONTROL_MODE_REMOTE: return "remote";
    default: return kUnknownName;
  }
}

const char* EnumName(v1::AlphaMode mode) {
  switch (mode) {
    case v1::ALPHA_MODE_UNSPECIFIED:
    case v1::ALPHA_MODE_PAPER: return "paper";
    case v1::ALPHA_MODE_EXACT: return "exact";
    default: return kUnknownName;
  }
}

const char* EnumName(v1::Trigger trigger) {
  switch (trigger) {
    case v1::TRIGGER_UNSPECIFIED:
    case v1::TRIGGER_PER_STEP: return "per_step";
    case v1::TRIGGER_WINDOW: return "window";
    default: return kUnknownName;
  }
}

bool ModeApplies(v1::ControlMode mode) {
  return mode == v1::CONTROL_MODE_LOCAL || mode == v1::CONTROL_MODE_REMOTE;
}

const char* RegimeInModeName(v1::Regime regime, v1::ControlMode mode) {
  if (!ModeApplies(mode) && v1::ControlMode_IsValid(mode)) {
    if (regime == v1::REGIME_PROJECT) return "would project";
    if (regime == v1::REGIME_SKIP) return "would skip";
    if (regime == v1::REGIME_SPIKE) return "would skip (spike)";
  }
  return EnumName(regime);
}

base::StatusOr<v1::Regime> ParseRegimeName(std::string_view name) {
  return ParseName("regime", name, kKnownRegimes, "safe, project, skip, invalid or spike");
}

base::StatusOr<v1::ControlMode> ParseControlModeName(std::string_view name) {
  static constexpr v1::ControlMode kModes[] = {v1::CONTROL_MODE_MONITOR, v1::CONTROL_MODE_LOCAL,
                                               v1::CONTROL_MODE_REMOTE};
  return ParseName("mode", name, kModes, "monitor, local or remote");
}

base::StatusOr<v1::AlphaMode> ParseAlphaModeName(std::string_view name) {
  static constexpr v1::AlphaMode kModes[] = {v1::ALPHA_MODE_PAPER, v1::ALPHA_MODE_EXACT};
  return ParseName("alpha mode", name, kModes, "paper or exact");
}

base::StatusOr<v1::Trigger> ParseTriggerName(std::string_view name) {
  static constexpr v1::Trigger kTriggers[] = {v1::TRIGGER_PER_STEP, v1::TRIGGER_WINDOW};
  return ParseName("trigger", name, kTriggers, "per_step or window");
}

}  // namespace gac::proto
