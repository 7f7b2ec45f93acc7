#include "server/src/http/api.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <limits>
#include <memory>
#include <optional>

#include "gac/base/mutex.h"
#include "gac/proto/convert.h"
#include "gac/proto/record_schema.h"
#include "gac/proto/wire_rules.h"
#include "server/src/http/json.h"
#include "server/src/metrics.h"
#include "server/src/queries.h"
#include "server/src/validate.h"
#include "web/latest_step.h"

namespace gac::server {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

constexpr std::string_view kRunsPath = "/api/v1/runs";

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

base::StatusOr<std::string> PercentDecode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '+') {
      out.push_back(' ');
    } else if (c != '%') {
      out.push_back(c);
    } else {
      const bool complete = i + 2 < text.size();
      const int hi = complete ? HexDigit(text[i + 1]) : -1;
      const int lo = complete ? HexDigit(text[i + 2]) : -1;
      if (hi < 0 || lo < 0) {
        return base::Status::InvalidArgument("malformed query string: bad escape at '" +
                                       std::string(text.substr(i, 3)) + "'");
      }
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    }
  }
  return out;
}

// A decimal integer in [0, max] without sign or spaces. Values above `max`
// that are still digits report "above the maximum" so that a huge page size
// reads as what it is.
base::StatusOr<std::uint64_t> ParseUnsigned(std::string_view name, const std::string& text, std::uint64_t max) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
    return base::Status::InvalidArgument(std::string(name) + ": expected a non-negative integer, got '" + text + "'");
  }
  const auto above = [&] {
    return base::Status::InvalidArgument(std::string(name) + " " + text + " above the maximum " + std::to_string(max));
  };
  std::uint64_t value = 0;
  for (char c : text) {
    const auto digit = static_cast<std::uint64_t>(c - '0');
    if (digit > max || value > (max - digit) / 10) return above();
    value = value * 10 + digit;
  }
  return value;
}

base::StatusOr<bool> ParseFlag(std::string_view name, const std::string& text) {
  if (text == "1" || text == "true") return true;
  if (text == "0" || text == "false") return false;
  return base::Status::InvalidArgument(std::string(name) + ": expected true or false (1 or 0), got '" + text + "'");
}

// Parameter `name` as a page size of `limits` (0 = the default, as page_size 0).
base::StatusOr<std::uint32_t> ParseLimit(std::string_view name, const std::string& text, PageLimits limits) {
  GAC_ASSIGN_OR_RETURN(std::uint64_t n, ParseUnsigned(name, text, limits.max_size));
  return static_cast<std::uint32_t>(n);
}

constexpr std::int64_t kMaxStep = std::numeric_limits<std::int64_t>::max();

// A deprecated query parameter and the name it stands for.
struct Alias {
  std::string_view old_name;
  std::string_view name;
};
constexpr Alias kAliases[] = {{"from", "start_step"}, {"to", "end_step"}, {"limit", "page_size"}};

// Notes each deprecated alias in `params` in `deprecated` (when not null);
// InvalidArgument when a name and its alias are both given. Errors about a
// value name the parameter as it was given.
base::Status CheckAliases(const std::vector<std::pair<std::string, std::string>>* params,
                      std::vector<std::string>* deprecated) {
  for (const Alias& alias : kAliases) {
    bool have_name = false, have_alias = false;
    for (const auto& [name, unused] : *params) {
      have_name = have_name || name == alias.name;
      have_alias = have_alias || name == alias.old_name;
    }
    if (!have_alias) continue;
    if (have_name) {
      return base::Status::InvalidArgument("parameter '" + std::string(alias.name) + "' given twice (also as its alias '" +
                                     std::string(alias.old_name) + "')");
    }
    if (deprecated != nullptr) {
      deprecated->push_back("'" + std::string(alias.old_name) + "' is deprecated: use '" + std::string(alias.name) +
                            "'");
    }
  }
  return base::Status::Ok();
}

// True when parameter `given` is `name` or its deprecated alias.
bool Names(std::string_view given, std::string_view name) {
  if (given == name) return true;
  for (const Alias& alias : kAliases) {
    if (alias.name == name && given == alias.old_name) return true;
  }
  return false;
}

// ------------------------------------------------------------ encoding

void WriteOptionalDouble(JsonWriter& w, std::string_view key, bool has, double value) {
  w.Key(key);
  if (has) {
    w.Double(value);
  } else {
    w.Null();
  }
}

