// The job key (job_key.h): how a job's secret is derived from it, and how the key's Secret is
// read and made, against an API server stand-in (operator/kube/test_util.h). The real API server
// holds it in tests/e2e (test_operator.py, test_chart.py).
#include "operator/controller/job_key.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "operator/kube/test_util.h"

namespace vf::controller {
namespace {

using kube::testing::Connection;
using kube::testing::FakeServer;
using kube::testing::Request;
using nlohmann::json;

constexpr char kKey[] = "0123456789abcdef0123456789abcdef";
constexpr char kPath[] = "/api/v1/namespaces/ops/secrets/virtualflow-job-key";

TEST(JobKeyTest, AJobsSecretIsHmacSha256OfItsUidKeyedWithTheKey) {
  const std::string secret = DeriveJobSecret(kKey, "uid-1").value();
  EXPECT_EQ(secret.size(), 64u);  // 32 bytes in hex
  // The same for every replica and after every restart; another for another job or key.
  EXPECT_EQ(DeriveJobSecret(kKey, "uid-1").value(), secret);
  EXPECT_NE(DeriveJobSecret(kKey, "uid-2").value(), secret);
  EXPECT_NE(DeriveJobSecret("fedcba9876543210fedcba9876543210", "uid-1").value(), secret);
  // printf virtualflow.io/job-secret/uid-1 |
  //   openssl dgst -sha256 -hmac 0123456789abcdef0123456789abcdef
  EXPECT_EQ(secret, "2355ac4c835e2f79b05c686013f2e54a00ac2dbe4f2e5f6f2e260b61395a9d19");
}

TEST(JobKeyTest, NoSecretWithoutAFullKeyOrAUid) {
  EXPECT_EQ(DeriveJobSecret("short", "uid-1").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(DeriveJobSecret(kKey, "").status().code(), StatusCode::kInvalidArgument);
}

// Serves one Secret at kPath: absent until created (or `taken` by another replica at the first
// create), then what was created. Thread-safe.
class SecretApi {
 public:
  explicit SecretApi(std::optional<json> secret, bool taken = false)
      : secret_(std::move(secret)),
        taken_(taken),
        server_([this](const Request& r, Connection& c, std::stop_token) { Serve(r, c); }) {}

  std::string url() const { return server_.url(); }
  int creates() {
    std::lock_guard<std::mutex> lock(mu_);
    return creates_;
  }

 private:
  void Serve(const Request& r, Connection& c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (r.method == "GET" && r.target == kPath) {
      if (!secret_) {
        c.Respond(404, R"({"kind": "Status", "reason": "NotFound", "code": 404})");
      } else {
        c.Respond(200, secret_->dump());
      }
      return;
    }
    if (r.method == "POST" && r.target == "/api/v1/namespaces/ops/secrets") {
      ++creates_;
      if (taken_) {
        // Another replica's create won: its Secret is there now.
        secret_ = json{{"data", {{"key", "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA="}}}};
        c.Respond(409, R"({"kind": "Status", "reason": "AlreadyExists", "code": 409})");
        return;
      }
      json body = json::parse(r.body);
      const std::string key = body["stringData"]["key"];
      // The API server answers with the data base64-encoded.
      std::string b64(4 * ((key.size() + 2) / 3) + 1, '\0');
      const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(b64.data()),
                                    reinterpret_cast<const unsigned char*>(key.data()),
                                    static_cast<int>(key.size()));
      b64.resize(static_cast<size_t>(n));
      body.erase("stringData");
      body["data"] = {{"key", b64}};
      secret_ = body;
      c.Respond(201, body.dump());
      return;
    }
    c.Respond(404, R"({"kind": "Status", "reason": "NotFound", "code": 404})");
  }

  std::mutex mu_;
  std::optional<json> secret_;
  bool taken_;
  int creates_ = 0;
  FakeServer server_;  // last: it stops serving before the rest goes away
};

std::unique_ptr<kube::Client> ClientOf(const SecretApi& api) {
  kube::Config config;
  config.server = api.url();
  return kube::Client::Create(config).value();
}

TEST(JobKeyTest, AFirstStartMakesARandomKeyThatLaterStartsRead) {
  SecretApi api(std::nullopt);
  auto client = ClientOf(api);
  const std::string key = EnsureJobKey(*client, "ops", "virtualflow-job-key").value();
  EXPECT_EQ(key.size(), 64u);
  EXPECT_EQ(key.find_first_not_of("0123456789abcdef"), std::string::npos) << key;
  // A restart reads the same key, and makes none.
  EXPECT_EQ(EnsureJobKey(*client, "ops", "virtualflow-job-key").value(), key);
  EXPECT_EQ(api.creates(), 1);
  // Another operator's first start makes another key.
  SecretApi other(std::nullopt);
  EXPECT_NE(EnsureJobKey(*ClientOf(other), "ops", "virtualflow-job-key").value(), key);
}

TEST(JobKeyTest, AReplicaThatLosesTheCreateTakesTheWinnersKey) {
  SecretApi api(std::nullopt, /*taken=*/true);
  auto client = ClientOf(api);
  EXPECT_EQ(EnsureJobKey(*client, "ops", "virtualflow-job-key").value(),
            "fedcba9876543210fedcba9876543210");
}

TEST(JobKeyTest, AShortKeyIsRefusedAndNeverReplaced) {
  SecretApi api(json{{"data", {{"key", "c2hvcnQ="}}}});  // "short"
  auto client = ClientOf(api);
  Result<std::string> key = EnsureJobKey(*client, "ops", "virtualflow-job-key");
  ASSERT_FALSE(key.ok());
  EXPECT_EQ(key.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(key.status().message().find("ops/virtualflow-job-key: 'key' holds 5 bytes"),
            std::string::npos)
      << key.status().message();
  EXPECT_EQ(api.creates(), 0);
}

}  // namespace
}  // namespace vf::controller
