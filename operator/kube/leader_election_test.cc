// The leader elector against a scripted Lease API: acquisition, renewal, conflicts, expiry by
// observation, losing the Lease and releasing it. (tests/e2e/test_kube_client.py runs it against
// a real API server too.)
#include "operator/kube/leader_election.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/kube/test_util.h"

// See client_test.cc: cpprest's exit-time continuation, not a leak per request.
// NOLINTNEXTLINE(bugprone-reserved-identifier): the name LeakSanitizer looks up.
extern "C" const char* __lsan_default_suppressions() { return "leak:libcpprest.so\n"; }

namespace vf::kube {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::Connection;
using testing::FakeServer;
using testing::Request;
using Clock = std::chrono::steady_clock;

constexpr char kNs[] = "ops";
constexpr char kName[] = "vf-operator";
constexpr char kLeasePath[] = "/apis/coordination.k8s.io/v1/namespaces/ops/leases";

std::string StatusBody(const std::string& reason, int code, const std::string& message) {
  return json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Failure"},
              {"reason", reason}, {"message", message}, {"code", code}}
      .dump();
}

// One Lease behind GET, POST and PUT with resourceVersion checks, as the API server keeps it,
// plus knobs to make it misbehave. Thread-safe.
class FakeLeaseApi {
 public:
  FakeLeaseApi()
      : server_([this](const Request& request, Connection& c, std::stop_token) {
          Handle(request, c);
        }) {}

  std::string url() const { return server_.url(); }

  // Answers every request with 500 while set.
  void set_failing(bool failing) {
    std::lock_guard<std::mutex> lock(mu_);
    failing_ = failing;
  }
  // The next `n` PUTs get 409 Conflict whatever their version.
  void InjectConflicts(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    conflicts_ = n;
  }
  std::optional<json> lease() {
    std::lock_guard<std::mutex> lock(mu_);
    return lease_;
  }
  // Writes the Lease as another candidate would (a new version).
  void Put(json spec) {
    std::lock_guard<std::mutex> lock(mu_);
    lease_ = json{{"apiVersion", "coordination.k8s.io/v1"},
                  {"kind", "Lease"},
                  {"metadata", {{"name", kName}, {"namespace", kNs}}},
                  {"spec", std::move(spec)}};
    (*lease_)["metadata"]["resourceVersion"] = std::to_string(++version_);
  }
  // "GET", "POST", "PUT 409", ...: what was asked, with the code of answers other than 2xx.
  std::vector<std::string> log() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }
  int Count(const std::string& entry) {
    int n = 0;
    for (const std::string& e : log()) n += e == entry;
    return n;
  }

 private:
  void Handle(const Request& request, Connection& c) {
    std::lock_guard<std::mutex> lock(mu_);
    auto answer = [&](int code, const std::string& body) {
      log_.push_back(code / 100 == 2 ? request.method
                                     : request.method + " " + std::to_string(code));
      c.Respond(code, body);
    };
    if (failing_) {
      answer(500, StatusBody("InternalError", 500, "etcdserver: request timed out"));
      return;
    }
    const std::string path = request.Path();
    if (request.method == "POST" && path == kLeasePath) {
      if (lease_.has_value()) {
        answer(409, StatusBody("AlreadyExists", 409, "leases \"vf-operator\" already exists"));
        return;
      }
      lease_ = json::parse(request.body);
      (*lease_)["metadata"]["resourceVersion"] = std::to_string(++version_);
      answer(201, lease_->dump());
      return;
    }
    if (path != std::string(kLeasePath) + "/" + kName) {
      answer(404, StatusBody("NotFound", 404, "no such path"));
      return;
    }
    if (!lease_.has_value()) {
      answer(404, StatusBody("NotFound", 404, "leases \"vf-operator\" not found"));
      return;
    }
    if (request.method == "GET") {
      answer(200, lease_->dump());
      return;
    }
    if (request.method == "PUT") {
      json object = json::parse(request.body);
      if (conflicts_ > 0 || object["metadata"].value("resourceVersion", "") !=
                                (*lease_)["metadata"]["resourceVersion"]) {
        if (conflicts_ > 0) --conflicts_;
        answer(409, StatusBody("Conflict", 409,
                               "Operation cannot be fulfilled on leases.coordination.k8s.io "
                               "\"vf-operator\": the object has been modified"));
        return;
      }
      lease_ = std::move(object);
      (*lease_)["metadata"]["resourceVersion"] = std::to_string(++version_);
      answer(200, lease_->dump());
      return;
    }
    answer(405, StatusBody("MethodNotAllowed", 405, request.method));
  }

  std::mutex mu_;
  bool failing_ = false;
  int conflicts_ = 0;
  int version_ = 100;
  std::optional<json> lease_;
  std::vector<std::string> log_;
  FakeServer server_;  // last: its handler threads go before the state they touch
};

