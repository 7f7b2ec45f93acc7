// Tests of gac/base/file_util.h on real files under the test's temporary directory.
#include "gac/base/file_util.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace gac {
namespace {

class FileUtilTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr ? tmp : "/tmp") + "/gac-file-util-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(FileUtilTest, MakeDirsCreatesEveryMissingParentWithTheMode) {
  const std::string deep = dir_ + "/a/b/c";
  ASSERT_TRUE(base::MakeDirs(deep, "data directory", 0700).ok());
  struct stat st;
  ASSERT_EQ(stat(deep.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0077, 0u) << "mode 0700 leaves nothing for group and others";
  // Existing directories (and a trailing slash) are fine.
  EXPECT_TRUE(base::MakeDirs(deep + "/", "data directory").ok());
  EXPECT_TRUE(base::MakeDirs(dir_, "data directory").ok());
}

TEST_F(FileUtilTest, MakeDirsOverAFileFailsWithoutDataLoss) {
  std::ofstream(dir_ + "/file") << "x";
  base::Status st = base::MakeDirs(dir_ + "/file", "spool directory");
  EXPECT_TRUE(st.IsFailedPrecondition()) << st.ToString();
  EXPECT_NE(st.message().find("spool directory"), std::string::npos) << st.ToString();
  st = base::MakeDirs(dir_ + "/file/below", "spool directory");
  EXPECT_TRUE(st.IsFailedPrecondition()) << st.ToString();  // ENOTDIR
  EXPECT_TRUE(base::MakeDirs("", "spool directory").IsInvalidArgument());
}

TEST_F(FileUtilTest, MakeDirsWithoutPermissionIsPermissionDenied) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  ASSERT_EQ(chmod(dir_.c_str(), 0500), 0);
  const base::Status st = base::MakeDirs(dir_ + "/x", "data directory");
  chmod(dir_.c_str(), 0700);
  EXPECT_TRUE(st.IsPermissionDenied()) << st.ToString();
}

TEST_F(FileUtilTest, ReadFileToStringReadsEveryByte) {
  std::string content;
  for (int i = 0; i < 100000; ++i) content.push_back(static_cast<char>(i * 7));
  std::ofstream(dir_ + "/blob", std::ios::binary) << content;
  base::StatusOr<std::string> read = base::ReadFileToString(dir_ + "/blob", "blob");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, content);
  std::ofstream(dir_ + "/empty");
  read = base::ReadFileToString(dir_ + "/empty", "empty file");
  ASSERT_TRUE(read.ok());
  EXPECT_TRUE(read->empty());
}

TEST_F(FileUtilTest, ReadFileToStringErrorsNameTheFileAndKeepTheErrnoCode) {
  base::StatusOr<std::string> read = base::ReadFileToString(dir_ + "/missing", "token file");
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(read.status().IsNotFound()) << read.status().ToString();
  EXPECT_NE(read.status().message().find("token file '" + dir_ + "/missing'"), std::string::npos);
  read = base::ReadFileToString(dir_, "token file");  // a directory: read() fails with EISDIR
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(read.status().IsFailedPrecondition()) << read.status().ToString();
}

}  // namespace
}  // namespace gac
