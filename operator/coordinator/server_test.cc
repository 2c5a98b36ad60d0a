// The coordinator over real HTTP on 127.0.0.1: the server, the agent's client, and raw sockets
// for the requests a well-behaved client would never send.
#include "operator/coordinator/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/http/tls.h"
#include "agent/protocol/client.h"
#include "operator/coordinator/coordinator.h"
#include "operator/coordinator/test_util.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"

// When a process exits right after a listener closed, cpprest can still have a continuation of
// its own connection handling queued on its thread pool, and LeakSanitizer reports it. A bare
// listener shows the same, and thousands of requests in one process leak nothing, so it is not
// a per-request leak.
// NOLINTNEXTLINE(bugprone-reserved-identifier): the name LeakSanitizer looks up.
extern "C" const char* __lsan_default_suppressions() { return "leak:libcpprest.so\n"; }
// The credential check (HMAC) runs on cpprest's threads, where OpenSSL keeps per-thread state
// that the never-joined pool never frees. libcrypto has no frame pointers, so the default fast
// unwinder stops inside it and the suppression above cannot see the cpprest frames: full
// unwinding lets it match those allocations, and only those.
// NOLINTNEXTLINE(bugprone-reserved-identifier): the name AddressSanitizer looks up.
extern "C" const char* __asan_default_options() { return "fast_unwind_on_malloc=0"; }

namespace vf {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

// The jobs' secrets; workers hold credentials derived from them (WorkerCredential).
constexpr char kJob[] = "team/mnist";
constexpr char kToken[] = "token-a";
constexpr char kOtherJob[] = "team/other";
constexpr char kOtherToken[] = "token-b";
constexpr char kWorkerHeader[] = "X-VirtualFlow-Worker";
constexpr char kFingerprint[] = "fp-1";
constexpr char kBuild[] = "build-1";

// ---- Raw HTTP over a socket ----

struct RawReply {
  int status = 0;
  std::string headers;
  std::string body;
};

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval timeout{};
  timeout.tv_sec = 60;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

int FreeLowPort() { return coordinator_test::FreeLowPort(20000); }

std::string DecodeChunked(const std::string& body) {
  std::string out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t eol = body.find("\r\n", pos);
    if (eol == std::string::npos) break;
    const size_t length = std::stoul(body.substr(pos, eol - pos), nullptr, 16);
    if (length == 0) break;
    out += body.substr(eol + 2, length);
    pos = eol + 2 + length + 2;
  }
  return out;
}

// Sends `request` as it is and reads the reply until the server closes the connection.
RawReply RawHttp(int port, const std::string& request) {
  RawReply reply;
  const int fd = Connect(port);
  if (fd < 0) return reply;
  SendAll(fd, request);
  std::string data;
  char buffer[65536];
  while (true) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  const size_t end = data.find("\r\n\r\n");
  if (data.size() < 12 || end == std::string::npos) return reply;
  reply.status = std::stoi(data.substr(9, 3));
  reply.headers = data.substr(0, end);
  reply.body = data.substr(end + 4);
  if (reply.headers.find("Transfer-Encoding: chunked") != std::string::npos) {
    reply.body = DecodeChunked(reply.body);
  }
  return reply;
}

std::string Credential(const std::string& secret, const std::string& worker) {
  return WorkerCredential(secret, worker).value();
}

// The headers that make a request `worker`'s: its name and its credential in the job whose
// secret is `secret`.
std::string AuthHeaders(const std::string& secret, const std::string& worker) {
  return "Authorization: Bearer " + Credential(secret, worker) + "\r\n" + kWorkerHeader + ": " +
         worker + "\r\n";
}

// The worker a JSON body names, else w-0: the one a well-behaved client would speak for.
std::string BodyWorker(const std::string& body) {
  const json parsed = json::parse(body, nullptr, false);
  if (parsed.is_object() && parsed.contains("worker") && parsed["worker"].is_string()) {
    return parsed["worker"].get<std::string>();
  }
  return "w-0";
}

// A request as `as` (default: the worker its body names) with that worker's credential in the
// job whose secret is `secret`; no credential and no worker header at all for a null secret.
std::string Request(const std::string& method, const std::string& path, const char* secret,
                    const std::string& body = "", const std::string& extra_headers = "",
                    const std::string& as = "") {
  std::string request = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  request += "Connection: close\r\n";
  if (secret != nullptr) request += AuthHeaders(secret, as.empty() ? BodyWorker(body) : as);
  request += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  request += extra_headers + "\r\n" + body;
  return request;
}

std::string JobPath(const std::string& job, const std::string& action) {
  return "/v1/jobs/" + job + "/" + action;
}

// Checks the status and that the body is exactly {"error": "<one line containing `part`>"}.
void ExpectError(const RawReply& reply, int status, const std::string& part) {
  EXPECT_EQ(reply.status, status) << reply.headers << "\n" << reply.body;
  const json body = json::parse(reply.body, nullptr, false);
  ASSERT_TRUE(body.is_object()) << reply.status << " " << reply.headers << "\n" << reply.body;
  ASSERT_EQ(body.size(), 1u) << reply.body;
  ASSERT_TRUE(body.contains("error") && body["error"].is_string()) << reply.body;
  const std::string message = body["error"].get<std::string>();
  EXPECT_NE(message.find(part), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

std::string RegisterBody(const std::string& worker, const std::string& fingerprint = kFingerprint,
                         const std::string& build = kBuild) {
  return json{{"worker", worker}, {"fingerprint", fingerprint}, {"build", build}, {"ready", true}}
      .dump();
}

std::string ReportBody(const std::string& worker, int64_t epoch) {
  return json{{"worker", worker},
              {"epoch", epoch},
              {"step", 3},
              {"loss", 0.25},
              {"samplesPerSecond", 1000.0},
              {"secondsPerVirtualNode", 0.002},
              {"hasState", true}}
      .dump();
}

std::vector<Member> Members(int n) {
  std::vector<Member> members;
  for (int i = 0; i < n; ++i) members.push_back({"w-" + std::to_string(i), i, {2 * i, 2 * i + 1}});
  return members;
}

class ServerTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(coordinator_.AddJob(kJob, kToken, kFingerprint, kBuild).ok());
    ASSERT_TRUE(coordinator_.AddJob(kOtherJob, kOtherToken, kFingerprint, kBuild).ok());
    Result<std::unique_ptr<CoordinatorServer>> server =
        CoordinatorServer::Start(coordinator_, "127.0.0.1", 0);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Stop();
  }

  std::unique_ptr<CoordinatorClient> Client(const std::string& worker,
                                            const std::string& job = kJob,
                                            const std::string& token = kToken,
                                            milliseconds timeout = milliseconds(5000)) {
    return std::make_unique<CoordinatorClient>(server_->url(), job, Credential(token, worker),
                                               worker, timeout);
  }

  RawReply Raw(const std::string& request) { return RawHttp(server_->port(), request); }

  Coordinator coordinator_;
  std::unique_ptr<CoordinatorServer> server_;
};

