// The API server's Status objects turned into errors, and the error types' contract with
// vf::Status and the VF_* macros.
#include "operator/kube/errors.h"

#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "operator/kube/resource.h"

namespace vf::kube {
namespace {

using nlohmann::json;

// Bodies as kube-apiserver writes them.
constexpr char kNotFound[] =
    R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",)"
    R"("message":"configmaps \"settings\" not found","reason":"NotFound",)"
    R"("details":{"name":"settings","kind":"configmaps"},"code":404})";
constexpr char kAlreadyExists[] =
    R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",)"
    R"("message":"configmaps \"settings\" already exists","reason":"AlreadyExists",)"
    R"("details":{"name":"settings","kind":"configmaps"},"code":409})";
constexpr char kConflict[] =
    R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":)"
    R"("Operation cannot be fulfilled on leases.coordination.k8s.io \"leader\": the object has )"
    R"(been modified; please apply your changes to the latest version and try again",)"
    R"("reason":"Conflict","details":{"name":"leader","group":"coordination.k8s.io",)"
    R"("kind":"leases"},"code":409})";
constexpr char kInvalid[] =
    R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":)"
    R"("ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a )"
    R"(lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters",)"
    R"("reason":"Invalid","details":{"name":"Bad_Name","kind":"ConfigMap","causes":[)"
    R"({"reason":"FieldValueInvalid","message":"Invalid value: \"Bad_Name\"",)"
    R"("field":"metadata.name"}]},"code":422})";
constexpr char kExpired[] =
    R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",)"
    R"json("message":"too old resource version: 1 (5170)","reason":"Expired","code":410})json";
constexpr char kForbidden[] =
    R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":)"
    R"("secrets is forbidden: User \"system:serviceaccount:e2e:reader\" cannot list )"
    R"(resource \"secrets\" in API group \"\" in the namespace \"e2e\"","reason":"Forbidden",)"
    R"("details":{"kind":"secrets"},"code":403})";
constexpr char kThrottled[] =
    R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",)"
    R"("message":"Too many requests, please try again later.","reason":"TooManyRequests",)"
    R"("details":{"retryAfterSeconds":3},"code":429})";

TEST(ParseApiErrorTest, NotFoundKeepsReasonMessageAndDetails) {
  const ApiError error = ParseApiError(404, kNotFound);
  EXPECT_EQ(error.reason, Reason::kNotFound);
  EXPECT_EQ(error.http_code, 404);
  EXPECT_EQ(error.server_reason, "NotFound");
  EXPECT_EQ(error.message, "configmaps \"settings\" not found");
  EXPECT_EQ(error.details["name"], "settings");
}

TEST(ParseApiErrorTest, TellsAlreadyExistsFromConflictAlthoughBothAre409) {
  EXPECT_EQ(ParseApiError(409, kAlreadyExists).reason, Reason::kAlreadyExists);
  const ApiError conflict = ParseApiError(409, kConflict);
  EXPECT_EQ(conflict.reason, Reason::kConflict);
  EXPECT_NE(conflict.message.find("the object has been modified"), std::string::npos);
}

TEST(ParseApiErrorTest, InvalidCarriesTheFieldCauses) {
  const ApiError error = ParseApiError(422, kInvalid);
  EXPECT_EQ(error.reason, Reason::kInvalid);
  ASSERT_TRUE(error.details["causes"].is_array());
  EXPECT_EQ(error.details["causes"][0]["field"], "metadata.name");
}

TEST(ParseApiErrorTest, ExpiredIsGone) {
  const ApiError error = ParseApiError(410, kExpired);
  EXPECT_EQ(error.reason, Reason::kGone);
  EXPECT_EQ(error.server_reason, "Expired");
}

TEST(ParseApiErrorTest, ForbiddenNamesTheUserAndResource) {
  const ApiError error = ParseApiError(403, kForbidden);
  EXPECT_EQ(error.reason, Reason::kForbidden);
  EXPECT_NE(error.message.find("cannot list resource \"secrets\""), std::string::npos);
}

TEST(ParseApiErrorTest, RetryAfterComesFromDetails) {
  const ApiError error = ParseApiError(429, kThrottled);
  EXPECT_EQ(error.reason, Reason::kTooManyRequests);
  EXPECT_EQ(error.retry_after, std::chrono::seconds(3));
}

TEST(ParseApiErrorTest, NonStatusBodyFollowsTheCodeAndIsSummarized) {
  const ApiError error = ParseApiError(403, "Forbidden: user cannot\nget /healthz\n");
  EXPECT_EQ(error.reason, Reason::kForbidden);
  EXPECT_EQ(error.message, "Forbidden: user cannot get /healthz");
  const ApiError html = ParseApiError(502, "<html>" + std::string(1000, 'x') + "</html>");
  EXPECT_EQ(html.reason, Reason::kUnknown);
  EXPECT_LT(html.message.size(), 400u);
  const ApiError empty = ParseApiError(503, "");
  EXPECT_EQ(empty.reason, Reason::kServiceUnavailable);
  EXPECT_NE(empty.message.find("503"), std::string::npos);
}

