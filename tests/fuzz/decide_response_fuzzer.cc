// The agent's check of what gacd answers to Decide (a broken or hostile
// gacd): parse a gac.v1.DecideResponse and DecodeDecideResponse it against
// one of a few requests. Property: an answer that is accepted cannot change
// the update more than an honest controller could: alpha in [0, 1], a
// finite coefficient of at most |dot| / pp, projection only with a
// reference, and apply_update as the regime says.
#include <cmath>
#include <cstdint>

#include "gac/proto/convert.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gac;
  fuzz::Input in(data, size);
  static const controller::AlignmentStats kStats[] = {
      {0.2, 1.0, 1.0, true},      // cosine 0.2: project
      {0.9, 1.0, 1.0, true},      // skip
      {0.0, 1.0, 0.0, false},     // first step: safe
      {-3.0, 4.0, 9.0, true},     // negative alignment
      {1e-300, 1e-300, 1e-300, true},
      {NAN, 1.0, 1.0, true},      // invalid
  };
  const controller::AlignmentStats& stats = kStats[in.Byte() % (sizeof kStats / sizeof kStats[0])];
  const v1::DecideRequest request = proto::ToDecideRequest("exp-fuzz", 0, 12, stats);
  v1::DecideResponse response;
  if (!in.ParseRest(&response)) return 0;
  base::StatusOr<controller::Decision> d = proto::DecodeDecideResponse(request, response);
  if (!d.ok()) {
    GAC_FUZZ_CHECK(d.status().IsInvalidArgument(), d.status().ToString());
    GAC_FUZZ_CHECK(d.status().message().size() < 1024, "error messages stay short");
    return 0;
  }
  GAC_FUZZ_CHECK(d->alpha >= 0.0 && d->alpha <= 1.0, "alpha in [0, 1]");
  GAC_FUZZ_CHECK(std::isfinite(d->projection_coeff), "finite coefficient");
  if (d->regime == controller::Regime::kProject) {
    GAC_FUZZ_CHECK(stats.has_reference && stats.ref_sq > 0.0, "projection needs a reference");
    const double bound = std::fabs(stats.dot / stats.ref_sq);
    GAC_FUZZ_CHECK(std::fabs(d->projection_coeff) <= bound * (1.0 + 1e-6) + 1e-300, "coefficient bounded by dot / pp");
  } else {
    GAC_FUZZ_CHECK(d->projection_coeff == 0.0, "no coefficient without projection");
  }
  GAC_FUZZ_CHECK(d->apply_update == (d->regime == controller::Regime::kSafe || d->regime == controller::Regime::kProject),
                 "apply_update follows the regime");
  return 0;
}
