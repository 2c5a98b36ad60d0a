// The leader label (leader_label.h) against an API server stand-in (operator/kube/test_util.h):
// what is patched, and which failures count. tests/e2e/test_chart.py checks it on real pods behind
// the chart's Service.
#include "operator/controller/leader_label.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/kube/test_util.h"

namespace vf::controller {
namespace {

using kube::testing::Connection;
using kube::testing::FakeServer;
using kube::testing::Request;
using nlohmann::json;
using std::chrono::milliseconds;

constexpr char kPodPath[] = "/api/v1/namespaces/ops/pods/operator-0";

// Answers PATCHes of kPodPath with the codes given, one per request (the last one repeats), and
// records the patches. Thread-safe.
class PodApi {
 public:
  explicit PodApi(std::vector<int> codes)
      : codes_(std::move(codes)),
        server_([this](const Request& r, Connection& c, std::stop_token) { Serve(r, c); }) {}

  std::unique_ptr<kube::Client> Client() const {
    kube::Config config;
    config.server = server_.url();
    return kube::Client::Create(config).value();
  }
  std::vector<json> patches() {
    std::lock_guard<std::mutex> lock(mu_);
    return patches_;
  }
  std::vector<std::string> content_types() {
    std::lock_guard<std::mutex> lock(mu_);
    return content_types_;
  }

 private:
  void Serve(const Request& r, Connection& c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (r.method != "PATCH" || r.Path() != kPodPath) {
      c.Respond(405, R"({"kind": "Status", "reason": "MethodNotAllowed", "code": 405})");
      return;
    }
    patches_.push_back(json::parse(r.body));
    content_types_.push_back(r.Header("Content-Type"));
    const int code = codes_[std::min(patches_.size(), codes_.size()) - 1];
    if (code == 200) {
      c.Respond(200, R"({"kind": "Pod", "metadata": {"name": "operator-0"}})");
    } else if (code == 404) {
      c.Respond(404, R"({"kind": "Status", "reason": "NotFound", "code": 404})");
    } else {
      c.Respond(code, R"({"kind": "Status", "reason": "Forbidden", "message": "no", "code": 403})");
    }
  }

  const std::vector<int> codes_;
  std::mutex mu_;
  std::vector<json> patches_;
  std::vector<std::string> content_types_;
  FakeServer server_;  // last: it stops serving before the rest goes away
};

const OwnPod kPod{"ops", "operator-0"};

TEST(LeaderLabelTest, TheLeaderSetsTheLabelAndTakesItOffWithAMergePatch) {
  PodApi api({200});
  auto client = api.Client();
  ASSERT_TRUE(MarkLeader(*client, kPod, true, milliseconds(5000)).ok());
  ASSERT_TRUE(MarkLeader(*client, kPod, false, milliseconds(5000)).ok());
  const std::vector<json> patches = api.patches();
  ASSERT_EQ(patches.size(), 2u);
  EXPECT_EQ(patches[0],
            json::parse(R"({"metadata": {"labels": {"virtualflow.io/leader": "true"}}})"));
  // null deletes the key: a standby carries no leader label at all.
  EXPECT_EQ(patches[1],
            json::parse(R"({"metadata": {"labels": {"virtualflow.io/leader": null}}})"));
  EXPECT_EQ(api.content_types()[0], "application/merge-patch+json");
}

TEST(LeaderLabelTest, APodThatDoesNotExistIsSuccessAndNoPodIsNoRequest) {
  PodApi api({404});
  auto client = api.Client();
  EXPECT_TRUE(MarkLeader(*client, kPod, true, milliseconds(5000)).ok());
  EXPECT_TRUE(MarkLeader(*client, OwnPod{}, true, milliseconds(5000)).ok());
  EXPECT_TRUE(MarkLeader(*client, OwnPod{"ops", ""}, false, milliseconds(5000)).ok());
  EXPECT_EQ(api.patches().size(), 1u);
}

TEST(LeaderLabelTest, AForbiddenPatchIsAnErrorNamingThePod) {
  PodApi api({403});
  auto client = api.Client();
  Status s = MarkLeader(*client, kPod, true, milliseconds(5000));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("setting the leader label of pod ops/operator-0"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("Forbidden"), std::string::npos) << s.message();
}

TEST(LeaderLabelTest, FailuresAreRetriedUntilThePatchIsTaken) {
  PodApi api({403, 403, 200});
  auto client = api.Client();
  std::vector<std::string> logged;
  // The pause bounds each attempt too: 10 ms once left a loaded machine's call without its
  // answer (two patches seen, not three).
  Status s = MarkLeaderUntilDone(*client, kPod, false, milliseconds(500), std::stop_token{},
                                 [&](std::string_view line) { logged.emplace_back(line); });
  EXPECT_TRUE(s.ok()) << s.message();
  std::string lines;
  for (const std::string& line : logged) lines += line + "\n";
  EXPECT_EQ(api.patches().size(), 3u) << lines;
  ASSERT_EQ(logged.size(), 2u);
  EXPECT_NE(logged[0].find("removing the leader label of pod ops/operator-0"), std::string::npos)
      << logged[0];
}

TEST(LeaderLabelTest, RetriesEndWhenStopped) {
  PodApi api({403});
  auto client = api.Client();
  std::stop_source stop;
  int failures = 0;
  Status s = MarkLeaderUntilDone(*client, kPod, true, milliseconds(10), stop.get_token(),
                                 [&](std::string_view) {
                                   if (++failures == 3) stop.request_stop();
                                 });
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(failures, 3);
}

}  // namespace
}  // namespace vf::controller