TEST(ParseApiErrorTest, UnknownServerReasonFollowsTheCode) {
  const ApiError error =
      ParseApiError(409, R"({"kind":"Status","reason":"SomethingNew","message":"m","code":409})");
  EXPECT_EQ(error.reason, Reason::kConflict);
  EXPECT_EQ(error.server_reason, "SomethingNew");
}

TEST(ApiErrorFromStatusTest, WatchErrorObjectWithoutHttpAnswer) {
  const ApiError error = ApiErrorFromStatus(json::parse(kExpired));
  EXPECT_EQ(error.reason, Reason::kGone);
  EXPECT_EQ(error.http_code, 410);
  const ApiError bare = ApiErrorFromStatus(json::object(), 500);
  EXPECT_EQ(bare.reason, Reason::kInternalError);
  EXPECT_FALSE(bare.message.empty());
}

TEST(ApiErrorTest, StatusMessageNamesVerbResourceReasonAndMessage) {
  ApiError error = ParseApiError(404, kNotFound);
  error.context = "get " + Describe(kConfigMaps, "team", "settings");
  const Status status = error.ToStatus();
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_EQ(status.message(),
            "get configmaps team/settings: NotFound: configmaps \"settings\" not found (HTTP "
            "404)");
}

TEST(ApiErrorTest, OnlyNotFoundMapsToNotFoundCode) {
  for (int r = static_cast<int>(Reason::kOk); r <= static_cast<int>(Reason::kBadResponse); ++r) {
    const auto reason = static_cast<Reason>(r);
    EXPECT_EQ(StatusCodeFor(reason) == StatusCode::kNotFound, reason == Reason::kNotFound)
        << ReasonName(reason);
  }
  EXPECT_EQ(StatusCodeFor(Reason::kConflict), StatusCode::kFailedPrecondition);
  EXPECT_EQ(StatusCodeFor(Reason::kInvalid), StatusCode::kInvalidArgument);
  EXPECT_EQ(StatusCodeFor(Reason::kTransport), StatusCode::kUnavailable);
  EXPECT_EQ(StatusCodeFor(Reason::kDeadlineExceeded), StatusCode::kDeadlineExceeded);
}

ApiResult<int> Fails() {
  ApiError error = ParseApiError(409, kConflict);
  error.context = "replace leases.coordination.k8s.io ns/leader";
  return error;
}
ApiResult<int> Succeeds() { return 7; }

Result<int> Propagate(bool fail) {
  VF_ASSIGN_OR_RETURN(int value, fail ? Fails() : Succeeds());
  return value + 1;
}

Status PropagateStatus(bool fail) {
  VF_RETURN_IF_ERROR(fail ? ApiStatus(Fails().error()) : ApiStatus::Ok());
  return Status::Ok();
}

TEST(ApiResultTest, WorksWithTheStatusMacros) {
  Result<int> ok = Propagate(false);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 8);
  Result<int> failed = Propagate(true);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(
      failed.status().message().find("replace leases.coordination.k8s.io ns/leader: Conflict"),
      std::string::npos);
  EXPECT_TRUE(PropagateStatus(false).ok());
  EXPECT_FALSE(PropagateStatus(true).ok());
}

TEST(ApiResultTest, ConvertsToResultAndKeepsTheReasonUntilThen) {
  ApiResult<int> result = Fails();
  EXPECT_EQ(result.reason(), Reason::kConflict);
  EXPECT_EQ(result.error().http_code, 409);
  Result<int> plain = result;
  EXPECT_FALSE(plain.ok());
  ApiResult<int> good = Succeeds();
  EXPECT_EQ(good.reason(), Reason::kOk);
  EXPECT_TRUE(good.status().ok());
  Result<int> plain_good = std::move(good);
  EXPECT_EQ(*plain_good, 7);
}

TEST(ResourceTest, PathsForCoreGroupedClusterScopedAndAllNamespaces) {
  EXPECT_EQ(ResourcePath(kPods, "team", "w-0"), "/api/v1/namespaces/team/pods/w-0");
  EXPECT_EQ(ResourcePath(kPods, ""), "/api/v1/pods");
  EXPECT_EQ(ResourcePath(kNodes, "ignored", "gpu-1", "status"), "/api/v1/nodes/gpu-1/status");
  EXPECT_EQ(ResourcePath(kLeases, "kube-system", "leader"),
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/leader");
  EXPECT_EQ(ResourcePath(kVirtualFlowJobs, "team", "mnist", "status"),
            "/apis/virtualflow.io/v1alpha1/namespaces/team/virtualflowjobs/mnist/status");
  EXPECT_EQ(ResourcePath(kConfigMaps, "a b", "x/y"), "/api/v1/namespaces/a%20b/configmaps/x%2Fy");
  EXPECT_EQ(kLeases.ApiVersion(), "coordination.k8s.io/v1");
  EXPECT_EQ(kPods.ApiVersion(), "v1");
  EXPECT_EQ(Describe(kPods, ""), "pods in all namespaces");
  EXPECT_EQ(Describe(kNodes, "", "gpu-1"), "nodes gpu-1");
  EXPECT_EQ(Describe(kLeases, "ns", "l"), "leases.coordination.k8s.io ns/l");
}

}  // namespace
}  // namespace vf::kube