TEST_F(ServerTest, StartsOnAFreePortAndRefusesATakenOne) {
  EXPECT_GT(server_->port(), 0);
  EXPECT_EQ(server_->url(), "http://127.0.0.1:" + std::to_string(server_->port()));
  Result<std::unique_ptr<CoordinatorServer>> second =
      CoordinatorServer::Start(coordinator_, "127.0.0.1", server_->port());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(CoordinatorServer::Start(coordinator_, "127.0.0.1", 70000).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CoordinatorServer::Start(coordinator_, "", 0).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(ServerTest, LongPollWakesWhenAPlanIsPublished) {
  auto client = Client("w-0");
  ASSERT_TRUE(client->Register(kFingerprint, kBuild, true).ok());
  EXPECT_TRUE(coordinator_.GetJob(kJob)->workers.at("w-0").ready);
  auto waiter = std::async(std::launch::async, [&] { return client->WaitForPlan(0, seconds(30)); });
  std::this_thread::sleep_for(milliseconds(200));
  const auto published = Clock::now();
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(1)).ok());
  Result<Plan> plan = waiter.get();
  EXPECT_LT(Clock::now() - published, seconds(5));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->epoch, 1);
  EXPECT_EQ(plan->store_prefix, "epoch-1");
  ASSERT_EQ(plan->members.size(), 1u);
  EXPECT_EQ(plan->members[0].worker, "w-0");
  EXPECT_EQ(plan->members[0].rank, 0);
  EXPECT_EQ(plan->members[0].virtual_nodes, (std::vector<int>{0, 1}));
}

// A plan watcher that stops (a worker leaving) cancels its poll rather than wait it out; the
// client's other calls go on working.
TEST_F(ServerTest, CancelledWaitsEndAtOnceAndLeaveOtherCallsAlone) {
  auto client = Client("w-0");
  ASSERT_TRUE(client->Register(kFingerprint, kBuild, true).ok());
  const auto start = Clock::now();
  auto waiter =
      std::async(std::launch::async, [&] { return client->WaitForPlan(0, seconds(120)); });
  std::this_thread::sleep_for(milliseconds(200));
  client->CancelWaits();
  Result<Plan> cancelled = waiter.get();
  // Well inside the poll's two minutes (the test's point is that it ends, not how fast).
  EXPECT_LT(Clock::now() - start, seconds(60));
  ASSERT_FALSE(cancelled.ok());
  EXPECT_EQ(cancelled.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(cancelled.status().message().find("cancelled"), std::string::npos)
      << cancelled.status().message();
  // A later wait fails at once, even with a plan to serve; other calls still reach the server.
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(1)).ok());
  Result<Plan> later = client->WaitForPlan(0, seconds(120));
  EXPECT_FALSE(later.ok());
  const Status left = client->Leave();
  EXPECT_TRUE(left.ok()) << left.ToString();
  EXPECT_TRUE(coordinator_.GetJob(kJob)->workers.at("w-0").leave_requested);
  // Another client of the same worker is not cancelled.
  Result<Plan> other = Client("w-0")->WaitForPlan(0, seconds(10));
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_EQ(other->epoch, 1);
}

TEST_F(ServerTest, PlanIsServedAtOnceWhenNewerInTheDocumentedShape) {
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(2)).ok());
  const auto start = Clock::now();
  RawReply reply = Raw(Request("GET", JobPath(kJob, "plan?after=0&timeout_ms=30000"), kToken));
  EXPECT_LT(Clock::now() - start, seconds(5));
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(json::parse(reply.body),
            json::parse(R"({"epoch": 1, "storePrefix": "epoch-1", "members": [
                {"worker": "w-0", "rank": 0, "virtualNodes": [0, 1]},
                {"worker": "w-1", "rank": 1, "virtualNodes": [2, 3]}]})"));
}

TEST_F(ServerTest, PlanPollAnswers204AfterItsTimeout) {
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(1)).ok());
  const auto start = Clock::now();
  RawReply reply = Raw(Request("GET", JobPath(kJob, "plan?after=1&timeout_ms=300"), kToken));
  const auto waited = Clock::now() - start;
  EXPECT_EQ(reply.status, 204) << reply.body;
  EXPECT_TRUE(reply.body.empty());
  EXPECT_GE(waited, milliseconds(300));
  EXPECT_LT(waited, seconds(10));

  Result<Plan> none = Client("w-0")->WaitForPlan(1, milliseconds(300));
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_LE(none->epoch, 1);
}

TEST_F(ServerTest, StoreSetAndGetAcrossClients) {
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(2)).ok());
  auto writer = Client("w-0");
  auto reader = Client("w-1");
  const std::string value("bin\0ary\xff\x01", 9);
  auto waiting =
      std::async(std::launch::async, [&] { return reader->GetKey("epoch-1/rank-0", seconds(30)); });
  std::this_thread::sleep_for(milliseconds(200));
  ASSERT_TRUE(writer->SetKey("epoch-1/rank-0", value).ok());
  Result<std::string> got = waiting.get();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, value);
  EXPECT_EQ(*reader->GetKey("epoch-1/rank-0", milliseconds(0)), value);

  RawReply raw = Raw(Request("GET", JobPath(kJob, "store/epoch-1/rank-0"), kToken));
  EXPECT_EQ(raw.status, 200);
  EXPECT_EQ(raw.body, value);
  EXPECT_NE(raw.headers.find("application/octet-stream"), std::string::npos) << raw.headers;
}