void WriteThresholds(JsonWriter& w, const v1::Thresholds& t) {
  w.BeginObject();
  w.Key("c_low");
  w.Double(t.c_low());
  w.Key("c_high");
  w.Double(t.c_high());
  w.Key("alpha_mode");
  w.String(proto::EnumName(t.alpha_mode()));
  w.EndObject();
}

void WriteRunConfig(JsonWriter& w, const v1::RunConfig& c) {
  w.BeginObject();
  w.Key("thresholds");
  WriteThresholds(w, c.thresholds());
  w.Key("mode");
  w.String(proto::EnumName(c.mode()));
  w.Key("trigger");
  w.String(proto::EnumName(c.trigger()));
  w.Key("window");
  w.Uint(static_cast<std::uint64_t>(proto::WindowFromProto(c.window())));
  w.Key("window_thresholds");
  WriteThresholds(w, c.has_window_thresholds() ? c.window_thresholds() : c.thresholds());
  // The spike guard: null when off; its z-score's settings null when that is off.
  w.Key("spike");
  base::StatusOr<controller::SpikeSettings> spike = proto::SpikeFromProto(c.spike());
  if (!c.has_spike() || !spike.ok() || !spike->enabled()) {
    w.Null();
  } else {
    w.BeginObject();
    w.Key("max_grad_norm");
    w.Double(spike->max_grad_norm);
    w.Key("sigma");
    spike->zscore ? w.Double(spike->sigma) : w.Null();
    w.Key("window");
    spike->zscore ? w.Uint(static_cast<std::uint64_t>(spike->window)) : w.Null();
    w.Key("warmup");
    spike->zscore ? w.Uint(static_cast<std::uint64_t>(spike->effective_warmup())) : w.Null();
    w.EndObject();
  }
  w.Key("version");
  w.Uint(c.version());
  w.Key("updated_ns");
  w.IntString(c.updated_ns());
  w.Key("updated_by");
  w.String(c.updated_by());
  w.EndObject();
}

void WriteRunInfo(JsonWriter& w, const v1::RunInfo& info) {
  w.BeginObject();
  w.Key("run");
  w.String(info.run());
  w.Key("first_step");
  w.Int(info.first_step());
  w.Key("last_step");
  w.Int(info.last_step());
  w.Key("step_records");
  w.Uint(info.step_records());
  w.Key("first_seen_ns");
  w.IntString(info.first_seen_ns());
  w.Key("last_seen_ns");
  w.IntString(info.last_seen_ns());
  w.Key("world_size");
  w.Uint(info.world_size());
  // What the regimes of the run's steps mean: applied decisions (local,
  // remote) or, in monitor mode, what GAC would have done.
  w.Key("steps_mode");
  w.String(proto::EnumName(info.steps_mode()));
  w.Key("decisions_applied");
  w.Bool(proto::ModeApplies(info.steps_mode()));
  w.Key("config");
  WriteRunConfig(w, info.config());
  w.EndObject();
}

// A record field as the schema types it: enums by name, wide integers as
// decimal strings, absent optional fields as null.
void WriteField(JsonWriter& w, const proto::StepField& field, const v1::StepRecord& r) {
  const proto::FieldValue v = field.get(r);
  w.Key(field.name);
  if (!v.present) {
    w.Null();
    return;
  }
  switch (field.type) {
    case proto::FieldType::kReal:
      w.Double(v.real);
      return;
    case proto::FieldType::kEnum:
      w.String(field.enum_name(v.integer));
      return;
    case proto::FieldType::kBool:
      w.Bool(v.integer != 0);
      return;
    case proto::FieldType::kInteger:
    case proto::FieldType::kText:
      if (field.json_string) {
        w.IntString(v.integer);
      } else {
        w.Int(v.integer);
      }
      return;
  }
}

const char* FieldTypeName(proto::FieldType type) {
  switch (type) {
    case proto::FieldType::kInteger: return "integer";
    case proto::FieldType::kReal: return "real";
    case proto::FieldType::kText: return "text";
    case proto::FieldType::kBool: return "bool";
    case proto::FieldType::kEnum: return "enum";
  }
  return "unknown";
}

void WriteLayers(JsonWriter& w, const v1::StepRecord& r) {
  w.Key("layers");
  w.BeginArray();
  for (const v1::LayerRecord& l : r.layers()) {
    w.BeginObject();
    w.Key("name");
    w.String(l.name());
    WriteOptionalDouble(w, "cosine", l.has_cosine(), l.cosine());
    w.Key("grad_norm");
    w.Double(l.grad_norm());
    w.Key("ref_norm");
    w.Double(l.ref_norm());
    w.EndObject();
  }
  w.EndArray();
}

