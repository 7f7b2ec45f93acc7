// gac/proto/record_schema.h and gac/proto/wire_rules.h: the table covers
// every row field of StepRecord with its wire type, its accessors read and
// write the field they name, and the wire rules and enum names hold.

#include "gac/proto/record_schema.h"

#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "gac/proto/wire_rules.h"

namespace gac::proto {
namespace {

using google::protobuf::FieldDescriptor;

// The schema type a wire field must have.
FieldType TypeOf(const FieldDescriptor& f) {
  switch (f.cpp_type()) {
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: return FieldType::kReal;
    case FieldDescriptor::CPPTYPE_BOOL: return FieldType::kBool;
    case FieldDescriptor::CPPTYPE_ENUM: return FieldType::kEnum;
    case FieldDescriptor::CPPTYPE_STRING: return FieldType::kText;
    default: return FieldType::kInteger;
  }
}

TEST(RecordSchemaTest, CoversEveryRowFieldOfTheWireRecord) {
  const auto* descriptor = v1::StepRecord::descriptor();
  std::set<std::string> in_table;
  for (const StepField& f : kStepFields) {
    EXPECT_TRUE(in_table.insert(f.name).second) << "twice: " << f.name;
    const FieldDescriptor* wire = descriptor->FindFieldByName(f.name);
    ASSERT_NE(wire, nullptr) << f.name << " is not a StepRecord field";
    EXPECT_EQ(f.type, TypeOf(*wire)) << f.name;
    EXPECT_EQ(f.optional, wire->has_presence()) << f.name;
    EXPECT_EQ(f.type == FieldType::kEnum, f.enum_name != nullptr) << f.name;
    EXPECT_EQ(FindStepField(f.name), &f);
  }
  // Out of the table by design: the key and the child rows.
  const std::set<std::string> outside = {"run", "scalars", "layers"};
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const std::string name = descriptor->field(i)->name();
    EXPECT_NE(in_table.count(name) + outside.count(name), 0u) << name << " is missing from kStepFields";
  }
  EXPECT_EQ(in_table.size() + outside.size(), static_cast<std::size_t>(descriptor->field_count()));
  EXPECT_EQ(FindStepField("overhead_s"), nullptr);
}

TEST(RecordSchemaTest, AccessorsReadAndWriteTheirField) {
  const auto* reflection = v1::StepRecord::GetReflection();
  for (const StepField& f : kStepFields) {
    v1::StepRecord r;
    FieldValue v;
    v.integer = f.type == FieldType::kBool ? 1 : 2;
    v.real = 0.375;
    f.set(v, &r);
    const FieldDescriptor* wire = v1::StepRecord::descriptor()->FindFieldByName(f.name);
    // Only the named field changed.
    std::vector<const FieldDescriptor*> set_fields;
    reflection->ListFields(r, &set_fields);
    ASSERT_EQ(set_fields.size(), 1u) << f.name;
    EXPECT_EQ(set_fields[0], wire) << f.name;
    const FieldValue back = f.get(r);
    EXPECT_TRUE(back.present) << f.name;
    if (f.type == FieldType::kReal) {
      EXPECT_EQ(back.real, 0.375) << f.name;
    } else {
      EXPECT_EQ(back.integer, v.integer) << f.name;
    }
    if (f.optional) {
      f.set(FieldValue{false, 0, 0}, &r);
      EXPECT_FALSE(f.get(r).present) << f.name;
      EXPECT_FALSE(reflection->HasField(r, wire)) << f.name;
    }
  }
}

TEST(RecordSchemaTest, OptionalFieldsReadAbsentOnAnEmptyRecord) {
  const v1::StepRecord empty;
  for (const StepField& f : kStepFields) EXPECT_EQ(f.get(empty).present, !f.optional) << f.name;
}

// Each field is decided for each view that picks its fields (StepFieldViews):
// shown there, or left out here with the reason. A field added to the table
// fails here until all three are decided.
TEST(RecordSchemaTest, EveryFieldIsInTheChoosingViewsOrSaysWhyNot) {
  const std::map<std::string, std::string> no_gauge = {
      {"rank", "a label of every per-rank series"},
      {"world_size", "constant over a run: gacctl runs"},
      {"regime", "gac_steps_total{regime}, gac_skipped_updates_total, gac_spikes_total"},
      {"wall_time_ns", "gac_last_report_timestamp_seconds"},
      {"mode", "gac_steps_total{mode}"},
      {"fallback", "gac_controller_fallbacks_total"},
      {"c_low", "the rule: gac_threshold_c_low (DecidedWith)"},
      {"c_high", "the rule: gac_threshold_c_high"},
      {"trigger", "the rule: the threshold gauges it selects"},
      {"window", "the rule: gac_window_steps"},
      {"window_c_low", "the rule: gac_threshold_window_c_low"},
      {"window_c_high", "the rule: gac_threshold_window_c_high"},
  };
  const std::map<std::string, std::string> not_on_page = {
      {"rank", "the rank selector"},
      {"world_size", "the rank selector's choices"},
      {"alpha", "shown through the regime (project) and the cosine after; gacctl steps lists it"},
      {"wall_time_ns", "the card's \"last report\", from the run's last_seen_ns"},
      {"agent_overhead_seconds", "an operator's figure: gac_agent_overhead_seconds and gacctl steps"},
      {"mode", "the regime's text (monitor mode: what GAC would have done) and the regimes card"},
      {"fallback", "gac_controller_fallbacks_total and gacctl steps"},
      {"c_low", "the card's \"decided with\" and the charts' bands"},
      {"c_high", "the card's \"decided with\" and the charts' bands"},
      {"trigger", "the charts' bands"},
      {"window", "the m_t chart's title"},
      {"window_c_low", "the m_t chart's bands"},
      {"window_c_high", "the m_t chart's bands"},
      {"loss_z", "the spike guard's loss z-score: gac_loss_z and gacctl steps (the page marks spike steps)"},
  };
  const std::map<std::string, std::string> not_in_tail = {
      {"rank", "tail follows one rank (--rank)"},
      {"world_size", "constant over a run: gacctl runs"},
      {"ref_norm", "|p| is the previous step's |g|, one row up"},
      {"cosine_after", "tail is one line per step: gacctl steps has it"},
      {"wall_time_ns", "tail prints as steps arrive"},
      {"agent_overhead_seconds", "gacctl steps"},
      {"mode", "constant over a run: gacctl runs (MODE)"},
      {"fallback", "gacctl steps"},
      {"c_low", "the rule: gacctl steps and gacctl config get"},
      {"c_high", "the rule: gacctl steps"},
      {"trigger", "the rule: gacctl steps"},
      {"window", "the rule: gacctl steps"},
      {"window_c_low", "the rule: gacctl steps"},
      {"window_c_high", "the rule: gacctl steps"},
      {"loss_z", "the spike guard's loss z-score: gacctl steps (tail shows the regime and |g|'s z)"},
  };
  // The places the short views' own values take (tail's reward comes last).
  std::set<int> page_places = {kPlaceWindowMean, kPlaceDecidedWith, kPlaceLastReport},
                tail_places = {kPlaceWindowMean};
  std::set<std::string> gauges;
  for (const StepField& f : kStepFields) {
    const std::string name = f.name;
    EXPECT_NE(f.views.gauge != nullptr, no_gauge.count(name) == 1)
        << name << ": give it a gauge, or say in no_gauge why not";
    if (f.views.gauge != nullptr) {
      EXPECT_TRUE(gauges.insert(f.views.gauge).second) << "gauge named twice: " << f.views.gauge;
      EXPECT_EQ(std::string(f.views.gauge).rfind("gac_", 0), 0u) << f.views.gauge;
    }
    EXPECT_NE(f.views.page_label != nullptr, not_on_page.count(name) == 1)
        << name << ": give it a page label, or say in not_on_page why not";
    EXPECT_NE(f.views.tail_header != nullptr, not_in_tail.count(name) == 1)
        << name << ": give it a tail column, or say in not_in_tail why not";
    if (f.views.page_label != nullptr) {
      EXPECT_TRUE(page_places.insert(f.views.place).second) << name << ": place " << f.views.place << " taken";
      EXPECT_GE(f.views.page_digits, -1) << name;
    }
    if (f.views.tail_header != nullptr) {
      EXPECT_TRUE(tail_places.insert(f.views.place).second) << name << ": place " << f.views.place << " taken";
      EXPECT_GT(f.views.tail_width, 0) << name;
    }
    if (f.views.page_label != nullptr || f.views.tail_header != nullptr) EXPECT_GT(f.views.place, 0) << name;
  }
}

TEST(WireRulesTest, RunIds) {
  EXPECT_TRUE(CheckRunId("exp-1/a.b_c:2").ok());
  EXPECT_FALSE(CheckRunId("").ok());
  EXPECT_FALSE(CheckRunId("a b").ok());
  EXPECT_FALSE(CheckRunId("é").ok());
  EXPECT_TRUE(CheckRunId(std::string(kMaxRunIdLength, 'a')).ok());
  EXPECT_FALSE(CheckRunId(std::string(kMaxRunIdLength + 1, 'a')).ok());
  EXPECT_EQ(CheckRunId("a b").code(), base::StatusCode::kInvalidArgument);
}

TEST(WireRulesTest, Names) {
  EXPECT_TRUE(CheckName("layer name", "model.layers.0 weight").ok());
  EXPECT_FALSE(CheckName("layer name", "").ok());
  EXPECT_FALSE(CheckName("layer name", "tab\there").ok());
  EXPECT_TRUE(CheckName("layer name", std::string(kMaxNameLength, 'x')).ok());
  const base::Status long_name = CheckName("scalar name", std::string(kMaxNameLength + 1, 'x'));
  EXPECT_EQ(long_name.message().rfind("scalar name", 0), 0u) << long_name.ToString();
}

TEST(WireRulesTest, Limits) {
  EXPECT_EQ(kMaxScalarsPerRecord, 64u);
  EXPECT_EQ(kMaxLayersPerRecord, 4096u);
  EXPECT_EQ(kMaxRecordsPerBatch, 4096u);
}

TEST(WireRulesTest, EnumNamesRoundTripAndUnknownIsUnknown) {
  for (v1::Regime r : kKnownRegimes) EXPECT_EQ(*ParseRegimeName(EnumName(r)), r);
  for (v1::ControlMode m : {v1::CONTROL_MODE_MONITOR, v1::CONTROL_MODE_LOCAL, v1::CONTROL_MODE_REMOTE}) {
    EXPECT_EQ(*ParseControlModeName(EnumName(m)), m);
  }
  for (v1::AlphaMode m : {v1::ALPHA_MODE_PAPER, v1::ALPHA_MODE_EXACT}) EXPECT_EQ(*ParseAlphaModeName(EnumName(m)), m);
  EXPECT_STREQ(EnumName(static_cast<v1::Regime>(99)), "unknown");
  EXPECT_STREQ(EnumName(v1::REGIME_UNSPECIFIED), "unknown");
  EXPECT_STREQ(EnumName(static_cast<v1::ControlMode>(99)), "unknown");
  EXPECT_STREQ(EnumName(static_cast<v1::AlphaMode>(99)), "unknown");
  // UNSPECIFIED reads as the wire contract says.
  EXPECT_STREQ(EnumName(v1::CONTROL_MODE_UNSPECIFIED), "monitor");
  EXPECT_STREQ(EnumName(v1::ALPHA_MODE_UNSPECIFIED), "paper");
  EXPECT_FALSE(ParseRegimeName("unknown").ok());
  EXPECT_FALSE(ParseControlModeName("Monitor").ok());
  EXPECT_NE(ParseAlphaModeName("x").status().message().find("paper or exact"), std::string::npos);
  // The table's enum namers agree.
  EXPECT_STREQ(FindStepField("regime")->enum_name(v1::REGIME_SKIP), "skip");
  EXPECT_STREQ(FindStepField("mode")->enum_name(42), "unknown");
}

TEST(WireRulesTest, MonitorModeRegimesReadAsWhatGacWouldHaveDone) {
  EXPECT_STREQ(RegimeInModeName(v1::REGIME_SKIP, v1::CONTROL_MODE_MONITOR), "would skip");
  EXPECT_STREQ(RegimeInModeName(v1::REGIME_PROJECT, v1::CONTROL_MODE_UNSPECIFIED), "would project");
  EXPECT_STREQ(RegimeInModeName(v1::REGIME_SAFE, v1::CONTROL_MODE_MONITOR), "safe");
  EXPECT_STREQ(RegimeInModeName(v1::REGIME_SKIP, v1::CONTROL_MODE_LOCAL), "skip");
  EXPECT_STREQ(RegimeInModeName(v1::REGIME_PROJECT, v1::CONTROL_MODE_REMOTE), "project");
  EXPECT_TRUE(ModeApplies(v1::CONTROL_MODE_LOCAL));
  EXPECT_FALSE(ModeApplies(v1::CONTROL_MODE_UNSPECIFIED));
}

}  // namespace
}  // namespace gac::proto