TEST_F(ServerTest, StoreWaitTimesOutWith408) {
  const auto start = Clock::now();
  RawReply reply = Raw(Request("GET", JobPath(kJob, "store/never?timeout_ms=200"), kToken));
  EXPECT_GE(Clock::now() - start, milliseconds(200));
  ExpectError(reply, 408, "'never'");

  Result<std::string> value = Client("w-0")->GetKey("never", milliseconds(300));
  EXPECT_EQ(value.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(value.status().message().find("'never'"), std::string::npos);

  auto client = Client("w-0");
  CoordinatorStore store(*client);
  ASSERT_TRUE(store.Set("present", "1").ok());
  Status wait = store.Wait({"present", "gone-1", "gone-2"}, milliseconds(200));
  EXPECT_EQ(wait.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(wait.message().find("'gone-1', 'gone-2'"), std::string::npos) << wait.message();
  EXPECT_TRUE(store.Wait({"present"}, milliseconds(0)).ok());
}

TEST_F(ServerTest, KeysMayHoldSlashesAndAnyCharacter) {
  auto client = Client("w-0");
  const std::string key = "any/rank 0/%2F?#&=+ü";
  ASSERT_TRUE(client->SetKey(key, "odd").ok());
  Result<std::string> stored = coordinator_.GetKey(kJob, key, milliseconds(0));
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(*stored, "odd");
  EXPECT_EQ(*client->GetKey(key, milliseconds(0)), "odd");

  // A '/' in a key may be sent plainly or percent-encoded.
  ASSERT_TRUE(coordinator_.SetKey(kJob, "a/b/c", "abc").ok());
  EXPECT_EQ(Raw(Request("GET", JobPath(kJob, "store/a/b/c"), kToken)).body, "abc");
  EXPECT_EQ(Raw(Request("GET", JobPath(kJob, "store/a%2Fb%2Fc"), kToken)).body, "abc");
  EXPECT_EQ(Raw(Request("PUT", JobPath(kJob, "store/x%2Fy"), kToken, "xy")).status, 204);
  EXPECT_EQ(*coordinator_.GetKey(kJob, "x/y", milliseconds(0)), "xy");
}

TEST_F(ServerTest, MissingOrWrongCredentialIs401) {
  const std::string path = JobPath(kJob, "register");
  const std::string w0 = std::string(kWorkerHeader) + ": w-0\r\n";
  ExpectError(Raw(Request("POST", path, nullptr, RegisterBody("w-0"))), 401, "no bearer token");
  ExpectError(Raw(Request("POST", path, "token-a-not", RegisterBody("w-0"))), 401,
              "not valid for worker w-0 of job team/mnist");
  // Another job's credential for the same worker name opens nothing here.
  ExpectError(Raw(Request("POST", path, kOtherToken, RegisterBody("w-0"))), 401, "not valid");
  // Neither does the job's secret itself, which no worker holds.
  ExpectError(Raw(Request("POST", path, nullptr, RegisterBody("w-0"),
                          std::string("Authorization: Bearer ") + kToken + "\r\n" + w0)),
              401, "not valid");
  // A credential without the worker it belongs to.
  ExpectError(Raw(Request("POST", path, nullptr, RegisterBody("w-0"),
                          "Authorization: Bearer " + Credential(kToken, "w-0") + "\r\n")),
              401, "names no worker");
  ExpectError(Raw(Request("GET", JobPath(kJob, "store/k"), nullptr, "", "Authorization: \r\n")),
              401, "no bearer token");
  std::string basic = Request("GET", JobPath(kJob, "plan?timeout_ms=0"), nullptr, "",
                              "Authorization: Basic dG9rZW4tYQ==\r\n" + w0);
  ExpectError(Raw(basic), 401, "no bearer token");
  EXPECT_TRUE(coordinator_.GetJob(kJob)->workers.empty());
  // The scheme is case-insensitive.
  EXPECT_EQ(Raw(Request("GET", JobPath(kJob, "plan?after=-1"), nullptr, "",
                        "Authorization: bearer " + Credential(kToken, "w-0") + "\r\n" + w0))
                .status,
            200);
}

TEST_F(ServerTest, AWorkersCredentialCannotActAsAnotherWorker) {
  ASSERT_TRUE(Client("w-0")->Register(kFingerprint, kBuild, true).ok());
  ASSERT_TRUE(Client("w-1")->Register(kFingerprint, kBuild, true).ok());
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(2)).ok());
  // w-1's credential, naming w-1 in the header and w-0 in the body: 403, and nothing changes.
  for (const char* action : {"register", "leave", "ack", "failure", "report"}) {
    SCOPED_TRACE(action);
    const std::string body =
        std::string(action) == "register" ? RegisterBody("w-0")
        : std::string(action) == "report"
            ? ReportBody("w-0", 1)
            : json{{"worker", "w-0"}, {"epoch", 1}, {"step", 1}, {"message", "m"}}.dump();
    ExpectError(Raw(Request("POST", JobPath(kJob, action), kToken, body, "", "w-1")), 403,
                "cannot act as worker w-0");
  }
  // w-1's credential sent as w-0's, in the header: not w-0's credential, so 401.
  ExpectError(Raw(Request("POST", JobPath(kJob, "leave"), nullptr, R"({"worker": "w-0"})",
                          "Authorization: Bearer " + Credential(kToken, "w-1") + "\r\n" +
                              kWorkerHeader + ": w-0\r\n")),
              401, "not valid for worker w-0");
  // Through the client, as an agent would send it.
  CoordinatorClient impostor(server_->url(), kJob, Credential(kToken, "w-1"), "w-0",
                             milliseconds(5000));
  EXPECT_EQ(impostor.Leave().code(), StatusCode::kUnauthenticated);
  const JobView view = *coordinator_.GetJob(kJob);
  EXPECT_FALSE(view.workers.at("w-0").leave_requested);
  EXPECT_EQ(view.workers.at("w-0").failure_epoch, -1);
  EXPECT_EQ(view.workers.at("w-0").last_report.step, 0);
}

TEST_F(ServerTest, OnlyMembersOfThePlanWriteItsRendezvousKeys) {
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(2)).ok());
  EXPECT_TRUE(Client("w-1")->SetKey("epoch-1/rank-1", "addr-1").ok());
  // w-2 is in no plan: it can plant no address for the ranks of epoch 1.
  Status planted = Client("w-2")->SetKey("epoch-1/rank-0", "attacker");
  EXPECT_EQ(planted.code(), StatusCode::kPermissionDenied) << planted.message();
  EXPECT_NE(planted.message().find(
                "is not a member of epoch 1; only its members write its keys (HTTP 403)"),
            std::string::npos)
      << planted.message();
  ExpectError(
      Raw(Request("PUT", JobPath(kJob, "store/epoch-1/rank-0"), kToken, "attacker", "", "w-2")),
      403, "not a member");
  EXPECT_FALSE(coordinator_.GetKey(kJob, "epoch-1/rank-0", milliseconds(0)).ok());
  // Nor for the next epoch's ranks, before its plan is out.
  EXPECT_EQ(Client("w-2")->SetKey("epoch-2/rank-0", "attacker").code(),
            StatusCode::kFailedPrecondition);
  EXPECT_FALSE(coordinator_.GetKey(kJob, "epoch-2/rank-0", milliseconds(0)).ok());
}

