#include "runtime/comm/store.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace vf {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kShort(50);
constexpr milliseconds kLong(10000);

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = testing::TempDir() + "vf_store_test_XXXXXX";
    const char* made = mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr) << "mkdtemp " << pattern;
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The same behaviour is expected of every store; each test runs against both kinds.
enum class Kind { kMemory, kFile };

std::string KindName(const testing::TestParamInfo<Kind>& param) {
  return param.param == Kind::kMemory ? "Memory" : "File";
}

class StoreTest : public testing::TestWithParam<Kind> {
 protected:
  StoreTest() {
    if (GetParam() == Kind::kMemory) {
      store_ = std::make_unique<MemoryStore>();
    } else {
      store_ = std::make_unique<FileStore>(dir_.path());
    }
  }

  TempDir dir_;
  std::unique_ptr<Store> store_;
};

TEST_P(StoreTest, GetReturnsWhatWasSet) {
  ASSERT_TRUE(store_->Set("a", "hello").ok());
  Result<std::string> got = store_->Get("a", kShort);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "hello");
}

TEST_P(StoreTest, ValuesMayHoldAnyBytes) {
  const std::string value("a\0b\xff\n", 5);
  ASSERT_TRUE(store_->Set("bin", value).ok());
  Result<std::string> got = store_->Get("bin", kShort);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, value);
  ASSERT_TRUE(store_->Set("empty", "").ok());
  got = store_->Get("empty", kShort);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "");
}

TEST_P(StoreTest, SetReplacesEarlierValue) {
  ASSERT_TRUE(store_->Set("a", "first").ok());
  ASSERT_TRUE(store_->Set("a", "second").ok());
  Result<std::string> got = store_->Get("a", kShort);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "second");
}

TEST_P(StoreTest, GetWaitsForSetFromAnotherThread) {
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(30));
    EXPECT_TRUE(store_->Set("late", "value").ok());
  });
  Result<std::string> got = store_->Get("late", kLong);
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "value");
}

TEST_P(StoreTest, GetTimesOutNamingTheKey) {
  const auto start = std::chrono::steady_clock::now();
  Result<std::string> got = store_->Get("missing", kShort);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(got.status().message(), "timed out after 50ms waiting for store key(s) 'missing'");
  EXPECT_GE(elapsed, kShort);
  EXPECT_LT(elapsed, milliseconds(5000));
}

TEST_P(StoreTest, WaitReturnsOnceEveryKeyIsSet) {
  std::thread setter([&] {
    for (const char* key : {"x", "y", "z"}) {
      std::this_thread::sleep_for(milliseconds(10));
      EXPECT_TRUE(store_->Set(key, "1").ok());
    }
  });
  Status waited = store_->Wait({"x", "y", "z"}, kLong);
  setter.join();
  EXPECT_TRUE(waited.ok()) << waited.ToString();
}

TEST_P(StoreTest, WaitTimesOutNamingOnlyTheMissingKeys) {
  ASSERT_TRUE(store_->Set("b", "1").ok());
  Status waited = store_->Wait({"a", "b", "c"}, kShort);
  EXPECT_EQ(waited.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(waited.message(), "timed out after 50ms waiting for store key(s) 'a', 'c'");
}

TEST_P(StoreTest, ZeroTimeoutStillSeesExistingKey) {
  ASSERT_TRUE(store_->Set("a", "1").ok());
  EXPECT_TRUE(store_->Get("a", milliseconds(0)).ok());
  EXPECT_TRUE(store_->Wait({"a"}, milliseconds(0)).ok());
  EXPECT_EQ(store_->Get("b", milliseconds(0)).status().code(), StatusCode::kDeadlineExceeded);
}

TEST_P(StoreTest, KeysWithSlashesAndOddCharactersAreDistinct) {
  const std::vector<std::string> keys = {"a/b", "a%2Fb", "a_b", "../escape", ".",
                                         "..",  "",      "a b", "%",         "\xc3\xa9/\n"};
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(store_->Set(keys[i], std::to_string(i)).ok()) << "key '" << keys[i] << "'";
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    Result<std::string> got = store_->Get(keys[i], kShort);
    ASSERT_TRUE(got.ok()) << "key '" << keys[i] << "': " << got.status().ToString();
    EXPECT_EQ(*got, std::to_string(i)) << "key '" << keys[i] << "'";
  }
}