// A step: run, the schema's fields (record_schema.h) in order, window_mean
// (when `window_mean` is given: m_t, null while absent), scalars, layers
// (when asked).
void WriteStep(JsonWriter& w, const v1::StepRecord& r, bool with_layers,
               const std::optional<double>* window_mean = nullptr) {
  w.BeginObject();
  w.Key("run");
  w.String(r.run());
  for (const proto::StepField& field : proto::kStepFields) WriteField(w, field, r);
  if (window_mean != nullptr) WriteOptionalDouble(w, "window_mean", window_mean->has_value(), window_mean->value_or(0.0));
  w.Key("scalars");
  w.BeginObject();
  for (const auto& [name, value] : r.scalars()) {
    w.Key(name);
    w.Double(value);
  }
  w.EndObject();
  if (with_layers) WriteLayers(w, r);
  w.EndObject();
}

// ------------------------------------------------------------ PUT body

const char* KindName(const Value& v) {
  switch (v.kind_case()) {
    case Value::kNullValue: return "null";
    case Value::kNumberValue: return "a number";
    case Value::kStringValue: return "a string";
    case Value::kBoolValue: return "a boolean";
    case Value::kStructValue: return "an object";
    case Value::kListValue: return "an array";
    default: return "nothing";
  }
}

base::Status WrongType(std::string_view field, const char* expected, const Value& v) {
  return base::Status::InvalidArgument(std::string(field) + ": expected " + expected + ", got " + KindName(v));
}

base::StatusOr<double> NumberField(std::string_view field, const Value& v) {
  if (v.kind_case() != Value::kNumberValue) return WrongType(field, "a number", v);
  return v.number_value();
}

base::StatusOr<std::string> StringField(std::string_view field, const Value& v) {
  if (v.kind_case() != Value::kStringValue) return WrongType(field, "a string", v);
  return v.string_value();
}

base::Status ParseThresholdsObject(const Value& v, v1::Thresholds* out) {
  if (v.kind_case() != Value::kStructValue) return WrongType("thresholds", "an object", v);
  bool have_low = false, have_high = false;
  for (const auto& [key, member] : v.struct_value().fields()) {
    if (key == "c_low" || key == "c_high") {
      GAC_ASSIGN_OR_RETURN(double x, NumberField("thresholds." + key, member));
      if (key == "c_low") {
        out->set_c_low(x);
        have_low = true;
      } else {
        out->set_c_high(x);
        have_high = true;
      }
    } else if (key == "alpha_mode") {
      GAC_ASSIGN_OR_RETURN(std::string name, StringField("thresholds.alpha_mode", member));
      base::StatusOr<v1::AlphaMode> mode = proto::ParseAlphaModeName(name);
      if (!mode.ok()) return mode.status().WithPrefix("thresholds.alpha_mode");
      out->set_alpha_mode(*mode);
    } else {
      return base::Status::InvalidArgument("thresholds: unknown member '" + key + "' (expected c_low, c_high, alpha_mode)");
    }
  }
  if (!have_low || !have_high) return base::Status::InvalidArgument("thresholds: c_low and c_high are required");
  if (out->alpha_mode() == v1::ALPHA_MODE_UNSPECIFIED) out->set_alpha_mode(v1::ALPHA_MODE_PAPER);
  return base::Status::Ok();
}