TEST_F(ServerTest, OnlyRankZeroReportsTheJobFinished) {
  for (const char* w : {"w-0", "w-1"}) {
    ASSERT_TRUE(Client(w)->Register(kFingerprint, kBuild, true).ok());
  }
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(2)).ok());
  Report finished;
  finished.epoch = 1;
  finished.step = 9;
  finished.finished = true;
  finished.weights_sha256 = std::string(64, 'a');
  Status refused = Client("w-1")->Report(finished);
  EXPECT_EQ(refused.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(refused.message().find("only rank 0"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("(HTTP 403)"), std::string::npos) << refused.message();
  finished.finished = false;  // the digest alone is job-level too
  EXPECT_EQ(Client("w-1")->Report(finished).code(), StatusCode::kPermissionDenied);
  EXPECT_FALSE(coordinator_.GetJob(kJob)->workers.at("w-1").last_report.finished);
  // An ordinary report from w-1 and the final one from rank 0 are taken.
  Report step;
  step.epoch = 1;
  step.step = 9;
  EXPECT_TRUE(Client("w-1")->Report(step).ok());
  finished.finished = true;
  ASSERT_TRUE(Client("w-0")->Report(finished).ok());
  EXPECT_TRUE(coordinator_.GetJob(kJob)->workers.at("w-0").last_report.finished);
}

// A worker past the job's worker limit is told to wait (503, the coordinator is full), not
// refused for good: its job goes on. Store writes past a limit are refused (409).
TEST(ServerLimitsTest, WorkerLimitIs503StoreAndMemoryLimitsAre409AndTheJobGoesOn) {
  Coordinator coordinator(/*memory_budget=*/64 << 10);
  ASSERT_TRUE(coordinator.AddJob(kJob, kToken, kFingerprint, kBuild).ok());
  ASSERT_TRUE(coordinator.SetWorkerLimit(kJob, 2).ok());
  auto server = CoordinatorServer::Start(coordinator, "127.0.0.1", 0).value();
  auto client = [&](const std::string& worker) {
    return CoordinatorClient(server->url(), kJob, Credential(kToken, worker), worker,
                             milliseconds(5000));
  };
  ASSERT_TRUE(client("w-0").Register(kFingerprint, kBuild, true).ok());
  ASSERT_TRUE(client("w-1").Register(kFingerprint, kBuild, false).ok());
  // Answered at once, not retried by the client as other 503s are: the worker waits at its own
  // pace (agent_restart_test).
  const auto asked = std::chrono::steady_clock::now();
  Status third = client("w-2").Register(kFingerprint, kBuild, true);
  EXPECT_LT(std::chrono::steady_clock::now() - asked, seconds(2));
  EXPECT_EQ(third.code(), StatusCode::kUnavailable) << third.message();
  EXPECT_TRUE(IsCoordinatorFull(third)) << third.message();
  EXPECT_NE(third.message().find("2 registered workers, as many as it may have"), std::string::npos)
      << third.message();
  EXPECT_NE(third.message().find("(HTTP 503)"), std::string::npos) << third.message();
  ExpectError(RawHttp(server->port(),
                      Request("POST", JobPath(kJob, "register"), kToken, RegisterBody("w-2"))),
              503, "the coordinator is full");
  EXPECT_TRUE(client("w-1").Register(kFingerprint, kBuild, true).ok());  // already counted

  ASSERT_TRUE(client("w-0").SetKey("a", std::string(40 << 10, 'a')).ok());
  Status full = client("w-0").SetKey("b", std::string(40 << 10, 'b'));
  EXPECT_EQ(full.code(), StatusCode::kFailedPrecondition) << full.message();
  EXPECT_NE(full.message().find("memory budget"), std::string::npos) << full.message();
  RawReply raw = RawHttp(
      server->port(), Request("PUT", JobPath(kJob, "store/b"), kToken, std::string(40 << 10, 'b')));
  ExpectError(raw, 409, "memory budget");

  // What was refused left the job as it was, and it goes on.
  EXPECT_EQ(client("w-0").GetKey("a", milliseconds(0))->size(), size_t{40} << 10);
  ASSERT_TRUE(coordinator.PublishPlan(kJob, Members(2)).ok());
  Result<Plan> plan = client("w-1").WaitForPlan(0, seconds(10));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->members.size(), 2u);
  server->Stop();
}

TEST_F(ServerTest, UnknownJobPathAndMethodAre404And405) {
  // An unknown job is answered as a wrong credential is: nobody learns which jobs exist.
  ExpectError(Raw(Request("POST", JobPath("team/none", "register"), kToken, RegisterBody("w"))),
              401, "not valid for worker w of job team/none");
  ExpectError(Raw(Request("POST", JobPath(kJob, "register"), "wrong", RegisterBody("w"))), 401,
              "not valid for worker w of job team/mnist");
  ExpectError(Raw(Request("GET", "/", kToken)), 404, "no such path");
  ExpectError(Raw(Request("GET", "/v2/jobs/team/mnist/plan", kToken)), 404, "no such path");
  ExpectError(Raw(Request("GET", JobPath(kJob, "nope"), kToken)), 404, "no such path");
  ExpectError(Raw(Request("GET", JobPath(kJob, "plan/extra"), kToken)), 404, "no such path");
  ExpectError(Raw(Request("GET", JobPath(kJob, "store/"), kToken)), 404, "no such path");
  ExpectError(Raw(Request("GET", "/v1/jobs/team", kToken)), 404, "no such path");

  RawReply wrong = Raw(Request("DELETE", JobPath(kJob, "plan"), kToken));
  ExpectError(wrong, 405, "use GET");
  EXPECT_NE(wrong.headers.find("Allow: GET"), std::string::npos) << wrong.headers;
  ExpectError(Raw(Request("GET", JobPath(kJob, "register"), kToken)), 405, "use POST");
  ExpectError(Raw(Request("POST", JobPath(kJob, "store/k"), kToken, "v")), 405, "GET, PUT");
}

TEST_F(ServerTest, MalformedBodiesAre400NamingTheField) {
  const std::string path = JobPath(kJob, "register");
  ExpectError(Raw(Request("POST", path, kToken, "{not json")), 400, "not valid JSON");
  ExpectError(Raw(Request("POST", path, kToken, "")), 400, "not valid JSON");
  ExpectError(Raw(Request("POST", path, kToken, "[1, 2]")), 400, "JSON object");
  ExpectError(Raw(Request("POST", path, kToken, R"({"fingerprint": "fp-1"})")), 400,
              "field 'worker' is missing");
  ExpectError(Raw(Request("POST", path, kToken,
                          R"({"worker": "w", "fingerprint": "fp-1", "build": "build-1"})")),
              400, "field 'ready' is missing");
  ExpectError(Raw(Request("POST", path, kToken,
                          R"({"worker": "w", "fingerprint": "fp-1", "build": "build-1",
                              "ready": "yes"})")),
              400, "field 'ready' must be true or false");
  ExpectError(Raw(Request("POST", path, kToken, R"({"worker": 7})")), 400,
              "field 'worker' must be a string");
  ExpectError(
      Raw(Request("POST", JobPath(kJob, "ack"), kToken, R"({"worker": "w", "epoch": 1.5})")), 400,
      "field 'epoch' must be an integer");
  ExpectError(Raw(Request("POST", JobPath(kJob, "ack"), kToken,
                          R"({"worker": "w", "epoch": 99999999999999999999})")),
              400, "field 'epoch'");
  ExpectError(Raw(Request("POST", path, kToken, std::string(100, '[') + std::string(100, ']'))),
              400, "nests deeper");
  ExpectError(Raw(Request("GET", JobPath(kJob, "plan?after=x"), kToken)), 400,
              "'after' must be an integer");
  ExpectError(Raw(Request("GET", JobPath(kJob, "plan?timeout_ms=-5"), kToken)), 400,
              "'timeout_ms' must be non-negative");
  ExpectError(Raw(Request("GET", JobPath(kJob, "plan?after=%zz"), kToken)), 400,
              "percent-encoding");
  // cpprest itself refuses a path it cannot decode, before the coordinator sees it, with an
  // empty body.
  EXPECT_EQ(Raw(Request("GET", JobPath(kJob, "store/%zz"), kToken)).status, 400);
  EXPECT_TRUE(coordinator_.GetJob(kJob)->workers.empty());
}

