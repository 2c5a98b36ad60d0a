// ReadCredentialFile: a worker's token or CA file missing or empty at start is waited for, then
// the worker gives up as a worker (kUnavailable: it exits 1 and its pod is replaced), never as
// the job.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "agent/agent.h"

namespace vf::agent {
namespace {

using std::chrono::milliseconds;

class CredentialFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/vf-credential-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Written whole under another name, then renamed into place, as a kubelet updates a volume.
  void Write(const std::string& path, const std::string& text) {
    {
      std::ofstream out(path + ".tmp");
      out << text;
    }
    std::filesystem::rename(path + ".tmp", path);
  }

  std::string dir_;
};

TEST_F(CredentialFileTest, AReadableFileIsReadAsItIs) {
  const std::string path = dir_ + "/token";
  Write(path, "t0\n");
  Result<std::string> read = ReadCredentialFile(path, "the token", "w0", milliseconds(0));
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(*read, "t0\n");
}

TEST_F(CredentialFileTest, AFileThatAppearsWhileWaitedForIsRead) {
  const std::string path = dir_ + "/token";
  std::thread mount([&] {
    std::this_thread::sleep_for(milliseconds(300));
    Write(path, "t0");
  });
  Result<std::string> read = ReadCredentialFile(path, "the token", "w0", milliseconds(60000));
  mount.join();
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(*read, "t0");
}

TEST_F(CredentialFileTest, AFileStillMissingAfterThePatienceIsUnavailableNamingIt) {
  const std::string path = dir_ + "/ca.crt";
  Result<std::string> read = ReadCredentialFile(path, "the CA file", "w0", milliseconds(700));
  ASSERT_FALSE(read.ok());
  // Not kInvalidArgument or kNotFound, which would fail the job (exit 3).
  EXPECT_EQ(read.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(read.status().message().find("cannot read the CA file " + path +
                                         " (No such file or directory)"),
            std::string::npos)
      << read.status().message();
}

TEST_F(CredentialFileTest, AnEmptyFileIsWaitedForAsAMissingOneIs) {
  const std::string path = dir_ + "/token";
  Write(path, "");
  Result<std::string> read = ReadCredentialFile(path, "the token", "w0", milliseconds(600));
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(read.status().message().find("it is empty"), std::string::npos)
      << read.status().message();
}

}  // namespace
}  // namespace vf::agent