// The spike guard of a PUT config: null or {} turns it off; "max_grad_norm"
// is the bound on |g|, and any of "sigma", "window", "warmup" turns the
// z-score on (the others keep their defaults). Validated as the controller
// does.
base::Status ParseSpikeObject(const Value& v, v1::SpikeGuard* out) {
  out->Clear();
  if (v.kind_case() == Value::kNullValue) return base::Status::Ok();
  if (v.kind_case() != Value::kStructValue) return WrongType("spike", "an object or null", v);
  for (const auto& [key, member] : v.struct_value().fields()) {
    if (key != "max_grad_norm" && key != "sigma" && key != "window" && key != "warmup") {
      return base::Status::InvalidArgument("spike: unknown member '" + key +
                                           "' (expected max_grad_norm, sigma, window, warmup)");
    }
    GAC_ASSIGN_OR_RETURN(double x, NumberField("spike." + key, member));
    if (key == "max_grad_norm") {
      out->set_max_grad_norm(x);
      continue;
    }
    out->set_zscore(true);
    if (key == "sigma") {
      out->set_sigma(x);
    } else if (!(x >= 0 && x <= controller::kMaxSpikeWindow) || std::floor(x) != x) {
      return base::Status::InvalidArgument("spike." + key + ": expected an integer from 0 to " +
                                           std::to_string(controller::kMaxSpikeWindow));
    } else if (key == "window") {
      out->set_window(static_cast<std::uint32_t>(x));
    } else {
      out->set_warmup(static_cast<std::uint32_t>(x));
    }
  }
  // A sigma of 0 would read as the default: refused here as the controller refuses it.
  if (out->zscore() && v.struct_value().fields().count("sigma") != 0 && !(out->sigma() > 0)) {
    return base::Status::InvalidArgument("spike.sigma must be finite and > 0, got " + std::to_string(out->sigma()));
  }
  base::StatusOr<controller::SpikeSettings> s = proto::SpikeFromProto(*out);
  if (!s.ok()) return s.status().WithPrefix("spike");
  return base::Status::Ok();
}

// ------------------------------------------------------------ routes

const char* MethodName(ApiRoute::Kind kind, std::string_view http_method) {
  const bool get = http_method == "GET";
  switch (kind) {
    case ApiRoute::kRuns: return get ? "ListRuns" : nullptr;
    case ApiRoute::kSummary: return get ? "GetRunSummary" : nullptr;
    case ApiRoute::kSteps: return get ? "GetSteps" : nullptr;
    case ApiRoute::kConfig: return get ? "GetRunConfig" : http_method == "PUT" ? "SetRunConfig" : nullptr;
    case ApiRoute::kFields: return get ? "GetStepFields" : nullptr;
  }
  return nullptr;
}

const char* AllowedMethods(ApiRoute::Kind kind) { return kind == ApiRoute::kConfig ? "GET, PUT" : "GET"; }

HttpResponse ErrorResponse(const base::Status& status) {
  HttpResponse resp;
  resp.status = proto::ToHttpStatus(status.code());
  resp.body = EncodeError(status);
  if (status.IsUnauthenticated()) resp.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"gacd\"");
  return resp;
}

// Counts the request as an open call of the Core (shutdown waits for those).
class OpenCall {
 public:
  explicit OpenCall(Core* core) : core_(core) { core_->CallStarted(); }
  ~OpenCall() { core_->CallFinished(); }
  OpenCall(const OpenCall&) = delete;
  OpenCall& operator=(const OpenCall&) = delete;

 private:
  Core* core_;
};

// Where a settings change's result arrives (on the writer's thread).
struct ConfigResult {
  base::Mutex mu;
  base::CondVar cv;
  std::optional<base::StatusOr<v1::RunConfig>> result GAC_GUARDED_BY(mu);
};

}  // namespace

base::StatusOr<ApiRoute> ParseApiRoute(std::string_view method, std::string_view path) {
  ApiRoute route;
  if (path == kRunsPath || path == "/api/v1/runs/") {
    route.kind = ApiRoute::kRuns;
  } else if (path == "/api/v1/fields") {
    route.kind = ApiRoute::kFields;
  } else if (path.size() > kRunsPath.size() + 1 && path.substr(0, kRunsPath.size() + 1) == "/api/v1/runs/") {
    std::string_view rest = path.substr(kRunsPath.size() + 1);
    route.kind = ApiRoute::kSummary;
    for (const auto& [suffix, kind] : {std::pair<std::string_view, ApiRoute::Kind>{"/steps", ApiRoute::kSteps},
                                       {"/config", ApiRoute::kConfig},
                                       {"/summary", ApiRoute::kSummary}}) {
      if (rest.size() > suffix.size() && EndsWith(rest, suffix)) {
        route.kind = kind;
        rest.remove_suffix(suffix.size());
        break;
      }
    }
    GAC_RETURN_IF_ERROR(ValidateRunId(rest));
    route.run = std::string(rest);
  } else {
    return base::Status::NotFound("no such endpoint: " + std::string(path) +
                            " (see /api/v1/runs, /api/v1/runs/{run}, .../steps, .../config, /api/v1/fields)");
  }
  route.method = MethodName(route.kind, method);
  if (route.method == nullptr) {
    return base::Status::Unimplemented("method " + std::string(method) + " is not allowed on " + std::string(path) +
                                 " (allowed: " + AllowedMethods(route.kind) + ")");
  }
  return route;
}