TEST_F(ServerTest, BodiesOverOneMebibyteAre413) {
  const std::string path = JobPath(kJob, "store/big");
  const std::string big((1 << 20) + 1, 'x');
  ExpectError(Raw(Request("PUT", path, kToken, big)), 413, "limit");

  // Chunked, so the size is known only from the bytes themselves.
  std::string chunked = "PUT " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
                        AuthHeaders(kToken, "w-0") + "Transfer-Encoding: chunked\r\n\r\n";
  const std::string chunk(64 << 10, 'y');
  for (int i = 0; i < 20; ++i) chunked += "10000\r\n" + chunk + "\r\n";
  chunked += "0\r\n\r\n";
  ExpectError(Raw(chunked), 413, "limit");
  EXPECT_FALSE(coordinator_.GetKey(kJob, "big", milliseconds(0)).ok());

  // Exactly the limit is fine.
  EXPECT_EQ(Raw(Request("PUT", path, kToken, std::string(1 << 20, 'z'))).status, 204);
  EXPECT_EQ(coordinator_.GetKey(kJob, "big", milliseconds(0))->size(), size_t{1} << 20);
}

TEST_F(ServerTest, SpecAndBuildMismatchesAre409) {
  // The job's first worker brought its build.
  ASSERT_TRUE(coordinator_.RegisterWorker(kJob, "w-0", kFingerprint, kBuild, true).ok());
  const std::string path = JobPath(kJob, "register");
  ExpectError(Raw(Request("POST", path, kToken, RegisterBody("w-3", "fp-2"))), 409,
              "worker w-3 was refused: its job spec differs from the job's (virtual nodes, batch, "
              "model, dataset, optimizer, reduction or seed)");
  ExpectError(Raw(Request("POST", path, kToken, RegisterBody("w-3", kFingerprint, "build-9"))), 409,
              "worker w-3 was refused: it runs build build-9, the job runs build build-1");
  EXPECT_EQ(coordinator_.GetJob(kJob)->workers.count("w-3"), 0u);
  RawReply ok = Raw(Request("POST", path, kToken, RegisterBody("w-3")));
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(json::parse(ok.body), json({{"ok", true}}));
}

TEST_F(ServerTest, EpochsFromThePastOrFutureAre409) {
  ASSERT_TRUE(coordinator_.RegisterWorker(kJob, "w-0", kFingerprint, kBuild, true).ok());
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(1)).ok());
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(1)).ok());
  const std::string report = JobPath(kJob, "report");
  ExpectError(Raw(Request("POST", report, kToken, ReportBody("w-0", 1))), 409,
              "epoch 1 is older than the current epoch 2");
  ExpectError(Raw(Request("POST", report, kToken, ReportBody("w-0", 3))), 409, "from the future");
  EXPECT_EQ(Raw(Request("POST", report, kToken, ReportBody("w-0", 2))).status, 204);
  ExpectError(Raw(Request("POST", report, kToken, ReportBody("w-9", 2))), 404, "not registered");

  ExpectError(Raw(Request("PUT", JobPath(kJob, "store/epoch-1/rank-0"), kToken, "x")), 409,
              "epoch 1 is older than the current epoch 2");
  EXPECT_EQ(Raw(Request("PUT", JobPath(kJob, "store/epoch-2/rank-0"), kToken, "x")).status, 204);
  // A worker has seen only published plans: the next epoch's keys are not its to write.
  ExpectError(Raw(Request("PUT", JobPath(kJob, "store/epoch-3/rank-0"), kToken, "x")), 409,
              "from the future");
  ExpectError(Raw(Request("POST", JobPath(kJob, "ack"), kToken,
                          json{{"worker", "w-0"}, {"epoch", 5}}.dump())),
              409, "from the future");
  ExpectError(
      Raw(Request("POST", JobPath(kJob, "failure"), kToken,
                  json{{"worker", "w-0"}, {"epoch", 5}, {"step", 1}, {"message", "m"}}.dump())),
      409, "from the future");
}

TEST_F(ServerTest, ReportLeaveAckAndFailureReachTheModel) {
  auto w0 = Client("w-0");
  auto w1 = Client("w-1");
  ASSERT_TRUE(w0->Register(kFingerprint, kBuild, true).ok());
  ASSERT_TRUE(w1->Register(kFingerprint, kBuild, false).ok());
  EXPECT_FALSE(coordinator_.GetJob(kJob)->workers.at("w-1").ready);
  ASSERT_TRUE(w1->Register(kFingerprint, kBuild, true).ok());
  EXPECT_TRUE(coordinator_.GetJob(kJob)->workers.at("w-1").ready);
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(2)).ok());

  Report report;
  report.epoch = 1;
  report.step = 17;
  report.loss = std::nan("");
  report.samples_per_second = 512;
  report.seconds_per_virtual_node = 0.125;
  report.pause_seconds = 2.5;
  report.has_state = true;
  ASSERT_TRUE(w0->Report(report).ok());
  WorkerInfo info = coordinator_.GetJob(kJob)->workers.at("w-0");
  EXPECT_EQ(info.last_report.step, 17);
  EXPECT_TRUE(std::isnan(info.last_report.loss));
  EXPECT_EQ(info.last_report.samples_per_second, 512);
  EXPECT_EQ(info.last_report.seconds_per_virtual_node, 0.125);
  EXPECT_EQ(info.last_report.pause_seconds, 2.5);
  EXPECT_TRUE(info.last_report.has_state);

  ASSERT_TRUE(w1->Leave().ok());
  EXPECT_TRUE(coordinator_.GetJob(kJob)->workers.at("w-1").leave_requested);
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(1)).ok());
  ASSERT_TRUE(w1->Ack(2).ok());
  EXPECT_EQ(coordinator_.GetJob(kJob)->workers.at("w-1").acked_epoch, 2);

  ASSERT_TRUE(w0->ReportFailure(2, 18, "gloo: connection reset by peer").ok());
  info = coordinator_.GetJob(kJob)->workers.at("w-0");
  EXPECT_EQ(info.failure_epoch, 2);
  EXPECT_EQ(info.failure_step, 18);
  EXPECT_EQ(info.failure_message, "gloo: connection reset by peer");
}

TEST_F(ServerTest, ReportsCarryTheJobLengthTheAgentFoundInItsData) {
  auto w0 = Client("w-0");
  ASSERT_TRUE(w0->Register(kFingerprint, kBuild, true).ok());
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(1)).ok());
  Report report;
  report.epoch = 1;
  report.step = 3;
  report.total_steps = 1872;
  ASSERT_TRUE(w0->Report(report).ok());
  EXPECT_EQ(coordinator_.GetJob(kJob)->workers.at("w-0").last_report.total_steps, 1872);
  // An agent from before the field sends none: the length is unknown again.
  const std::string path = JobPath(kJob, "report");
  EXPECT_EQ(Raw(Request("POST", path, kToken, ReportBody("w-0", 1))).status, 204);
  EXPECT_EQ(coordinator_.GetJob(kJob)->workers.at("w-0").last_report.total_steps, 0);
  json negative = json::parse(ReportBody("w-0", 1));
  negative["totalSteps"] = -1;
  ExpectError(Raw(Request("POST", path, kToken, negative.dump())), 400, "totalSteps");
  // A digest is a digest: no megabyte of text in the job's status.
  json long_digest = json::parse(ReportBody("w-0", 1));
  long_digest["weightsSha256"] = std::string(100000, 'a');
  ExpectError(Raw(Request("POST", path, kToken, long_digest.dump())), 400, "weightsSha256");
}

