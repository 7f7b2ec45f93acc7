// Which of the kernels' images the driver runs on a GPU (ImageFor), the rule
// `python -m gac` reports by: the wheel's images against the GPUs of the
// last generations, and the edges (minor versions, PTX needing a new enough
// driver, architecture-specific cubins). No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gac/agent/cuda_info.h"

namespace gac::agent {
namespace {

const std::vector<std::string> kWheel = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120", "compute_120"};

TEST(CudaInfoTest, TheWheelsImagesForEachGeneration) {
  EXPECT_EQ(ImageFor(kWheel, 8, 0, true), "sm_80");    // A100
  EXPECT_EQ(ImageFor(kWheel, 8, 6, true), "sm_86");    // A10, RTX 30
  EXPECT_EQ(ImageFor(kWheel, 8, 7, true), "sm_86");    // Orin: same major, the largest minor not above
  EXPECT_EQ(ImageFor(kWheel, 8, 9, true), "sm_89");    // L4, L40
  EXPECT_EQ(ImageFor(kWheel, 9, 0, true), "sm_90");    // H100, H200
  EXPECT_EQ(ImageFor(kWheel, 10, 0, true), "sm_100");  // B200
  EXPECT_EQ(ImageFor(kWheel, 10, 3, true), "sm_100");  // B300
  EXPECT_EQ(ImageFor(kWheel, 12, 0, true), "sm_120");  // RTX 50
  EXPECT_EQ(ImageFor(kWheel, 12, 1, true), "sm_120");
  EXPECT_EQ(ImageFor(kWheel, 13, 0, true), "compute_120");  // later: the driver compiles the PTX
}

TEST(CudaInfoTest, OlderGpusAndDriversRunNothing) {
  EXPECT_EQ(ImageFor(kWheel, 7, 5, true), "");    // T4: no cubin of major 7, no PTX at or below 7.5
  EXPECT_EQ(ImageFor(kWheel, 11, 0, true), "");   // Thor: no cubin of major 11, the PTX is of 12.0
  EXPECT_EQ(ImageFor(kWheel, 13, 0, false), "");  // a driver older than the PTX's compiler
  EXPECT_EQ(ImageFor({}, 9, 0, true), "");
}

TEST(CudaInfoTest, NvccDefaultsAndSpecificArchitectures) {
  const std::vector<std::string> archs = {"sm_80", "compute_80", "sm_90a", "native"};
  EXPECT_EQ(ImageFor(archs, 8, 6, true), "sm_80");
  EXPECT_EQ(ImageFor(archs, 9, 0, true), "sm_90a");
  EXPECT_EQ(ImageFor(archs, 10, 0, true), "compute_80") << "sm_90a runs on 9.0 only";
  EXPECT_EQ(ImageFor(archs, 10, 0, false), "");
}

TEST(CudaInfoTest, TheBuildReportsItsImages) {
  const CudaBuildInfo info = GetCudaBuildInfo();
  EXPECT_EQ(info.kernels, info.runtime_version > 0);
  EXPECT_EQ(info.kernels, !info.archs.empty());
  EXPECT_EQ(info.kernels, !info.compiler.empty());
  const CudaEnvironment env = QueryCudaEnvironment();  // whatever this machine has: it must answer
  if (env.driver_version == 0) {
    EXPECT_TRUE(env.devices.empty());
  }
  for (const CudaDeviceInfo& d : env.devices) {
    EXPECT_TRUE(d.image.empty() || std::find(info.archs.begin(), info.archs.end(), d.image) != info.archs.end());
  }
}

}  // namespace
}  // namespace gac::agent
