// gacd's Decide path after the bytes arrive: parse a gac.v1.DecideRequest,
// ValidateDecideRequest, decide with the run's settings (RunRegistry) and
// encode the answer as Core::Decide does. Property: the agent's check of an
// answer (DecodeDecideResponse) accepts every answer an honest gacd gives,
// whatever the statistics, and the decision is the local controller's.
#include <cmath>
#include <cstdint>

#include "gac/proto/convert.h"
#include "server/src/registry.h"
#include "server/src/validate.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gac;
  v1::DecideRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const base::Status valid = server::ValidateDecideRequest(request);
  if (!valid.ok()) {
    GAC_FUZZ_CHECK(valid.IsInvalidArgument(), valid.ToString());
    return 0;
  }
  static const server::RunRegistry* registry = [] {
    v1::Thresholds t;
    t.set_c_low(0.05);
    t.set_c_high(0.3);
    t.set_alpha_mode(v1::ALPHA_MODE_PAPER);
    auto* r = new server::RunRegistry(t, v1::CONTROL_MODE_REMOTE);
    // One run with its own settings (the exact alpha).
    v1::RunConfig exact;
    exact.mutable_thresholds()->set_c_low(0.1);
    exact.mutable_thresholds()->set_c_high(0.5);
    exact.mutable_thresholds()->set_alpha_mode(v1::ALPHA_MODE_EXACT);
    exact.set_mode(v1::CONTROL_MODE_REMOTE);
    exact.set_version(1);
    v1::RunConfig window = exact;  // the windowed trigger, on the request's recent cosines
    window.set_trigger(v1::TRIGGER_WINDOW);
    window.set_window(4);
    window.mutable_window_thresholds()->set_c_low(0.2);
    window.mutable_window_thresholds()->set_c_high(0.6);
    r->Load({{"exp-exact", exact}, {"exp-window", window}});
    return r;
  }();
  v1::DecideResponse response;
  const controller::Decision d =
      registry->Decide(request.run(), proto::StatsFromProto(request), request.recent_cosines(), response.mutable_config());
  proto::EncodeDecideResponse(request, d, &response);

  // Across the wire and back, as the agent reads it.
  std::string bytes;
  GAC_FUZZ_CHECK(response.SerializeToString(&bytes), "serialise");
  v1::DecideResponse wire;
  GAC_FUZZ_CHECK(wire.ParseFromString(bytes), "parse");
  base::StatusOr<controller::Decision> back = proto::DecodeDecideResponse(request, wire);
  GAC_FUZZ_CHECK(back.ok(), "honest answer refused: " + back.status().ToString() + " for " +
                                request.ShortDebugString());
  GAC_FUZZ_CHECK(back->regime == d.regime && back->apply_update == d.apply_update, "decision changed");
  GAC_FUZZ_CHECK(back->projection_coeff == d.projection_coeff || (std::isnan(back->projection_coeff) &&
                                                                  std::isnan(d.projection_coeff)),
                 "coefficient changed");
  return 0;
}