TEST_F(ServerTest, ClientMapsHttpCodesToStatusCodes) {
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(1)).ok());
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(1)).ok());

  Status refused = Client("w-0", kJob, "wrong")->Register(kFingerprint, kBuild, true);
  EXPECT_EQ(refused.code(), StatusCode::kUnauthenticated);
  EXPECT_NE(refused.message().find("coordinator refused the credential (401)"), std::string::npos)
      << refused.message();

  auto client = Client("w-0");
  Status spec = client->Register("fp-2", kBuild, true);
  EXPECT_EQ(spec.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(spec.message().find("job spec differs"), std::string::npos) << spec.message();
  EXPECT_NE(spec.message().find("(HTTP 409)"), std::string::npos) << spec.message();

  Report report;
  report.epoch = 2;
  Status unregistered = client->Report(report);
  EXPECT_EQ(unregistered.code(), StatusCode::kNotFound);
  EXPECT_NE(unregistered.message().find("not registered"), std::string::npos);

  ASSERT_TRUE(client->Register(kFingerprint, kBuild, true).ok());
  report.epoch = 1;
  Status old = client->Report(report);
  EXPECT_EQ(old.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(old.message().find("epoch 1 is older than the current epoch 2 (HTTP 409)"),
            std::string::npos)
      << old.message();

  EXPECT_EQ(client->Ack(-1).code(), StatusCode::kInvalidArgument);
  // An unknown job answers as a wrong token does.
  EXPECT_EQ(Client("w-0", "team/none")->Leave().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(client->GetKey("absent", milliseconds(100)).status().code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_EQ(client->SetKey("epoch-1/k", "v").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(client->SetKey(std::string(2000, 'k'), "v").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client->SetKey("", "v").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client->GetKey("", milliseconds(0)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client->SetKey("big", std::string((1 << 20) + 1, 'x')).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(ServerTest, ClientRetriesAnUnreachableServerUntilItsDeadline) {
  const int port = FreeLowPort();
  ASSERT_GT(port, 0);
  CoordinatorClient client("http://127.0.0.1:" + std::to_string(port), kJob,
                           Credential(kToken, "w-0"), "w-0", milliseconds(600));
  const auto start = Clock::now();
  Status status = client.Register(kFingerprint, kBuild, true);
  const auto took = Clock::now() - start;
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.message();
  EXPECT_GE(took, milliseconds(550));
  EXPECT_LT(took, seconds(5));
  EXPECT_EQ(client.WaitForPlan(0, milliseconds(300)).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(CoordinatorClient("not a url", kJob, kToken, "w", milliseconds(100)).Leave().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(ServerTest, ClientRetriesUntilTheServerComesUp) {
  server_->Stop();
  server_.reset();
  const int port = FreeLowPort();
  ASSERT_GT(port, 0);
  CoordinatorClient client("http://127.0.0.1:" + std::to_string(port), kJob,
                           Credential(kToken, "w-0"), "w-0", milliseconds(15000));
  auto registering =
      std::async(std::launch::async, [&] { return client.Register(kFingerprint, kBuild, true); });
  std::this_thread::sleep_for(milliseconds(500));
  Result<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(coordinator_, "127.0.0.1", port);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  server_ = std::move(server).value();
  Status status = registering.get();
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(coordinator_.GetJob(kJob)->workers.count("w-0"), 1u);
}

TEST_F(ServerTest, ManyConcurrentLongPollsDoNotStarveOtherRequests) {
  // More polls than cpprest has pool threads (40): a poll that held a thread would starve.
  constexpr int kPolls = 50;
  std::vector<std::future<Result<Plan>>> polls;
  std::vector<std::future<Result<std::string>>> key_polls;
  for (int i = 0; i < kPolls; ++i) {
    polls.push_back(std::async(std::launch::async, [&, i] {
      return Client("p-" + std::to_string(i))->WaitForPlan(0, seconds(60));
    }));
  }
  for (int i = 0; i < 5; ++i) {
    key_polls.push_back(std::async(std::launch::async,
                                   [&] { return Client("k")->GetKey("late-key", seconds(60)); }));
  }
  std::this_thread::sleep_for(milliseconds(1000));
  const auto start = Clock::now();
  auto client = Client("w-0");
  ASSERT_TRUE(client->Register(kFingerprint, kBuild, true).ok());
  ASSERT_TRUE(client->SetKey("other", "v").ok());
  EXPECT_EQ(*client->GetKey("other", milliseconds(0)), "v");
  EXPECT_LT(Clock::now() - start, seconds(3));

  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(1)).ok());
  ASSERT_TRUE(coordinator_.SetKey(kJob, "late-key", "here").ok());
  for (auto& poll : polls) {
    Result<Plan> plan = poll.get();
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->epoch, 1);
  }
  for (auto& poll : key_polls) EXPECT_EQ(*poll.get(), "here");
}

TEST_F(ServerTest, BadRequestsAgainstOneJobLeaveAnotherUntouched) {
  // Job A: a member, a plan, a report and a key.
  ASSERT_TRUE(coordinator_.RegisterWorker(kJob, "w-0", kFingerprint, kBuild, true).ok());
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(1)).ok());
  Report report;
  report.epoch = 1;
  report.step = 9;
  ASSERT_TRUE(coordinator_.RecordReport(kJob, "w-0", report).ok());
  ASSERT_TRUE(coordinator_.SetKey(kJob, "epoch-1/rank-0", "addr-a").ok());
  const JobView before = *coordinator_.GetJob(kJob);

  const std::string b = kOtherJob;
  std::vector<std::string> barrage = {
      "\x01\x02\x03 garbage\r\n\r\n",
      "GET\r\n\r\n",
      "GET /v1/jobs/team/other/plan HTTP/1.1\r\nBroken header line\r\n\r\n",
      Request("POST", JobPath(b, "register"), nullptr, RegisterBody("w-0")),
      Request("POST", JobPath(b, "register"), "token-a", RegisterBody("w-0")),
      Request("POST", JobPath(b, "register"), kOtherToken, "{\"worker\":"),
      Request("POST", JobPath(b, "register"), kOtherToken, RegisterBody("w-0", "fp-x")),
      Request("POST", JobPath(b, "register"), kOtherToken, std::string(5000, '{')),
      Request("POST", JobPath(b, "report"), kOtherToken, ReportBody("w-0", 1)),
      Request("POST", JobPath(b, "report"), kOtherToken, R"({"worker": "w-0", "epoch": "1"})"),
      Request("POST", JobPath(b, "ack"), kOtherToken, R"({"worker": null})"),
      Request("PUT", JobPath(b, "store/epoch-1/rank-0"), kOtherToken, "addr-b"),
      Request("PUT", JobPath(b, "store/%zz"), kOtherToken, "x"),
      Request("PUT", JobPath(b, "store/big"), kOtherToken, std::string((1 << 20) + 10, 'b')),
      Request("GET", JobPath(b, "store/x?timeout_ms=abc"), kOtherToken),
      Request("GET", JobPath(b, "plan?after=0&timeout_ms=50"), kOtherToken),
      Request("DELETE", JobPath(b, "store/k"), kOtherToken),
      Request("GET", JobPath(b, "../mnist/plan"), kOtherToken),
      Request("GET", "/v1/jobs/team/other%2F..%2Fmnist/plan", kOtherToken),
      // Job B's token on job A's paths.
      Request("POST", JobPath(kJob, "register"), kOtherToken, RegisterBody("w-9")),
      Request("PUT", JobPath(kJob, "store/epoch-1/rank-0"), kOtherToken, "hijack"),
      Request("POST", JobPath(kJob, "leave"), kOtherToken, R"({"worker": "w-0"})"),
      Request("POST", JobPath(kJob, "failure"), kOtherToken,
              R"({"worker": "w-0", "epoch": 1, "step": 1, "message": "x"})"),
      // Body shorter than declared, then the connection closes.
      "PUT " + JobPath(b, "store/k") + " HTTP/1.1\r\n" + AuthHeaders(kOtherToken, "w-0") +
          "Content-Length: 100\r\n\r\nshort",
      std::string("POST ") + JobPath(b, "register") +
          " HTTP/1.1\r\nContent-Length: 99999999999\r\n" + AuthHeaders(kOtherToken, "w-0") +
          "\r\n{}",
      // Another worker of job A acting as w-0, or writing keys of an epoch far ahead.
      Request("POST", JobPath(kJob, "leave"), kToken, R"({"worker": "w-0"})", "", "w-1"),
      Request("POST", JobPath(kJob, "failure"), kToken,
              R"({"worker": "w-0", "epoch": 1, "step": 1, "message": "x"})", "", "w-1"),
      Request("PUT", JobPath(kJob, "store/epoch-9/rank-0"), kToken, "ahead", "", "w-1"),
      "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n",
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); i < barrage.size(); i += 4) {
        const int fd = Connect(server_->port());
        if (fd < 0) continue;
        SendAll(fd, barrage[i]);
        // Leave some mid-request, read the answer of others.
        if (i % 3 != 0) {
          char buffer[4096];
          timeval timeout{};
          timeout.tv_sec = 2;
          setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
          while (recv(fd, buffer, sizeof(buffer), 0) > 0) {
          }
        }
        close(fd);
      }
    });
  }
  for (std::thread& t : threads) t.join();

  const JobView after = *coordinator_.GetJob(kJob);
  EXPECT_EQ(after.generation, before.generation);
  EXPECT_EQ(after.plan.epoch, before.plan.epoch);
  ASSERT_EQ(after.plan.members.size(), 1u);
  EXPECT_EQ(after.plan.members[0].worker, "w-0");
  ASSERT_EQ(after.workers.size(), 1u);
  EXPECT_FALSE(after.workers.at("w-0").leave_requested);
  EXPECT_EQ(after.workers.at("w-0").failure_epoch, -1);
  EXPECT_EQ(after.workers.at("w-0").last_report.step, 9);
  EXPECT_EQ(*coordinator_.GetKey(kJob, "epoch-1/rank-0", milliseconds(0)), "addr-a");

  // Job A is still served, long polls included.
  auto client = Client("w-0");
  EXPECT_EQ(*client->GetKey("epoch-1/rank-0", milliseconds(0)), "addr-a");
  auto waiter = std::async(std::launch::async, [&] { return client->WaitForPlan(1, seconds(30)); });
  std::this_thread::sleep_for(milliseconds(200));
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(1)).ok());
  Result<Plan> plan = waiter.get();
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->epoch, 2);
}