base::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseQueryString(
    std::string_view query, const std::vector<std::string_view>& allowed) {
  std::vector<std::pair<std::string, std::string>> params;
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view part = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (part.empty()) continue;  // "a=1&&b=2"
    const std::size_t eq = part.find('=');
    GAC_ASSIGN_OR_RETURN(std::string name, PercentDecode(part.substr(0, eq)));
    base::StatusOr<std::string> value =
        PercentDecode(eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1));
    if (!value.ok()) return value.status();
    if (name.empty()) return base::Status::InvalidArgument("malformed query string: a parameter without a name");
    bool known = false;
    for (std::string_view a : allowed) known = known || a == name;
    if (!known) {
      std::string list;
      for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      return base::Status::InvalidArgument("unknown parameter '" + name + "' (expected " +
                                     (list.empty() ? std::string("none") : list) + ")");
    }
    for (const auto& [seen, unused] : params) {
      if (seen == name) return base::Status::InvalidArgument("parameter '" + name + "' given twice");
    }
    params.emplace_back(std::move(name), std::move(*value));
  }
  return params;
}

base::StatusOr<v1::ListRunsRequest> ParseRunsParams(std::string_view query, std::vector<std::string>* deprecated) {
  GAC_ASSIGN_OR_RETURN(auto params, ParseQueryString(query, {"page_size", "page_token", "limit"}));
  GAC_RETURN_IF_ERROR(CheckAliases(&params, deprecated));
  v1::ListRunsRequest req;
  for (const auto& [name, value] : params) {
    if (Names(name, "page_size")) {
      GAC_ASSIGN_OR_RETURN(std::uint32_t n, ParseLimit(name, value, kRunPages));
      req.set_page_size(n);
    } else {
      req.set_page_token(value);
    }
  }
  GAC_RETURN_IF_ERROR(DecodeRunToken(req.page_token()).status());
  return req;
}

base::StatusOr<v1::GetRunSummaryRequest> ParseSummaryParams(const std::string& run, std::string_view query) {
  GAC_ASSIGN_OR_RETURN(auto params, ParseQueryString(query, {"window"}));
  v1::GetRunSummaryRequest req;
  req.set_run(run);
  for (const auto& [name, value] : params) {
    GAC_ASSIGN_OR_RETURN(std::uint64_t n, ParseUnsigned("window", value, std::numeric_limits<std::uint32_t>::max()));
    req.set_window(static_cast<std::uint32_t>(n));
  }
  return req;
}

base::StatusOr<v1::GetStepsRequest> ParseStepsParams(const std::string& run, std::string_view query,
                                               std::vector<std::string>* deprecated) {
  auto params = ParseQueryString(
      query, {"start_step", "end_step", "rank", "layers", "page_size", "page_token", "from", "to", "limit"});
  if (!params.ok()) return params.status();
  GAC_RETURN_IF_ERROR(CheckAliases(&*params, deprecated));
  v1::GetStepsRequest req;
  req.set_run(run);
  bool have_to = false;
  for (const auto& [name, value] : *params) {
    if (Names(name, "start_step") || Names(name, "end_step")) {
      GAC_ASSIGN_OR_RETURN(std::uint64_t n, ParseUnsigned(name, value, kMaxStep));
      if (Names(name, "start_step")) {
        req.set_start_step(static_cast<std::int64_t>(n));
      } else {
        req.set_end_step(static_cast<std::int64_t>(n));
        have_to = true;
      }
    } else if (name == "rank") {
      GAC_ASSIGN_OR_RETURN(std::uint64_t n, ParseUnsigned(name, value, std::numeric_limits<std::uint32_t>::max()));
      req.set_rank(static_cast<std::uint32_t>(n));
    } else if (name == "layers") {
      GAC_ASSIGN_OR_RETURN(bool b, ParseFlag(name, value));
      req.set_include_layers(b);
    } else if (Names(name, "page_size")) {
      GAC_ASSIGN_OR_RETURN(std::uint32_t n, ParseLimit(name, value, kStepPages));
      req.set_page_size(n);
    } else {
      req.set_page_token(value);
    }
  }
  // GetSteps reads end_step 0 as "no limit"; over HTTP end_step is always a bound.
  if (have_to && req.end_step() <= req.start_step()) {
    return base::Status::InvalidArgument("end_step must be above start_step (end_step is exclusive)");
  }
  GAC_RETURN_IF_ERROR(StepQueryFromRequest(req).status());
  return req;
}