std::unique_ptr<Client> NewClient(const std::string& url) {
  Config config;
  config.server = url;
  Result<std::unique_ptr<Client>> client = Client::Create(config);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return std::move(client).value();
}

template <typename Done>
bool WaitFor(Done done, milliseconds timeout = milliseconds(10000)) {
  const Clock::time_point deadline = Clock::now() + timeout;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

// An elector on its own client and thread, recording its callbacks. Thread-safe.
class Candidate {
 public:
  Candidate(const std::string& url, const std::string& identity,
            std::chrono::milliseconds lease = seconds(1),
            std::chrono::milliseconds renew = milliseconds(800),
            std::chrono::milliseconds retry = milliseconds(100))
      : client_(NewClient(url)) {
    LeaderElectionConfig config;
    config.ns = kNs;
    config.name = kName;
    config.identity = identity;
    config.lease_duration = lease;
    config.renew_deadline = renew;
    config.retry_period = retry;
    config.on_started_leading = [this](std::stop_token leading) {
      ++started_;
      std::lock_guard<std::mutex> lock(mu_);
      term_ = leading;
    };
    config.on_stopped_leading = [this] {
      // The term's token is stopped before this is called.
      std::lock_guard<std::mutex> lock(mu_);
      term_stopped_first_ = term_.stop_requested();
      ++stopped_;
    };
    config.on_new_leader = [this](const std::string& leader) {
      std::lock_guard<std::mutex> lock(mu_);
      leaders_.push_back(leader);
    };
    config.log = [this](std::string_view message) {
      std::lock_guard<std::mutex> lock(mu_);
      logs_.emplace_back(message);
    };
    Result<std::unique_ptr<LeaderElector>> elector = LeaderElector::Create(*client_, config);
    EXPECT_TRUE(elector.ok()) << elector.status().ToString();
    elector_ = std::move(elector).value();
  }
  ~Candidate() { Stop(); }

  void Start() {
    result_ = std::async(std::launch::async, [this] { return elector_->Run(stop_.get_token()); });
  }
  void Stop() {
    stop_.request_stop();
    if (result_.valid()) result_.wait();
  }
  // Run's result, once it has returned within `timeout`.
  std::optional<Status> Outcome(milliseconds timeout = milliseconds(10000)) {
    if (final_.has_value()) return final_;
    if (!result_.valid() || result_.wait_for(timeout) != std::future_status::ready) {
      return std::nullopt;
    }
    final_ = result_.get();
    return final_;
  }

  LeaderElector& elector() { return *elector_; }
  int started() const { return started_.load(); }
  int stopped() const { return stopped_.load(); }
  bool term_stopped_first() {
    std::lock_guard<std::mutex> lock(mu_);
    return term_stopped_first_;
  }
  std::vector<std::string> leaders() {
    std::lock_guard<std::mutex> lock(mu_);
    return leaders_;
  }
  std::string logs() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string all;
    for (const std::string& line : logs_) all += line + "\n";
    return all;
  }

 private:
  std::unique_ptr<Client> client_;
  std::unique_ptr<LeaderElector> elector_;
  std::stop_source stop_;
  std::future<Status> result_;
  std::optional<Status> final_;
  std::atomic<int> started_{0};
  std::atomic<int> stopped_{0};
  std::mutex mu_;
  std::stop_token term_;
  bool term_stopped_first_ = false;
  std::vector<std::string> leaders_;
  std::vector<std::string> logs_;
};