TEST_F(ServerTest, ServerSurvivesClientsThatDisconnectMidPoll) {
  // Polls whose clients leave: one times out, one is answered by a plan, one by a key.
  const std::vector<std::string> polls = {
      Request("GET", JobPath(kJob, "plan?after=0&timeout_ms=300"), kToken),
      Request("GET", JobPath(kJob, "plan?after=0&timeout_ms=60000"), kToken),
      Request("GET", JobPath(kJob, "store/gone?timeout_ms=60000"), kToken),
  };
  for (const std::string& poll : polls) {
    const int fd = Connect(server_->port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, poll));
    std::this_thread::sleep_for(milliseconds(50));
    close(fd);
  }
  // A body that stops half-way must not store a truncated value.
  const int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  SendAll(fd, "PUT " + JobPath(kJob, "store/half") + " HTTP/1.1\r\n" + AuthHeaders(kToken, "w-0") +
                  "Content-Length: 100\r\n\r\nonly-part");
  std::this_thread::sleep_for(milliseconds(100));
  close(fd);

  std::this_thread::sleep_for(milliseconds(500));
  ASSERT_TRUE(coordinator_.PublishPlan(kJob, Members(1)).ok());
  ASSERT_TRUE(coordinator_.SetKey(kJob, "gone", "v").ok());
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_FALSE(coordinator_.GetKey(kJob, "half", milliseconds(0)).ok());

  auto client = Client("w-0");
  EXPECT_TRUE(client->Register(kFingerprint, kBuild, true).ok());
  Result<Plan> plan = client->WaitForPlan(0, seconds(10));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->epoch, 1);
}

TEST_F(ServerTest, RemovingAJobAnswersItsPollsWith404) {
  auto waiter = std::async(std::launch::async, [&] {
    return Raw(Request("GET", JobPath(kOtherJob, "plan?timeout_ms=30000"), kOtherToken));
  });
  std::this_thread::sleep_for(milliseconds(300));
  ASSERT_TRUE(coordinator_.RemoveJob(kOtherJob).ok());
  ExpectError(waiter.get(), 404, "removed");
}

TEST_F(ServerTest, StopAnswersPendingPollsAndReturnsPromptly) {
  auto waiter = std::async(std::launch::async, [&] {
    return Raw(Request("GET", JobPath(kJob, "plan?timeout_ms=60000"), kToken));
  });
  std::this_thread::sleep_for(milliseconds(300));
  const auto start = Clock::now();
  server_->Stop();
  EXPECT_LT(Clock::now() - start, seconds(5));
  ExpectError(waiter.get(), 503, "shutting down");
  server_->Stop();  // idempotent
}

