// The event recorder against an API server stand-in (operator/kube/test_util.h) that records
// every Event created and patched, and can say that an Event is gone.
#include "operator/controller/event_recorder.h"

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <vector>

#include "operator/kube/test_util.h"

namespace vf::controller {
namespace {

using kube::testing::Connection;
using kube::testing::FakeServer;
using kube::testing::Request;
using nlohmann::json;

// Creates Events as asked (answering with the Event), patches them unless told that they are
// gone (404), and records both. Thread-safe.
class EventApi {
 public:
  EventApi() : server_([this](const Request& r, Connection& c, std::stop_token) { Serve(r, c); }) {}

  std::string url() const { return server_.url(); }
  std::vector<json> created() {
    std::lock_guard<std::mutex> lock(mu_);
    return created_;
  }
  std::vector<json> patches() {
    std::lock_guard<std::mutex> lock(mu_);
    return patches_;
  }
  void ForgetEvents() {
    std::lock_guard<std::mutex> lock(mu_);
    events_gone_ = true;
  }

 private:
  void Serve(const Request& r, Connection& c) {
    std::lock_guard<std::mutex> lock(mu_);
    const json body = r.body.empty() ? json::object() : json::parse(r.body);
    if (r.method == "POST" && r.Path().ends_with("/events")) {
      created_.push_back(body);
      c.Respond(201, body.dump());
      return;
    }
    if (r.method == "PATCH" && r.Path().starts_with("/api/v1/namespaces/team/events/")) {
      if (events_gone_) {
        c.Respond(404, json({{"kind", "Status"},
                             {"apiVersion", "v1"},
                             {"status", "Failure"},
                             {"reason", "NotFound"},
                             {"code", 404}})
                           .dump());
        return;
      }
      patches_.push_back(body);
      c.Respond(200, body.dump());
      return;
    }
    c.Respond(404, "{}");
  }

  std::mutex mu_;
  std::vector<json> created_;
  std::vector<json> patches_;
  bool events_gone_ = false;
  FakeServer server_;
};

json Job(const std::string& uid) {
  return {{"apiVersion", "virtualflow.io/v1alpha1"},
          {"kind", "VirtualFlowJob"},
          {"metadata", {{"name", "mnist"}, {"namespace", "team"}, {"uid", uid}}}};
}

class EventRecorderTest : public testing::Test {
 protected:
  void SetUp() override {
    api_ = std::make_unique<EventApi>();
    kube::Config config;
    config.server = api_->url();
    client_ = kube::Client::Create(config).value();
  }

  std::unique_ptr<EventApi> api_;
  std::unique_ptr<kube::Client> client_;
};

TEST_F(EventRecorderTest, ARepeatIncrementsTheCountOfTheEventAlreadyRecorded) {
  EventRecorder recorder(*client_, kube::kVirtualFlowJobs);
  for (int i = 0; i < 3; ++i) {
    recorder.Record(Job("u-1"), kube::EventType::kWarning, "FailedCreatePod", "quota exceeded");
  }
  ASSERT_EQ(api_->created().size(), 1u);
  EXPECT_EQ(api_->created()[0].value("reason", ""), "FailedCreatePod");
  EXPECT_EQ(api_->created()[0].value("type", ""), "Warning");
  const std::vector<json> patches = api_->patches();
  ASSERT_EQ(patches.size(), 2u);
  EXPECT_EQ(patches[0].value("count", 0), 2);
  EXPECT_EQ(patches[1].value("count", 0), 3);
  EXPECT_TRUE(patches[1].contains("lastTimestamp"));
  EXPECT_EQ(recorder.series_count(), 1u);
}

TEST_F(EventRecorderTest, AnotherMessageTypeOrObjectIsAnotherEvent) {
  EventRecorder recorder(*client_, kube::kVirtualFlowJobs);
  recorder.Record(Job("u-1"), kube::EventType::kNormal, "Resized", "2 -> 3 workers");
  recorder.Record(Job("u-1"), kube::EventType::kNormal, "Resized", "3 -> 4 workers");
  recorder.Record(Job("u-1"), kube::EventType::kWarning, "Resized", "3 -> 4 workers");
  // The same name made again is another job: its Events are its own.
  recorder.Record(Job("u-2"), kube::EventType::kNormal, "Resized", "2 -> 3 workers");
  EXPECT_EQ(api_->created().size(), 4u);
  EXPECT_TRUE(api_->patches().empty());
  EXPECT_EQ(recorder.series_count(), 4u);
}

TEST_F(EventRecorderTest, AnEventTheApiServerNoLongerHasStartsANewSeries) {
  EventRecorder recorder(*client_, kube::kVirtualFlowJobs);
  recorder.Record(Job("u-1"), kube::EventType::kNormal, "Started", "started with 2 workers");
  api_->ForgetEvents();
  recorder.Record(Job("u-1"), kube::EventType::kNormal, "Started", "started with 2 workers");
  EXPECT_EQ(api_->created().size(), 2u);
  EXPECT_TRUE(api_->patches().empty());
  EXPECT_EQ(recorder.series_count(), 1u);
}

TEST_F(EventRecorderTest, TheOldestSeriesIsForgottenPastTheBound) {
  EventRecorder recorder(*client_, kube::kVirtualFlowJobs, /*max_series=*/2);
  recorder.Record(Job("u-1"), kube::EventType::kNormal, "A", "first");
  recorder.Record(Job("u-1"), kube::EventType::kNormal, "B", "second");
  recorder.Record(Job("u-1"), kube::EventType::kNormal, "C", "third");
  EXPECT_EQ(recorder.series_count(), 2u);
  // "A" was forgotten: its repeat is a new Event (which pushes "B" out); the next is counted.
  recorder.Record(Job("u-1"), kube::EventType::kNormal, "A", "first");
  recorder.Record(Job("u-1"), kube::EventType::kNormal, "A", "first");
  EXPECT_EQ(api_->created().size(), 4u);
  ASSERT_EQ(api_->patches().size(), 1u);
  EXPECT_EQ(recorder.series_count(), 2u);
  recorder.Record(Job("u-1"), kube::EventType::kNormal, "B", "second");
  EXPECT_EQ(api_->created().size(), 5u);
}

}  // namespace
}  // namespace vf::controller