TEST_P(StoreTest, PrefixStoresSharingAStoreAreIsolated) {
  PrefixStore epoch1("epoch1", *store_);
  PrefixStore epoch2("epoch2", *store_);
  ASSERT_TRUE(epoch1.Set("addr", "one").ok());
  ASSERT_TRUE(epoch2.Set("addr", "two").ok());

  Result<std::string> got1 = epoch1.Get("addr", kShort);
  Result<std::string> got2 = epoch2.Get("addr", kShort);
  ASSERT_TRUE(got1.ok()) << got1.status().ToString();
  ASSERT_TRUE(got2.ok()) << got2.status().ToString();
  EXPECT_EQ(*got1, "one");
  EXPECT_EQ(*got2, "two");

  // The keys really live under the prefix in the shared store.
  Result<std::string> raw = store_->Get("epoch1/addr", kShort);
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  EXPECT_EQ(*raw, "one");

  ASSERT_TRUE(epoch1.Set("only1", "x").ok());
  EXPECT_EQ(epoch2.Get("only1", kShort).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(epoch1.Wait({"addr", "only1"}, kShort).ok());
  Status waited = epoch2.Wait({"addr", "only1"}, kShort);
  EXPECT_EQ(waited.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(waited.message().find("only1"), std::string::npos) << waited.message();
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreTest, testing::Values(Kind::kMemory, Kind::kFile),
                         KindName);

TEST(FileStore, TwoStoresOnOneDirectorySeeEachOthersKeys) {
  TempDir dir;
  FileStore writer(dir.path());
  FileStore reader(dir.path());
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(30));
    EXPECT_TRUE(writer.Set("job/epoch3/rank_1", "10.0.0.7:4242").ok());
  });
  Result<std::string> got = reader.Get("job/epoch3/rank_1", kLong);
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "10.0.0.7:4242");
  EXPECT_TRUE(reader.Wait({"job/epoch3/rank_1"}, kShort).ok());
}

TEST(FileStore, KeysWithSlashesStayInsideTheDirectory) {
  TempDir dir;
  FileStore store(dir.path());
  ASSERT_TRUE(store.Set("a/b/c", "1").ok());
  ASSERT_TRUE(store.Set("../outside", "2").ok());
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_TRUE(entry.is_regular_file()) << entry.path();
    ++files;
  }
  EXPECT_EQ(files, 2u);
  EXPECT_FALSE(
      std::filesystem::exists(std::filesystem::path(dir.path()).parent_path() / "outside"));
}

TEST(FileStore, ReaderNeverSeesAPartialValue) {
  TempDir dir;
  FileStore writer(dir.path());
  FileStore reader(dir.path());
  // Large enough that a non-atomic write would be observed half done.
  const std::string a(1 << 20, 'a');
  const std::string b(1 << 20, 'b');
  ASSERT_TRUE(writer.Set("big", a).ok());

  std::atomic<bool> done{false};
  std::thread writing([&] {
    for (int i = 0; i < 100; ++i) {
      EXPECT_TRUE(writer.Set("big", i % 2 == 0 ? b : a).ok());
    }
    done = true;
  });
  int reads = 0;
  std::string bad;  // The first value that was neither a nor b.
  while ((!done || reads < 10) && bad.empty()) {
    Result<std::string> got = reader.Get("big", kLong);
    if (!got.ok()) {
      bad = got.status().ToString();
    } else if (*got != a && *got != b) {
      bad = "a value of " + std::to_string(got->size()) + " bytes starting '" + got->substr(0, 8) +
            "'";
    }
    ++reads;
  }
  writing.join();
  EXPECT_EQ(bad, "") << "after " << reads << " reads";

  // Temporary files are renamed away, not left behind.
  size_t files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    ++files;
  }
  EXPECT_EQ(files, 1u);
}

TEST(FileStore, SetIntoMissingDirectoryReportsThePath) {
  FileStore store("/nonexistent/vf-store-dir");
  Status set = store.Set("a", "1");
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.message().find("/nonexistent/vf-store-dir"), std::string::npos) << set.message();
  EXPECT_NE(set.message().find("No such file or directory"), std::string::npos) << set.message();
}

TEST(MemoryStore, ManyWaitersAreAllWokenBySet) {
  MemoryStore store;
  std::vector<std::thread> waiters;
  std::atomic<int> woken{0};
  for (int i = 0; i < 8; ++i) {
    waiters.emplace_back([&] {
      if (store.Get("go", kLong).ok()) ++woken;
    });
  }
  std::this_thread::sleep_for(milliseconds(20));
  ASSERT_TRUE(store.Set("go", "1").ok());
  for (std::thread& t : waiters) t.join();
  EXPECT_EQ(woken, 8);
}

}  // namespace
}  // namespace vf
