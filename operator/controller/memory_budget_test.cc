#include "operator/controller/memory_budget.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace vf::controller {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(MemoryBudgetTest, BytesAndKubernetesQuantitiesParse) {
  EXPECT_EQ(ParseByteQuantity("0").value(), 0u);
  EXPECT_EQ(ParseByteQuantity("1048576").value(), kMiB);
  EXPECT_EQ(ParseByteQuantity("256Mi").value(), 256 * kMiB);
  EXPECT_EQ(ParseByteQuantity("1Gi").value(), kGiB);
  EXPECT_EQ(ParseByteQuantity("1.5Gi").value(), kGiB + kGiB / 2);
  EXPECT_EQ(ParseByteQuantity("64Ki").value(), 64u * 1024);
  EXPECT_EQ(ParseByteQuantity("2Ti").value(), 2 * 1024 * kGiB);
  EXPECT_EQ(ParseByteQuantity("500M").value(), 500'000'000u);
  EXPECT_EQ(ParseByteQuantity("2G").value(), 2'000'000'000u);
  EXPECT_EQ(ParseByteQuantity("3k").value(), 3000u);
  EXPECT_EQ(ParseByteQuantity("1E").value(), 1'000'000'000'000'000'000u);
  EXPECT_EQ(ParseByteQuantity("1e9").value(), 1'000'000'000u);
  EXPECT_EQ(ParseByteQuantity("1E3").value(), 1000u);
  EXPECT_EQ(ParseByteQuantity("0.5").value(), 1u);  // rounded up to whole bytes
  EXPECT_EQ(ParseByteQuantity("9223372036854775807").value(), uint64_t{9223372036854775807});
}

TEST(MemoryBudgetTest, AnythingElseIsRefusedNamingTheText) {
  for (const char* bad : {"",
                          "Mi",
                          "-1",
                          "-1Gi",
                          "1 Gi",
                          " 1Gi",
                          "1GiB",
                          "1gi",
                          "1mi",
                          "1m",
                          "1.2.3",
                          ".",
                          "1e",
                          "1e999",
                          "0x10",
                          "1Gi2",
                          "9223372036854775808",
                          "99999999999999999999",
                          "16Ei",
                          "1e20",
                          "abc"}) {
    Result<uint64_t> parsed = ParseByteQuantity(bad);
    EXPECT_FALSE(parsed.ok()) << "'" << bad << "' parsed as " << parsed.value();
    if (!parsed.ok()) {
      EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(parsed.status().message().find("'" + std::string(bad) + "'"), std::string::npos);
    }
  }
}

// A cgroup file system laid out under a temporary directory.
class CgroupTest : public testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("vf-cgroup-" + std::to_string(::getpid()) + "-" +
             testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(root_ / "memory");
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void Write(const std::string& file, const std::string& text) {
    std::ofstream(root_ / file) << text;
  }
  std::filesystem::path root_;
};

TEST_F(CgroupTest, CgroupV2sMemoryMaxIsTheLimit) {
  Write("memory.max", "536870912\n");
  EXPECT_EQ(CgroupMemoryLimit(root_.string()), std::optional<uint64_t>(512 * kMiB));
  Write("memory.max", "max\n");
  EXPECT_EQ(CgroupMemoryLimit(root_.string()), std::nullopt);
}

TEST_F(CgroupTest, CgroupV1sLimitInBytesIsTheLimitAndItsHugeValueIsNone) {
  Write("memory/memory.limit_in_bytes", "268435456\n");
  EXPECT_EQ(CgroupMemoryLimit(root_.string()), std::optional<uint64_t>(256 * kMiB));
  Write("memory/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(CgroupMemoryLimit(root_.string()), std::nullopt);
}

TEST_F(CgroupTest, NoCgroupFilesIsNoLimit) {
  EXPECT_EQ(CgroupMemoryLimit(root_.string()), std::nullopt);
  EXPECT_EQ(CgroupMemoryLimit((root_ / "absent").string()), std::nullopt);
  Write("memory.max", "garbage\n");
  EXPECT_EQ(CgroupMemoryLimit(root_.string()), std::nullopt);
}

TEST(MemoryBudgetTest, TheFlagWinsElseHalfTheContainersLimitCappedByTheDefault) {
  EXPECT_EQ(CoordinatorMemoryBudget(256 * kMiB, 4 * kGiB, kGiB), 256 * kMiB);
  EXPECT_EQ(CoordinatorMemoryBudget(4 * kGiB, std::nullopt, kGiB), 4 * kGiB);  // asked for
  EXPECT_EQ(CoordinatorMemoryBudget(std::nullopt, 512 * kMiB, kGiB), 256 * kMiB);
  EXPECT_EQ(CoordinatorMemoryBudget(std::nullopt, 8 * kGiB, kGiB), kGiB);
  EXPECT_EQ(CoordinatorMemoryBudget(std::nullopt, std::nullopt, kGiB), kGiB);
  EXPECT_EQ(CoordinatorMemoryBudget(std::nullopt, 1024, kGiB), kMiB);  // at least 1 MiB
  EXPECT_EQ(CoordinatorMemoryBudget(0, std::nullopt, kGiB), kMiB);
}

}  // namespace
}  // namespace vf::controller
