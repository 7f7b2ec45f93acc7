// gac/proto/record_schema.h and gac/proto/wire_rules.h: the table covers
// every row field of StepRecord with its wire type, its accessors read and
// write the field they name, each field says where in the report it comes
// from, and the wire rules and enum names hold.

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

// Each field is filled from the agent's report or, for the fields named
// here, by the transport. How the views show the fields is theirs: gacd's
// gauges (tests/server/metrics_test.cc), gacctl tail's columns
// (tests/cli/gacctl_test.cc), the page's card (tests/server/http_api_test.cc).
TEST(RecordSchemaTest, EveryFieldComesFromTheReportOrSaysWhyNot) {
  const std::map<std::string, std::string> not_from_report = {
      {"rank", "the run's identity (RunIdentity)"},
      {"world_size", "the run's identity (RunIdentity)"},
      {"wall_time_ns", "the transport's clock when it builds the record"},
      {"staleness", "the trainer's, given to MakeStepRecord"},
  };
  for (const StepField& f : kStepFields) {
    EXPECT_NE(f.from_report != nullptr, not_from_report.count(f.name) == 1)
        << f.name << ": read it from the report, or say in not_from_report why not";
  }
  // An empty report gives every non-optional field present.
  const controller::StepReport report;
  for (const StepField& f : kStepFields) {
    if (f.from_report != nullptr && !f.optional) {
      EXPECT_TRUE(f.from_report(report).present) << f.name;
    }
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
  EXPECT_EQ(kCosineSlack, 1e-6);
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