base::StatusOr<v1::SetRunConfigRequest> ParseConfigBody(const std::string& run, std::string_view body) {
  Struct doc;
  google::protobuf::util::JsonParseOptions options;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(body.data(), body.size()), &doc, options);
  if (!parsed.ok()) {
    return base::Status::InvalidArgument("body is not a JSON object: " + std::string(parsed.message()));
  }
  v1::SetRunConfigRequest req;
  req.set_run(run);
  bool have_thresholds = false, have_mode = false;
  for (const auto& [key, v] : doc.fields()) {
    if (key == "thresholds") {
      GAC_RETURN_IF_ERROR(ParseThresholdsObject(v, req.mutable_thresholds()));
      have_thresholds = true;
    } else if (key == "mode") {
      GAC_ASSIGN_OR_RETURN(std::string name, StringField("mode", v));
      base::StatusOr<v1::ControlMode> mode = proto::ParseControlModeName(name);
      if (!mode.ok()) return mode.status().WithPrefix("mode");
      req.set_mode(*mode);
      have_mode = true;
    } else if (key == "window_thresholds") {
      GAC_RETURN_IF_ERROR(ParseThresholdsObject(v, req.mutable_window_thresholds()).WithPrefix("window"));
    } else if (key == "spike") {
      GAC_RETURN_IF_ERROR(ParseSpikeObject(v, req.mutable_spike()));
    } else if (key == "trigger") {
      GAC_ASSIGN_OR_RETURN(std::string name, StringField("trigger", v));
      base::StatusOr<v1::Trigger> trigger = proto::ParseTriggerName(name);
      if (!trigger.ok()) return trigger.status().WithPrefix("trigger");
      req.set_trigger(*trigger);
    } else if (key == "window") {
      GAC_ASSIGN_OR_RETURN(double x, NumberField("window", v));
      if (!(x >= 1 && x <= controller::kMaxWindow) || std::floor(x) != x) {
        return base::Status::InvalidArgument("window: expected an integer from 1 to " +
                                             std::to_string(controller::kMaxWindow));
      }
      req.set_window(static_cast<std::uint32_t>(x));
    } else if (key == "reason") {
      GAC_ASSIGN_OR_RETURN(std::string reason, StringField("reason", v));
      req.set_reason(std::move(reason));
    } else if (key == "expected_version") {
      GAC_ASSIGN_OR_RETURN(double x, NumberField("expected_version", v));
      // Exact integers only: a double holds every integer up to 2^53.
      if (!(x >= 0 && x <= 9007199254740992.0) || std::floor(x) != x) {
        return base::Status::InvalidArgument("expected_version: expected a non-negative integer");
      }
      req.set_expected_version(static_cast<std::uint64_t>(x));
    } else {
      return base::Status::InvalidArgument("unknown member '" + key +
                                     "' (expected thresholds, mode, trigger, window, window_thresholds, spike, reason, "
                                     "expected_version)");
    }
  }
  if (!have_thresholds) return base::Status::InvalidArgument("thresholds are required");
  if (!have_mode) return base::Status::InvalidArgument("mode is required (monitor, local or remote)");
  return req;
}

std::string EncodeRunsPage(const v1::ListRunsResponse& page, std::int64_t now_ns) {
  std::string out;
  JsonWriter w(&out);
  w.BeginObject();
  w.Key("runs");
  w.BeginArray();
  for (const v1::RunInfo& info : page.runs()) WriteRunInfo(w, info);
  w.EndArray();
  w.Key("next_page_token");
  w.String(page.next_page_token());
  w.Key("server_time_ns");
  w.IntString(now_ns);
  w.EndObject();
  return out;
}

