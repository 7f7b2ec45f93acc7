// Builds the telemetry record of a step from the agent's report (a
// gac::StepReport, which needs no LibTorch), for trainers that stream to gacd:
//
//   auto report = agent->Step(step, params);
//   telemetry->Enqueue(gac::transport::MakeStepRecord(*report, identity, {{"reward", r}}));
//
// Thread safety: a pure function.
#ifndef GAC_TRANSPORT_STEP_RECORD_H_
#define GAC_TRANSPORT_STEP_RECORD_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "gac/controller/step_report.h"
#include "gac/v1/telemetry.pb.h"

namespace gac::transport {

// Who reports: the same for every step of a rank.
struct RunIdentity {
  std::string run;  // run id ([A-Za-z0-9._:/-], 1-128 characters)
  std::uint32_t rank = 0;
  std::uint32_t world_size = 1;
};

// The record of `report`, stamped with the current wall time, in the mode
// the agent ran the step in (report.mode). Values gacd would reject are made
// valid rather than dropping the step: cosines are clamped to [-1, 1] (and
// left out when not finite), alpha to [0, 1], non-finite norms and overhead
// become 0. `scalars`: trainer scalars (reward, loss, kl, entropy...);
// non-finite values are left out. `staleness`: policy versions behind, if
// the trainer knows it (negative values are left out).
v1::StepRecord MakeStepRecord(const controller::StepReport& report, const RunIdentity& who,
                              const std::map<std::string, double>& scalars = {},
                              std::optional<std::int64_t> staleness = std::nullopt);

// The former form, from before StepReport carried its mode: the record says
// `mode` whatever report.mode says.
[[deprecated("the report carries its mode: use MakeStepRecord(report, who, scalars, staleness)")]]
v1::StepRecord MakeStepRecord(const controller::StepReport& report, const RunIdentity& who, controller::Mode mode,
                              const std::map<std::string, double>& scalars = {},
                              std::optional<std::int64_t> staleness = std::nullopt);

}  // namespace gac::transport

#endif  // GAC_TRANSPORT_STEP_RECORD_H_
