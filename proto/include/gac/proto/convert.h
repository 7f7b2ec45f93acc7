// The one place where gac's domain types (gac::controller) and the wire
// contract (gac.v1 messages, grpc::Status) are mapped onto each other. Every
// enum, message and status conversion of gacd, the transport and gacctl goes
// through these functions, so the two ends cannot disagree.
//
// Decoding checks what the other side could get wrong: an unknown enum value
// is INVALID_ARGUMENT, and DecodeDecision refuses an answer no honest
// controller gives (so a broken or hostile gacd cannot change a trainer's
// update beyond what the local decision would do).
//
// Thread safety: pure functions.
#ifndef GAC_PROTO_CONVERT_H_
#define GAC_PROTO_CONVERT_H_

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gac/controller/controller.h"
#include "gac/controller/spike.h"
#include "gac/controller/window.h"
#include "gac/base/status.h"
#include "gac/v1/control.pb.h"
#include "gac/v1/telemetry.pb.h"

namespace gac::proto {

// Enums. ToProto never returns UNSPECIFIED; FromProto refuses UNSPECIFIED
// and values outside the enum, except that an UNSPECIFIED alpha mode reads
// as PAPER (the wire contract's default).
v1::Regime ToProto(controller::Regime regime);
base::StatusOr<controller::Regime> FromProto(v1::Regime regime);
v1::AlphaMode ToProto(controller::AlphaMode mode);
base::StatusOr<controller::AlphaMode> FromProto(v1::AlphaMode mode);
v1::ControlMode ToProto(controller::Mode mode);
base::StatusOr<controller::Mode> FromProto(v1::ControlMode mode);
// UNSPECIFIED reads as PER_STEP.
v1::Trigger ToProto(controller::Trigger trigger);
base::StatusOr<controller::Trigger> FromProto(v1::Trigger trigger);

// The window W of a run's settings: 0 on the wire reads as the default 20.
int WindowFromProto(std::uint32_t window);
// A run's trigger settings; absent window thresholds are `default_window`.
// INVALID_ARGUMENT when they are not valid.
base::StatusOr<controller::TriggerSettings> TriggerFromProto(const v1::RunConfig& config,
                                                             const v1::Thresholds& default_window);

// The settings a step was decided with: `config` (gacd's settings for the
// run) with the thresholds, trigger, window and window thresholds the agent
// reported in `record` put over it, each where the record carries it (local
// and monitor mode, a remote fallback). A record without them (gacd
// decided, or an older agent) gives `config`. Views show these for a run's
// latest step; the version, mode and alpha mode stay gacd's.
v1::RunConfig DecidedWith(const v1::RunConfig& config, const v1::StepRecord& record);

// Thresholds with their alpha mode.
v1::Thresholds ToProto(const controller::Thresholds& thresholds, controller::AlphaMode mode);
// Validated as the controller does (ValidateThresholds).
base::StatusOr<controller::Thresholds> ThresholdsFromProto(const v1::Thresholds& thresholds);
// A controller for the settings on the wire; INVALID_ARGUMENT when they are not valid.
base::StatusOr<controller::Controller> ControllerFromProto(const v1::Thresholds& thresholds);

// A run's spike guard: 0 reads as the default window and sigma; absent or
// all zero is off. INVALID_ARGUMENT, naming the setting, when not valid.
base::StatusOr<controller::SpikeSettings> SpikeFromProto(const v1::SpikeGuard& spike);
v1::SpikeGuard ToProto(const controller::SpikeSettings& spike);

// Decide's request: who asks, and the step's three sums (and its loss).
// `recent` are the asker's previous valid cosines, oldest first (the window
// of the windowed trigger; the newest kMaxWindow are sent); `recent_norms`
// and `recent_losses` its accepted steps' |g| and losses, oldest first (the
// spike guard's; the newest kMaxSpikeWindow are sent).
v1::DecideRequest ToDecideRequest(const std::string& run, std::uint32_t rank, std::int64_t step,
                                  const controller::AlignmentStats& stats, const std::vector<double>& recent = {},
                                  const std::vector<double>& recent_norms = {},
                                  const std::vector<double>& recent_losses = {});
controller::AlignmentStats StatsFromProto(const v1::DecideRequest& request);

// Decide's answer. EncodeDecision fills every decision field of `response`
// (not its config).
void EncodeDecision(const controller::Decision& decision, v1::DecideResponse* response);
// The decision in `response` for the statistics that were asked about.
// INVALID_ARGUMENT, naming the field, for an answer no controller gives: an
// unknown regime; alpha outside [0, 1] or not finite; a non-finite
// projection coefficient, a non-zero one on a regime that does not project,
// or one that is not (1 - alpha) * dot / ref_sq for these statistics (so a
// valid alpha cannot smuggle in a larger change); PROJECT without a
// reference; apply_update that disagrees with the regime; a cosine outside
// [-1, 1] (the window mean too). The norms come from `stats`, not from the
// answer.
base::StatusOr<controller::Decision> DecodeDecision(const v1::DecideResponse& response, const controller::AlignmentStats& stats);

// gacd's whole answer to `request`: EncodeDecision, plus the run and step it
// answers (echoed, so that the asker can check them).
void EncodeDecideResponse(const v1::DecideRequest& request, const controller::Decision& decision,
                          v1::DecideResponse* response);
// The asker's check of that answer: INVALID_ARGUMENT when it is for another
// run or step than `request` (an answer that does not say which is refused
// too), else DecodeDecision with the request's statistics.
base::StatusOr<controller::Decision> DecodeDecideResponse(const v1::DecideRequest& request, const v1::DecideResponse& response);

// Status across the RPC boundary: the codes are the same numbers.
grpc::Status ToGrpcStatus(const base::Status& status);
// UNKNOWN for a code outside gRPC's range; `prefix` (when not empty) goes in
// front of the message as "<prefix>: ".
base::Status FromGrpcStatus(const grpc::Status& status, const std::string& prefix = "");

// The HTTP status of a code, for gacd's HTTP API: OK 200; INVALID_ARGUMENT,
// FAILED_PRECONDITION and OUT_OF_RANGE 400; UNAUTHENTICATED 401;
// PERMISSION_DENIED 403; NOT_FOUND 404; ABORTED and ALREADY_EXISTS 409;
// RESOURCE_EXHAUSTED 413 (a request above the size limit, as gRPC reports a
// message above its limit); CANCELLED 499; UNIMPLEMENTED 501; UNAVAILABLE
// 503; DEADLINE_EXCEEDED 504; every other code 500.
int ToHttpStatus(base::StatusCode code);

}  // namespace gac::proto

#endif  // GAC_PROTO_CONVERT_H_
