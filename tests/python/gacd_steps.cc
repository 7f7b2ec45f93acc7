// gacd_steps ADDRESS RUN [TOKEN]: prints every step record gacd stores for
// RUN (layers included), one JSON object per line (protobuf's JSON mapping
// with the .proto field names), through the real gRPC QueryService. The
// Python tests read what gacd stored with it.
#include <google/protobuf/util/json_util.h>

#include <iostream>
#include <string>
#include <vector>

#include "tests/common/test_util.h"

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::cerr << "usage: gacd_steps ADDRESS RUN [TOKEN]\n";
    return 2;
  }
  gac::testing::Client client(argv[1], argc == 4 ? argv[3] : "");
  std::vector<gac::v1::StepRecord> steps;
  const grpc::Status st = client.AllSteps(argv[2], &steps, /*include_layers=*/true);
  if (!st.ok()) {
    std::cerr << "gacd_steps: GetSteps failed: " << st.error_code() << " " << st.error_message() << "\n";
    return 1;
  }
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  for (const gac::v1::StepRecord& s : steps) {
    std::string line;
    if (!google::protobuf::util::MessageToJsonString(s, &line, options).ok()) return 1;
    std::cout << line << "\n";
  }
  return 0;
}