std::string EncodeSummary(const v1::RunSummary& summary, std::int64_t now_ns) {
  std::string out;
  JsonWriter w(&out);
  w.BeginObject();
  w.Key("info");
  WriteRunInfo(w, summary.info());
  w.Key("steps_by_regime");
  w.BeginObject();
  for (v1::Regime r : proto::kKnownRegimes) {
    const auto it = summary.steps_by_regime().find(proto::EnumName(r));
    w.Key(proto::EnumName(r));
    w.Uint(it == summary.steps_by_regime().end() ? 0 : it->second);
  }
  w.EndObject();
  // How a view names each count: "would skip" and "would project" in monitor mode.
  w.Key("regime_labels");
  w.BeginObject();
  for (v1::Regime r : proto::kKnownRegimes) {
    w.Key(proto::EnumName(r));
    w.String(proto::RegimeInModeName(r, summary.info().steps_mode()));
  }
  w.EndObject();
  const v1::CalibrationSummary& cal = summary.calibration();
  w.Key("calibration");
  w.BeginObject();
  w.Key("count");
  w.Uint(cal.count());
  w.Key("q90");
  w.Double(cal.q90());
  w.Key("max");
  w.Double(cal.max());
  w.Key("mean");
  w.Double(cal.mean());
  w.Key("fraction_le_c_low");
  w.Double(cal.fraction_le_c_low());
  w.Key("suggested");
  if (cal.has_suggested()) {
    WriteThresholds(w, cal.suggested());
  } else {
    w.Null();
  }
  w.EndObject();
  w.Key("latest");
  if (summary.has_latest()) {
    WriteStep(w, summary.latest(), /*with_layers=*/false);
  } else {
    w.Null();
  }
  w.Key("server_time_ns");
  w.IntString(now_ns);
  w.EndObject();
  return out;
}

