// MakeStepRecord: a StepReport (no LibTorch needed) becomes a record that
// gacd's own validation accepts, whatever the report holds.
#include "gac/transport/step_record.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "gac/controller/report_fields.h"
#include "gac/proto/record_schema.h"
#include "server/src/validate.h"

namespace gac::transport {
namespace {

controller::StepReport ProjectReport() {
  controller::StepReport report;
  report.step = 12;
  report.decision.regime = controller::Regime::kProject;
  report.decision.cosine = 0.2;
  report.decision.cosine_after = 0.05;
  report.decision.alpha = 0.25;
  report.decision.projection_coeff = 0.15;
  report.decision.grad_norm = 2.0;
  report.decision.ref_norm = 3.0;
  report.decision.spike_verdict.grad_norm = controller::SpikeScore{2.5, 4.0};
  report.decision.spike_verdict.loss = controller::SpikeScore{-1.25, std::nullopt};
  report.loss = 0.75;
  report.stats_seconds = 1e-4;
  report.apply_seconds = 2e-4;
  report.fallback = true;
  report.mode = controller::Mode::kRemote;
  report.layers = {controller::LayerStats{"layer.0", 0.5, 4.0, 1.0}, controller::LayerStats{"layer.1", 0.0, 1.0, 0.0}};
  report.rule = controller::DecisionRule{{0.1, 0.6}, {controller::Trigger::kWindow, 7, {0.2, 0.5}}};
  // Every policy-health value set, each its own (invalid too: the builder
  // copies what the report holds).
  controller::PolicyHealth policy;
  policy.tokens = 4096;
  double value = 0.0;
  for (const controller::PolicyReal& signal : controller::kPolicyReals) policy.*signal.member = value += 0.0625;
  policy.invalid = true;
  report.policy = policy;
  return report;
}

TEST(StepRecordTest, CarriesEveryFieldOfTheReport) {
  const v1::StepRecord r = MakeStepRecord(ProjectReport(), {"exp-7", 1, 4}, {{"reward", 0.5}}, 3);
  EXPECT_EQ(r.run(), "exp-7");
  EXPECT_EQ(r.rank(), 1u);
  EXPECT_EQ(r.world_size(), 4u);
  EXPECT_EQ(r.step(), 12);
  EXPECT_EQ(r.regime(), v1::REGIME_PROJECT);
  EXPECT_EQ(r.cosine(), 0.2);
  EXPECT_EQ(r.cosine_after(), 0.05);
  EXPECT_EQ(r.alpha(), 0.25);
  EXPECT_EQ(r.grad_norm(), 2.0);
  EXPECT_EQ(r.ref_norm(), 3.0);
  EXPECT_EQ(r.staleness(), 3);
  EXPECT_EQ(r.mode(), v1::CONTROL_MODE_REMOTE);
  EXPECT_TRUE(r.fallback());
  EXPECT_DOUBLE_EQ(r.agent_overhead_seconds(), 3e-4);
  EXPECT_EQ(r.scalars().at("reward"), 0.5);
  EXPECT_EQ(r.c_low(), 0.1);
  EXPECT_EQ(r.c_high(), 0.6);
  EXPECT_EQ(r.trigger(), v1::TRIGGER_WINDOW);
  EXPECT_EQ(r.window(), 7u);
  EXPECT_EQ(r.window_c_low(), 0.2);
  EXPECT_EQ(r.window_c_high(), 0.5);
  EXPECT_EQ(r.grad_norm_z(), 2.5);
  EXPECT_EQ(r.loss_z(), -1.25);
  ASSERT_EQ(r.layers_size(), 2);
  EXPECT_EQ(r.layers(0).name(), "layer.0");
  EXPECT_NEAR(r.layers(0).cosine(), 0.5 / (2.0 * 1.0 + controller::kCosineEpsilon), 1e-15);
  EXPECT_EQ(r.layers(0).grad_norm(), 2.0);
  EXPECT_FALSE(r.layers(1).has_cosine()) << "no reference in that group";
  EXPECT_GT(r.wall_time_ns(), 0);
  EXPECT_TRUE(server::ValidateStepRecord(r, server::Limits{}).ok());
}

// The builder against the record schema: a report with every value set
// gives a record in which every field of the table is set (present and not
// its wire default), so a field added to the table that MakeStepRecord does
// not fill fails here.
TEST(StepRecordTest, SetsEveryFieldOfTheRecordSchema) {
  const v1::StepRecord r = MakeStepRecord(ProjectReport(), {"exp-7", 1, 4}, {{"reward", 0.5}}, 3);
  const v1::StepRecord empty;
  for (const proto::StepField& f : proto::kStepFields) {
    SCOPED_TRACE(f.name);
    const proto::FieldValue got = f.get(r);
    const proto::FieldValue none = f.get(empty);
    ASSERT_TRUE(got.present);
    if (f.type == proto::FieldType::kReal) {
      EXPECT_NE(got.real, none.real);
    } else {
      EXPECT_NE(got.integer, none.integer);
    }
  }
}

// The record's rows read the report themselves (record_schema.h's
// from_report), beside the report's own rows (report_fields.h) that Python
// reads: a field of both names gives the same value in both, the enums by
// their names; and the report and no rule (gacd decided) give the same
// absence.
TEST(StepRecordTest, TheRecordAndThePythonViewOfTheReportAgree) {
  controller::StepReport without_rule = ProjectReport();
  without_rule.rule.reset();
  controller::StepReport without_policy = ProjectReport();
  without_policy.policy.reset();
  for (const controller::StepReport& report : {ProjectReport(), without_rule, without_policy}) {
    const v1::StepRecord r = MakeStepRecord(report, {"exp-7", 1, 4});
    int both = 0;
    for (const controller::ReportField& from : controller::kReportFields) {
      const proto::StepField* to = proto::FindStepField(from.name);
      if (to == nullptr) continue;
      SCOPED_TRACE(from.name);
      ++both;
      const controller::ReportValue want = from.get(report);
      const proto::FieldValue got = to->get(r);
      ASSERT_EQ(got.present, want.present);
      if (!got.present) continue;
      switch (from.type) {
        case controller::ReportType::kReal: EXPECT_EQ(got.real, want.real); break;
        case controller::ReportType::kInteger:
        case controller::ReportType::kBool: EXPECT_EQ(got.integer, want.integer); break;
        case controller::ReportType::kText: ADD_FAILURE() << "no text field on the record"; break;
        default: EXPECT_STREQ(to->enum_name(got.integer), controller::ReportEnumName(from.type, want.integer)); break;
      }
    }
    EXPECT_EQ(both, 34);
  }
}

// A report without the agent's rule (gacd decided) gives a record without it.
TEST(StepRecordTest, NoRuleNoRuleFields) {
  controller::StepReport report = ProjectReport();
  report.rule.reset();
  const v1::StepRecord r = MakeStepRecord(report, {"exp-7", 0, 1});
  EXPECT_FALSE(r.has_c_low() || r.has_c_high() || r.has_trigger() || r.has_window() || r.has_window_c_low() ||
               r.has_window_c_high());
}

TEST(StepRecordTest, ValuesGacdWouldRejectAreMadeValid) {
  controller::StepReport report = ProjectReport();
  const double inf = std::numeric_limits<double>::infinity();
  report.decision.cosine = 1.0000001;  // rounding past 1
  report.decision.cosine_after = std::nan("");
  report.decision.alpha = 1.5;
  report.decision.grad_norm = inf;
  report.stats_seconds = -1.0;
  report.layers = {controller::LayerStats{"g", std::nan(""), 1.0, 1.0}};
  // Policy signals a C++ trainer got wrong or rounded.
  report.policy->tokens = -3;
  report.policy->ess_token = 1.0000000000000002;
  report.policy->kl_k3 = -1e-18;
  report.policy->log_ratio_max = std::nan("");
  report.policy->entropy_mean = -inf;
  const v1::StepRecord r = MakeStepRecord(report, {"exp-7", 0, 1}, {{"loss", std::nan("")}, {"kl", 0.1}}, -2);
  EXPECT_FALSE(r.has_policy_tokens());
  EXPECT_EQ(r.ess_token(), 1.0);
  EXPECT_EQ(r.kl_k3(), 0.0);
  EXPECT_FALSE(r.has_log_ratio_max());
  EXPECT_FALSE(r.has_entropy_mean());
  EXPECT_EQ(r.ess_sequence(), report.policy->ess_sequence);  // the others as they were
  EXPECT_EQ(r.cosine(), 1.0);
  EXPECT_FALSE(r.has_cosine_after());
  EXPECT_EQ(r.alpha(), 1.0);
  EXPECT_EQ(r.grad_norm(), 0.0);
  EXPECT_EQ(r.agent_overhead_seconds(), 0.0);
  EXPECT_FALSE(r.has_staleness());
  EXPECT_EQ(r.scalars().count("loss"), 0u);
  EXPECT_EQ(r.scalars().at("kl"), 0.1);
  EXPECT_FALSE(r.layers(0).has_cosine());
  const base::Status st = server::ValidateStepRecord(r, server::Limits{});
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(StepRecordTest, TheModeIsTheReports) {
  controller::StepReport report = ProjectReport();
  report.mode = controller::Mode::kMonitor;
  EXPECT_EQ(MakeStepRecord(report, {"exp-7", 0, 1}).mode(), v1::CONTROL_MODE_MONITOR);
  report.mode = controller::Mode::kLocal;
  EXPECT_EQ(MakeStepRecord(report, {"exp-7", 0, 1}).mode(), v1::CONTROL_MODE_LOCAL);
}

// The former four-argument form (deprecated) still works: its mode wins over
// the report's.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST(StepRecordTest, DeprecatedModeArgumentOverridesTheReports) {
  controller::StepReport report = ProjectReport();
  report.mode = controller::Mode::kMonitor;
  const v1::StepRecord r = MakeStepRecord(report, {"exp-7", 0, 1}, controller::Mode::kLocal, {{"reward", 0.5}}, 3);
  EXPECT_EQ(r.mode(), v1::CONTROL_MODE_LOCAL);
  EXPECT_EQ(r.scalars().at("reward"), 0.5);
  EXPECT_EQ(r.staleness(), 3);
  const controller::GroupStats& former = report.layers[0];
  EXPECT_EQ(former.name, "layer.0");
}
#pragma GCC diagnostic pop

}  // namespace
}  // namespace gac::transport