#ifdef VF_TEST_WITH_GLOO
TEST_F(ServerTest, GlooRanksRendezvousThroughTheCoordinator) {
  constexpr int kRanks = 3;
  std::vector<std::thread> threads;
  std::vector<Status> results(kRanks);
  std::vector<std::vector<int64_t>> sums(kRanks);
  std::vector<std::vector<float>> floats(kRanks);
  for (int i = 0; i < kRanks; ++i) {
    threads.emplace_back([&, i] {
      auto run = [&]() -> Status {
        const std::string worker = "w-" + std::to_string(i);
        CoordinatorClient client(server_->url(), kJob, Credential(kToken, worker), worker,
                                 milliseconds(10000));
        VF_RETURN_IF_ERROR(client.Register(kFingerprint, kBuild, true));
        VF_ASSIGN_OR_RETURN(Plan plan, client.WaitForPlan(0, seconds(60)));
        int rank = -1;
        for (const Member& m : plan.members) {
          if (m.worker == client.worker()) rank = m.rank;
        }
        if (rank < 0) return Internal("not in the plan");
        CoordinatorStore store(client);
        PrefixStore epoch_store(plan.store_prefix, store);
        CommOptions options;
        options.timeout = seconds(60);
        VF_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                            CreateGlooCommunicator(epoch_store, rank, kRanks, options));
        sums[i] = {rank + 1, int64_t{10} * (rank + 1), -rank};
        VF_RETURN_IF_ERROR(comm->AllReduce(sums[i].data(), sums[i].size(), ReduceOp::kSum));
        floats[i] = {0.5f * static_cast<float>(rank)};
        return comm->AllReduce(floats[i].data(), floats[i].size(), ReduceOp::kMax);
      };
      results[i] = run();
    });
  }
  // Publish once all three are registered, as the operator would.
  const auto deadline = Clock::now() + seconds(30);
  while (coordinator_.GetJob(kJob)->workers.size() < kRanks && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  // Ranks deliberately not in name order.
  ASSERT_TRUE(
      coordinator_.PublishPlan(kJob, {{"w-0", 2, {0}}, {"w-1", 0, {1, 2}}, {"w-2", 1, {3}}}).ok());
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kRanks; ++i) {
    ASSERT_TRUE(results[i].ok()) << "worker " << i << ": " << results[i].ToString();
    EXPECT_EQ(sums[i], (std::vector<int64_t>{6, 60, -3}));
    EXPECT_EQ(floats[i], (std::vector<float>{1.0f}));
  }
  // The rendezvous keys live under the plan's prefix.
  EXPECT_TRUE(coordinator_.SetKey(kJob, "epoch-1/probe", "x").ok());
}
#endif

// ---- TLS ----

// A coordinator serving HTTPS with a certificate from a CA made here, and that CA in a file.
class TlsServerTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(coordinator_.AddJob(kJob, kToken, kFingerprint, kBuild).ok());
    Result<http::KeyPair> ca = http::MakeCertificateAuthority("test CA", std::chrono::hours(1));
    ASSERT_TRUE(ca.ok()) << ca.status().ToString();
    Result<http::KeyPair> cert =
        http::IssueServerCertificate(*ca, {"localhost", "127.0.0.1"}, std::chrono::hours(1));
    ASSERT_TRUE(cert.ok()) << cert.status().ToString();
    Result<std::shared_ptr<http::ServerCredentials>> tls = http::ServerCredentials::Create(*cert);
    ASSERT_TRUE(tls.ok()) << tls.status().ToString();
    tls_ = *tls;
    ca_ = *ca;
    Result<std::unique_ptr<CoordinatorServer>> server =
        CoordinatorServer::Start(coordinator_, "127.0.0.1", 0, tls_);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    ca_file_ = testing::TempDir() + "vf-coordinator-ca-" + std::to_string(getpid()) + ".crt";
    std::FILE* f = std::fopen(ca_file_.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(ca->certificate_pem.c_str(), f);
    std::fclose(f);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Stop();
    std::remove(ca_file_.c_str());
  }

  // A refused handshake is retried until the deadline, so a call expected to fail takes all of
  // it: 3 s, several handshakes even under a sanitizer on a loaded machine. One expected to
  // succeed returns at its first answer, and may wait longer for it.
  Status Register(const std::string& url, const std::string& ca_file,
                  milliseconds deadline = milliseconds(3000)) {
    CoordinatorClient client(url, kJob, Credential(kToken, "w-0"), "w-0", deadline, ca_file);
    return client.Register(kFingerprint, kBuild, true);
  }
  Status RegisterExpectingSuccess(const std::string& url) {
    return Register(url, ca_file_, milliseconds(60'000));
  }
  size_t Registered() { return coordinator_.GetJob(kJob)->workers.size(); }
  std::string Url(const std::string& scheme, const std::string& host) {
    return scheme + "://" + host + ":" + std::to_string(server_->port());
  }

  Coordinator coordinator_;
  std::shared_ptr<http::ServerCredentials> tls_;
  http::KeyPair ca_;
  std::unique_ptr<CoordinatorServer> server_;
  std::string ca_file_;
};

TEST_F(TlsServerTest, AClientWithTheCaRegistersOverHttps) {
  EXPECT_EQ(server_->url().rfind("https://", 0), 0u) << server_->url();
  EXPECT_TRUE(RegisterExpectingSuccess(Url("https", "127.0.0.1")).ok());
  EXPECT_TRUE(RegisterExpectingSuccess(Url("https", "localhost")).ok());
  EXPECT_EQ(Registered(), 1u);
}

TEST_F(TlsServerTest, PlainHttpIsRefusedBeforeAnyHandler) {
  const RawReply raw =
      RawHttp(server_->port(), "POST /v1/jobs/team/mnist/register HTTP/1.1\r\nHost: x\r\n" +
                                   std::string("Content-Length: 2\r\n\r\n{}"));
  EXPECT_EQ(raw.status, 0) << raw.headers;  // no HTTP answer at all
  const Status plain = Register(Url("http", "127.0.0.1"), "");
  EXPECT_EQ(plain.code(), StatusCode::kUnavailable) << plain.message();
  EXPECT_EQ(Registered(), 0u);
}

TEST_F(TlsServerTest, WithoutTheCaOrForAnotherNameTheClientFailsSayingWhy) {
  const Status no_ca = Register(Url("https", "127.0.0.1"), "");
  EXPECT_EQ(no_ca.code(), StatusCode::kUnavailable);
  EXPECT_NE(no_ca.message().find("TLS handshake failed"), std::string::npos) << no_ca.message();
  // The right CA, but a certificate that names localhost only, dialled as 127.0.0.1.
  Result<http::KeyPair> localhost_only =
      http::IssueServerCertificate(ca_, {"localhost"}, std::chrono::hours(1));
  ASSERT_TRUE(localhost_only.ok());
  ASSERT_TRUE(tls_->Replace(*localhost_only).ok());
  const Status wrong_name = Register(Url("https", "127.0.0.1"), ca_file_);
  EXPECT_EQ(wrong_name.code(), StatusCode::kUnavailable);
  EXPECT_NE(wrong_name.message().find("TLS handshake failed"), std::string::npos)
      << wrong_name.message();
  // Unreadable: kUnavailable, the worker is replaced (a new pod gets the volume mounted
  // afresh), where a file that holds no certificate fails the job.
  const Status unreadable = Register(Url("https", "127.0.0.1"), ca_file_ + ".missing");
  EXPECT_EQ(unreadable.code(), StatusCode::kUnavailable);
  EXPECT_NE(unreadable.message().find("cannot read the coordinator's CA file"), std::string::npos)
      << unreadable.message();
  const std::string not_a_certificate = ca_file_ + ".txt";
  std::FILE* f = std::fopen(not_a_certificate.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("not a certificate\n", f);
  std::fclose(f);
  const Status not_pem = Register(Url("https", "127.0.0.1"), not_a_certificate);
  std::remove(not_a_certificate.c_str());
  EXPECT_EQ(not_pem.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(not_pem.message().find("holds no PEM certificate"), std::string::npos)
      << not_pem.message();
  EXPECT_EQ(Registered(), 0u);
  // The name the certificate holds still works.
  const Status right_name = RegisterExpectingSuccess(Url("https", "localhost"));
  EXPECT_TRUE(right_name.ok()) << right_name.ToString();
  EXPECT_EQ(Registered(), 1u);
}

}  // namespace
}  // namespace vf