// "2024-05-01T12:00:00.123456Z". (By hand: std::regex sets off GCC 12's maybe-uninitialized
// warning under ASan.)
bool IsMicroTime(const std::string& text) {
  const std::string shape = "dddd-dd-ddTdd:dd:dd.ddddddZ";
  if (text.size() != shape.size()) return false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 'd' ? !std::isdigit(static_cast<unsigned char>(text[i]))
                        : text[i] != shape[i]) {
      return false;
    }
  }
  return true;
}

TEST(LeaderElectionTest, FormatMicroTimeHasSixFractionalDigits) {
  const auto time = std::chrono::system_clock::time_point(seconds(1714564800)) +
                    std::chrono::microseconds(123456) + std::chrono::nanoseconds(789);
  EXPECT_EQ(FormatMicroTime(time), "2024-05-01T12:00:00.123456Z");
  EXPECT_EQ(FormatMicroTime(std::chrono::system_clock::time_point(seconds(1714564800))),
            "2024-05-01T12:00:00.000000Z");
}

TEST(LeaderElectionTest, CreateRefusesAnInconsistentConfiguration) {
  std::unique_ptr<Client> client = NewClient("http://127.0.0.1:1");
  LeaderElectionConfig good{.ns = "a", .name = "b", .identity = "c"};
  EXPECT_TRUE(LeaderElector::Create(*client, good).ok());
  auto refused = [&](auto change) {
    LeaderElectionConfig config = good;
    change(config);
    Result<std::unique_ptr<LeaderElector>> elector = LeaderElector::Create(*client, config);
    return !elector.ok() && elector.status().code() == StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(refused([](LeaderElectionConfig& c) { c.identity = ""; }));
  EXPECT_TRUE(refused([](LeaderElectionConfig& c) { c.name = ""; }));
  EXPECT_TRUE(refused([](LeaderElectionConfig& c) { c.renew_deadline = c.lease_duration; }));
  EXPECT_TRUE(refused([](LeaderElectionConfig& c) { c.retry_period = milliseconds(9000); }));
  EXPECT_TRUE(refused([](LeaderElectionConfig& c) { c.retry_period = milliseconds(0); }));
  EXPECT_TRUE(refused([](LeaderElectionConfig& c) {
    c.lease_duration = milliseconds(900);
    c.renew_deadline = milliseconds(500);
    c.retry_period = milliseconds(100);
  }));
}

TEST(LeaderElectionTest, CreatesAMissingLeaseAndLeads) {
  FakeLeaseApi api;
  Candidate a(api.url(), "a", seconds(2), milliseconds(1500), milliseconds(100));
  a.Start();
  ASSERT_TRUE(WaitFor([&] { return a.elector().IsLeader(); })) << a.logs();
  // on_started_leading runs on the elector's thread just after IsLeader turns true: wait for
  // it rather than race it (seen failing under TSan on a busy machine).
  ASSERT_TRUE(WaitFor([&] { return a.started() >= 1; })) << a.logs();
  EXPECT_EQ(a.started(), 1);
  EXPECT_EQ(a.elector().LeaderIdentity(), "a");
  EXPECT_EQ(a.leaders(), std::vector<std::string>{"a"});
  const json spec = (*api.lease())["spec"];
  EXPECT_EQ(spec["holderIdentity"], "a");
  EXPECT_EQ(spec["leaseDurationSeconds"], 2);
  EXPECT_EQ(spec["leaseTransitions"], 0);
  EXPECT_TRUE(IsMicroTime(spec["acquireTime"].get<std::string>())) << spec;
  EXPECT_TRUE(IsMicroTime(spec["renewTime"].get<std::string>())) << spec;
  const std::vector<std::string> log = api.log();
  ASSERT_GE(log.size(), 2u);
  EXPECT_EQ(log[0], "GET 404");
  EXPECT_EQ(log[1], "POST");
}

TEST(LeaderElectionTest, RenewsEveryRetryPeriodKeepingTheAcquireTime) {
  FakeLeaseApi api;
  Candidate a(api.url(), "a");
  a.Start();
  ASSERT_TRUE(WaitFor([&] { return a.elector().IsLeader(); })) << a.logs();
  const json first = (*api.lease())["spec"];
  std::this_thread::sleep_for(milliseconds(550));
  EXPECT_TRUE(a.elector().IsLeader());
  const json later = (*api.lease())["spec"];
  EXPECT_NE(later["renewTime"], first["renewTime"]);
  EXPECT_EQ(later["acquireTime"], first["acquireTime"]);
  EXPECT_EQ(later["leaseTransitions"], 0);
  // Renewals write the copy last written, without reading first.
  const int puts = api.Count("PUT");
  EXPECT_GE(puts, 3);
  EXPECT_LE(puts, 7);
  EXPECT_EQ(api.Count("GET"), 0);
}

TEST(LeaderElectionTest, AConflictOnRenewalIsReReadAndRetried) {
  FakeLeaseApi api;
  Candidate a(api.url(), "a");
  a.Start();
  ASSERT_TRUE(WaitFor([&] { return a.elector().IsLeader(); })) << a.logs();
  api.InjectConflicts(1);
  ASSERT_TRUE(WaitFor([&] { return api.Count("PUT 409") == 1 && api.Count("PUT") >= 2; }));
  // After the conflict: read the Lease, find it still ours, write it.
  std::vector<std::string> log = api.log();
  const auto conflict = std::find(log.begin(), log.end(), "PUT 409");
  ASSERT_NE(conflict, log.end());
  ASSERT_GE(log.end() - conflict, 3);
  EXPECT_EQ(*(conflict + 1), "GET");
  EXPECT_EQ(*(conflict + 2), "PUT");
  EXPECT_TRUE(a.elector().IsLeader());
  EXPECT_EQ(a.stopped(), 0);
  EXPECT_NE(a.logs().find("Conflict"), std::string::npos) << a.logs();
}

TEST(LeaderElectionTest, StopsLeadingWhenRenewalsFailForTheRenewDeadline) {
  FakeLeaseApi api;
  Candidate a(api.url(), "a");
  a.Start();
  ASSERT_TRUE(WaitFor([&] { return a.elector().IsLeader(); })) << a.logs();
  const Clock::time_point failing_since = Clock::now();
  api.set_failing(true);
  std::optional<Status> result = a.Outcome();
  ASSERT_TRUE(result.has_value());
  const auto took = Clock::now() - failing_since;
  EXPECT_EQ(result->code(), StatusCode::kUnavailable) << result->ToString();
  EXPECT_NE(result->message().find("not renewed within 800 ms"), std::string::npos)
      << result->ToString();
  EXPECT_NE(result->message().find("InternalError"), std::string::npos) << result->ToString();
  // renew_deadline after the last success, which was at most a retry period before.
  EXPECT_GE(took, milliseconds(600));
  EXPECT_LE(took, milliseconds(2000));
  EXPECT_FALSE(a.elector().IsLeader());
  EXPECT_EQ(a.started(), 1);
  EXPECT_EQ(a.stopped(), 1);
  EXPECT_TRUE(a.term_stopped_first());
  // Each failure was logged with the server's reason, and retried.
  EXPECT_NE(a.logs().find("InternalError: etcdserver: request timed out (HTTP 500)"),
            std::string::npos)
      << a.logs();
  EXPECT_GE(api.Count("PUT 500") + api.Count("GET 500"), 3);
}

TEST(LeaderElectionTest, IsLeaderTurnsFalseAtTheRenewDeadlineWhateverRunIsDoing) {
  FakeLeaseApi api;
  Candidate a(api.url(), "a");
  a.Start();
  ASSERT_TRUE(WaitFor([&] { return a.elector().IsLeader(); })) << a.logs();
  api.set_failing(true);
  const Clock::time_point failing_since = Clock::now();
  ASSERT_TRUE(WaitFor([&] { return !a.elector().IsLeader(); }));
  EXPECT_LE(Clock::now() - failing_since, milliseconds(1000));
}

TEST(LeaderElectionTest, StopsLeadingAtOnceWhenAnotherHolderIsSeen) {
  FakeLeaseApi api;
  Candidate a(api.url(), "a", seconds(2), milliseconds(1500), milliseconds(100));
  a.Start();
  ASSERT_TRUE(WaitFor([&] { return a.elector().IsLeader(); })) << a.logs();
  json spec = (*api.lease())["spec"];
  spec["holderIdentity"] = "b";
  api.Put(spec);
  std::optional<Status> result = a.Outcome(milliseconds(1000));
  ASSERT_TRUE(result.has_value()) << "still running";
  EXPECT_EQ(result->code(), StatusCode::kFailedPrecondition) << result->ToString();
  EXPECT_NE(result->message().find("now held by b"), std::string::npos) << result->ToString();
  EXPECT_FALSE(a.elector().IsLeader());
  EXPECT_EQ(a.stopped(), 1);
  EXPECT_EQ(a.leaders(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(a.elector().LeaderIdentity(), "b");
  // Not ours to release: b's record stands.
  EXPECT_EQ((*api.lease())["spec"]["holderIdentity"], "b");
}

TEST(LeaderElectionTest, WaitsOutAnUnrenewedLeaseByItsOwnClockThenTakesItOver) {
  FakeLeaseApi api;
  // Written long ago by the holder's clock: that must not make it expired to us.
  api.Put(json{{"holderIdentity", "old"},
               {"leaseDurationSeconds", 1},
               {"acquireTime", "2001-01-01T00:00:00.000000Z"},
               {"renewTime", "2001-01-01T00:00:00.000000Z"},
               {"leaseTransitions", 4}});
  Candidate a(api.url(), "a");
  const Clock::time_point start = Clock::now();
  a.Start();
  ASSERT_TRUE(WaitFor([&] { return a.elector().IsLeader(); })) << a.logs();
  EXPECT_GE(Clock::now() - start, milliseconds(1000));
  const json spec = (*api.lease())["spec"];
  EXPECT_EQ(spec["holderIdentity"], "a");
  EXPECT_EQ(spec["leaseTransitions"], 5);
  EXPECT_NE(spec["acquireTime"], "2001-01-01T00:00:00.000000Z");
  EXPECT_EQ(a.leaders(), (std::vector<std::string>{"old", "a"}));
}

TEST(LeaderElectionTest, NeverTakesOverALeaseItsHolderKeepsRenewing) {
  FakeLeaseApi api;
  std::atomic<bool> renewing{true};
  std::thread holder([&] {
    for (int i = 0; renewing; ++i) {
      api.Put(json{{"holderIdentity", "b"},
                   {"leaseDurationSeconds", 1},
                   {"renewTime", FormatMicroTime(std::chrono::system_clock::now())},
                   {"leaseTransitions", 0}});
      std::this_thread::sleep_for(milliseconds(200));
    }
  });
  Candidate a(api.url(), "a");
  a.Start();
  std::this_thread::sleep_for(milliseconds(2500));
  EXPECT_EQ(a.started(), 0);
  EXPECT_FALSE(a.elector().IsLeader());
  EXPECT_EQ(a.elector().LeaderIdentity(), "b");
  renewing = false;
  holder.join();
  // Once b stops renewing, a takes over after the lease duration.
  ASSERT_TRUE(WaitFor([&] { return a.elector().IsLeader(); }, milliseconds(5000))) << a.logs();
  a.Stop();
  EXPECT_EQ(a.stopped(), 1);
}

TEST(LeaderElectionTest, StoppedWithoutEverLeadingCallsNoCallbacks) {
  FakeLeaseApi api;
  api.Put(json{{"holderIdentity", "b"}, {"leaseDurationSeconds", 60}});
  Candidate a(api.url(), "a");
  a.Start();
  ASSERT_TRUE(WaitFor([&] { return a.leaders() == std::vector<std::string>{"b"}; }));
  a.Stop();
  std::optional<Status> result = a.Outcome();
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(result->ok()) << result->ToString();
  EXPECT_EQ(a.started(), 0);
  EXPECT_EQ(a.stopped(), 0);
  // Nothing to release either.
  EXPECT_EQ((*api.lease())["spec"]["holderIdentity"], "b");
  EXPECT_EQ(api.Count("PUT"), 0);
}

TEST(LeaderElectionTest, ReleasesOnStopSoThatASuccessorTakesOverAtOnce) {
  FakeLeaseApi api;
  Candidate a(api.url(), "a", seconds(10), seconds(5), milliseconds(100));
  a.Start();
  ASSERT_TRUE(WaitFor([&] { return a.elector().IsLeader(); })) << a.logs();
  Candidate b(api.url(), "b", seconds(10), seconds(5), milliseconds(100));
  b.Start();
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_FALSE(b.elector().IsLeader());
  a.Stop();
  ASSERT_TRUE(a.Outcome().has_value());
  EXPECT_TRUE(a.Outcome()->ok()) << a.Outcome()->ToString();
  EXPECT_EQ(a.stopped(), 1);
  EXPECT_FALSE(a.elector().IsLeader());
  // Well before the 10 s lease would have run out.
  const Clock::time_point released = Clock::now();
  ASSERT_TRUE(WaitFor([&] { return b.elector().IsLeader(); }, milliseconds(3000))) << b.logs();
  EXPECT_LT(Clock::now() - released, milliseconds(1000));
  const json spec = (*api.lease())["spec"];
  EXPECT_EQ(spec["holderIdentity"], "b");
  EXPECT_EQ(spec["leaseTransitions"], 1);
}

TEST(LeaderElectionTest, ServerErrorsWhileCampaigningAreLoggedAndRetried) {
  FakeLeaseApi api;
  api.set_failing(true);
  Candidate a(api.url(), "a");
  a.Start();
  ASSERT_TRUE(WaitFor([&] { return api.Count("GET 500") >= 2; })) << a.logs();
  EXPECT_FALSE(a.elector().IsLeader());
  api.set_failing(false);
  ASSERT_TRUE(WaitFor([&] { return a.elector().IsLeader(); })) << a.logs();
  EXPECT_NE(a.logs().find("reading the lease failed: get leases.coordination.k8s.io ops/"
                          "vf-operator: InternalError"),
            std::string::npos)
      << a.logs();
}

TEST(LeaderElectionTest, OfTwoCandidatesExactlyOneLeads) {
  FakeLeaseApi api;
  Candidate a(api.url(), "a");
  Candidate b(api.url(), "b");
  a.Start();
  b.Start();
  ASSERT_TRUE(WaitFor([&] { return a.elector().IsLeader() || b.elector().IsLeader(); }));
  for (int i = 0; i < 20; ++i) {
    EXPECT_NE(a.elector().IsLeader(), b.elector().IsLeader());
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(a.started() + b.started(), 1);
}

}  // namespace
}  // namespace vf::kube
