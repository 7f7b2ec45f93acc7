// The rules of the wire contract (proto/gac/v1/*.proto) that code must check
// or print, in one place: what a run id and a name may contain, the size
// limits of a record and a batch (gac/proto/wire_limits.h), the rounding a
// cosine may carry, and the text of the enums.
//
// gacd's validation (server/src/validate.cc), the transport, gacctl and the
// Python package use these instead of restating them, so every side refuses
// and prints the same things.
//
// Thread safety: constants and pure functions.
#ifndef GAC_PROTO_WIRE_RULES_H_
#define GAC_PROTO_WIRE_RULES_H_

#include <cstddef>
#include <string_view>

#include "gac/base/status.h"
#include "gac/proto/wire_limits.h"
#include "gac/v1/control.pb.h"
#include "gac/v1/telemetry.pb.h"

namespace gac::proto {

// A cosine on the wire (a record's, a decision's, a request's recent
// cosines) is in [-1, 1] up to this much of rounding: one computed in
// floating point may exceed 1 by a few ulps (and by the 1e-8 of the
// denominator, kCosineEpsilon, the other way).
inline constexpr double kCosineSlack = 1e-6;

// True for a character a run id may contain.
bool IsRunIdChar(char c);
// OK, or INVALID_ARGUMENT saying what is wrong with `run`.
base::Status CheckRunId(std::string_view run);
// OK, or INVALID_ARGUMENT starting with `what` ("layer name", "scalar name").
base::Status CheckName(std::string_view what, std::string_view name);

// The text of the enums, as HTTP, gacctl and the page show them. A value
// outside the enum is "unknown". UNSPECIFIED reads as the wire contract
// says: a regime "unknown", a mode "monitor" (telemetry.proto), an alpha
// mode "paper" and a trigger "per_step" (control.proto).
const char* EnumName(v1::Regime regime);          // "safe", "project", "skip", "invalid", "spike"
const char* EnumName(v1::ControlMode mode);       // "monitor", "local", "remote"
const char* EnumName(v1::AlphaMode mode);         // "paper", "exact"
const char* EnumName(v1::Trigger trigger);        // "per_step", "window"
inline constexpr const char kUnknownName[] = "unknown";

// The regimes a step can be recorded with, in the order views list them.
inline constexpr v1::Regime kKnownRegimes[] = {v1::REGIME_SAFE, v1::REGIME_PROJECT, v1::REGIME_SKIP,
                                               v1::REGIME_INVALID, v1::REGIME_SPIKE};

// The regime as a view shows a step: in monitor mode (and UNSPECIFIED, which
// is monitor) GAC changed nothing, so "project" and "skip" read "would
// project", "would skip" and "would skip (spike)"; otherwise EnumName(regime).
const char* RegimeInModeName(v1::Regime regime, v1::ControlMode mode);
// True when steps of `mode` had their updates changed by GAC's decisions
// (local and remote); false for monitor and UNSPECIFIED.
bool ModeApplies(v1::ControlMode mode);

// Parse the names above (exact, lower case); INVALID_ARGUMENT naming the
// expected values otherwise. "unknown" is not parsed.
base::StatusOr<v1::Regime> ParseRegimeName(std::string_view name);
base::StatusOr<v1::ControlMode> ParseControlModeName(std::string_view name);
base::StatusOr<v1::AlphaMode> ParseAlphaModeName(std::string_view name);
base::StatusOr<v1::Trigger> ParseTriggerName(std::string_view name);

}  // namespace gac::proto

#endif  // GAC_PROTO_WIRE_RULES_H_