std::string EncodeStepFields() {
  std::string out;
  JsonWriter w(&out);
  w.BeginObject();
  w.Key("fields");
  w.BeginArray();
  for (const proto::StepField& f : proto::kStepFields) {
    w.BeginObject();
    w.Key("name");
    w.String(f.name);
    w.Key("type");
    w.String(FieldTypeName(f.type));
    w.Key("optional");
    w.Bool(f.optional);
    w.Key("unit");
    w.String(f.unit);
    w.Key("help");
    w.String(f.help);
    w.Key("gauge");
    if (const char* gauge = FieldGaugeName(f.name)) {
      w.String(gauge);
    } else {
      w.Null();
    }
    w.Key("page");
    if (const web::LatestStepRow* row = web::FindLatestStepRow(f.name)) {
      w.BeginObject();
      w.Key("label");
      w.String(row->label);
      w.Key("digits");
      w.Int(row->digits);
      w.Key("place");
      w.Int(row->place);
      w.EndObject();
    } else {
      w.Null();
    }
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  return out;
}

std::string EncodeStepsPage(const std::string& run, const v1::GetStepsResponse& page, bool with_layers,
                            const std::vector<std::optional<double>>& window_means) {
  std::string out;
  // About 400 bytes a record without layers, 90 a layer.
  out.reserve(64 + static_cast<std::size_t>(page.steps_size()) * (with_layers ? 4096 : 448));
  JsonWriter w(&out);
  w.BeginObject();
  w.Key("run");
  w.String(run);
  w.Key("steps");
  w.BeginArray();
  for (int i = 0; i < page.steps_size(); ++i) {
    const std::size_t at = static_cast<std::size_t>(i);
    WriteStep(w, page.steps(i), with_layers, at < window_means.size() ? &window_means[at] : nullptr);
  }
  w.EndArray();
  w.Key("next_page_token");
  w.String(page.next_page_token());
  w.EndObject();
  return out;
}

std::string EncodeRunConfig(const std::string& run, const v1::RunConfig& config) {
  std::string out;
  JsonWriter w(&out);
  w.BeginObject();
  w.Key("run");
  w.String(run);
  w.Key("config");
  WriteRunConfig(w, config);
  w.EndObject();
  return out;
}

std::string EncodeError(const base::Status& status) {
  std::string out;
  JsonWriter w(&out);
  w.BeginObject();
  w.Key("code");
  w.String(base::StatusCodeName(status.code()));
  w.Key("message");
  w.String(status.message());
  w.EndObject();
  return out;
}

HttpApi::HttpApi(Core* core, bool enabled, std::string disabled_reason)
    : core_(core), enabled_(enabled), disabled_reason_(std::move(disabled_reason)) {}

HttpResponse HttpApi::Handle(const HttpRequest& request) {
  OpenCall call(core_);
  base::StatusOr<ApiRoute> route = ParseApiRoute(request.method, request.path);
  if (!route.ok()) {
    HttpResponse resp = ErrorResponse(route.status());
    if (route.status().IsUnimplemented()) {
      // A known resource, another method: 405 with the methods it takes.
      base::StatusOr<ApiRoute> get = ParseApiRoute("GET", request.path);
      resp.status = 405;
      if (get.ok()) resp.headers.emplace_back("Allow", AllowedMethods(get->kind));
    }
    core_->metrics().ObserveRpcError("http", base::StatusCodeName(route.status().code()));
    return resp;
  }
  std::vector<std::string> warnings;
  base::StatusOr<std::string> body =
      enabled_ ? Serve(request, *route, &warnings) : base::Status::PermissionDenied(disabled_reason_);
  if (!body.ok()) {
    core_->metrics().ObserveRpcError(std::string("http.") + route->method, base::StatusCodeName(body.status().code()));
    return ErrorResponse(body.status());
  }
  HttpResponse resp;
  resp.body = std::move(*body);
  resp.headers.emplace_back("Cache-Control", "no-store");
  // RFC 9111's Warning, code 299 ("miscellaneous persistent warning").
  for (const std::string& w : warnings) resp.headers.emplace_back("Warning", "299 - \"" + w + "\"");
  return resp;
}

base::StatusOr<std::string> HttpApi::Serve(const HttpRequest& request, const ApiRoute& route,
                                     std::vector<std::string>* warnings) {
  GAC_ASSIGN_OR_RETURN(const Principal* principal, core_->Authenticate(request.authorization));
  const Principal& p = *principal;
  if (route.kind != ApiRoute::kRuns && route.kind != ApiRoute::kFields) {
    const Right right = route.kind == ApiRoute::kConfig && request.method == "PUT" ? kAdmin : kRead;
    GAC_RETURN_IF_ERROR(Authenticator::Authorize(p, right, route.run));
  }
  switch (route.kind) {
    case ApiRoute::kRuns: {
      GAC_ASSIGN_OR_RETURN(v1::ListRunsRequest req, ParseRunsParams(request.query, warnings));
      GAC_ASSIGN_OR_RETURN(auto page, ListRunsPage(core_->store(), core_->registry(), p, req));
      return EncodeRunsPage(page, NowNs());
    }
    case ApiRoute::kSummary: {
      GAC_ASSIGN_OR_RETURN(v1::GetRunSummaryRequest req, ParseSummaryParams(route.run, request.query));
      GAC_ASSIGN_OR_RETURN(auto summary, GetRunSummary(core_->store(), core_->registry(), route.run, req.window()));
      return EncodeSummary(summary, NowNs());
    }
    case ApiRoute::kSteps: {
      GAC_ASSIGN_OR_RETURN(v1::GetStepsRequest req, ParseStepsParams(route.run, request.query, warnings));
      GAC_ASSIGN_OR_RETURN(StepQuery query, StepQueryFromRequest(req));
      GAC_ASSIGN_OR_RETURN(auto page, GetStepsPage(core_->store(), query));
      GAC_ASSIGN_OR_RETURN(auto means, PageWindowMeans(core_->store(), core_->registry(), route.run, page));
      return EncodeStepsPage(route.run, page, req.include_layers(), means);
    }
    case ApiRoute::kConfig:
      if (request.method == "PUT") return SetConfig(p, route.run, request.body);
      GAC_RETURN_IF_ERROR(ParseQueryString(request.query, {}).status());
      return EncodeRunConfig(route.run, core_->registry().Get(route.run));
    case ApiRoute::kFields: {
      GAC_RETURN_IF_ERROR(ParseQueryString(request.query, {}).status());
      static const std::string* const fields = new std::string(EncodeStepFields());  // a constant table
      return *fields;
    }
  }
  return base::Status::Internal("unhandled route");
}

base::StatusOr<std::string> HttpApi::SetConfig(const Principal& principal, const std::string& run, std::string_view body) {
  GAC_ASSIGN_OR_RETURN(v1::SetRunConfigRequest req, ParseConfigBody(run, body));
  auto result = std::make_shared<ConfigResult>();
  // `done` runs once: here, or on the writer's thread after the commit.
  core_->ChangeRunConfig(req, principal, [result](const base::StatusOr<v1::RunConfig>& config) {
    base::MutexLock lock(&result->mu);
    result->result = config;
    result->cv.SignalAll();
  });
  base::MutexLock lock(&result->mu);
  while (!result->result.has_value()) result->cv.Wait(&result->mu);
  // A full write queue is gacd's overload, not a request too large: over
  // HTTP it is 503 (retry later) rather than RESOURCE_EXHAUSTED's 413.
  if (result->result->status().IsResourceExhausted()) return base::Status::Unavailable(result->result->status().message());
  if (!result->result->ok()) return result->result->status();
  return EncodeRunConfig(run, **result->result);
}

}  // namespace gac::server
