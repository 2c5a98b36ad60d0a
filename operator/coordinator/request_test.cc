#include "operator/coordinator/request.h"

#include <gtest/gtest.h>

namespace vf::coordinator {
namespace {

TEST(ParseRouteTest, ReadsEveryActionOfAJob) {
  Result<Route> route = ParseRoute("/v1/jobs/team-a/mnist/ack");
  ASSERT_TRUE(route.ok()) << route.status().message();
  EXPECT_EQ(route->job, "team-a/mnist");
  EXPECT_EQ(route->action, Action::kAck);
  EXPECT_EQ(ParseRoute("/v1/jobs/a/b/plan")->action, Action::kPlan);
  EXPECT_EQ(ParseRoute("/v1/jobs/a/b/register")->action, Action::kRegister);
}

TEST(ParseRouteTest, AStoreKeyMayHoldSlashesPlainOrEncoded) {
  EXPECT_EQ(ParseRoute("/v1/jobs/a/b/store/epoch-1/rank-0")->key, "epoch-1/rank-0");
  EXPECT_EQ(ParseRoute("/v1/jobs/a/b/store/epoch-1%2Frank-0")->key, "epoch-1/rank-0");
}

TEST(ParseRouteTest, UnknownPathsAreNotFoundAndBadEncodingInvalid) {
  for (const char* path : {"/", "/v1/jobs/", "/v1/jobs/a", "/v1/jobs/a/b", "/v1/jobs/a/b/nope",
                           "/v1/jobs/a/b/plan/extra", "/v1/jobs/a/b/store", "/v1/jobs/a/b/store/",
                           "/v1/jobs//b/plan", "/v2/jobs/a/b/plan"}) {
    EXPECT_EQ(ParseRoute(path).status().code(), StatusCode::kNotFound) << path;
  }
  EXPECT_EQ(ParseRoute("/v1/jobs/a%zz/b/plan").status().code(), StatusCode::kInvalidArgument);
}

TEST(MethodAllowedTest, PlansAreReadStoresReadAndWrittenTheRestPosted) {
  EXPECT_TRUE(MethodAllowed(Action::kPlan, "GET"));
  EXPECT_FALSE(MethodAllowed(Action::kPlan, "POST"));
  EXPECT_TRUE(MethodAllowed(Action::kStore, "PUT"));
  EXPECT_FALSE(MethodAllowed(Action::kAck, "GET"));
  EXPECT_EQ(AllowedMethods(Action::kStore), "GET, PUT");
}

TEST(ParseQueryTest, DecodesPairsAndRefusesNonIntegers) {
  Result<std::map<std::string, std::string>> query = ParseQuery("after=3&&timeout_ms=%31&flag");
  ASSERT_TRUE(query.ok());
  EXPECT_EQ(QueryInt(*query, "after", 0).value(), 3);
  EXPECT_EQ(QueryInt(*query, "missing", 7).value(), 7);
  EXPECT_EQ(PollTimeout(*query, 60000).value(), 1);
  EXPECT_EQ(query->at("flag"), "");
  EXPECT_FALSE(QueryInt({{"after", "3x"}}, "after", 0).ok());
  EXPECT_FALSE(PollTimeout({{"timeout_ms", "-1"}}, 60000).ok());
  EXPECT_EQ(PollTimeout({{"timeout_ms", "999999"}}, 60000).value(), 60000);
}

TEST(BearerTokenTest, TheSchemeIsCaseInsensitiveAndTheTokenNonEmpty) {
  EXPECT_EQ(BearerToken("Bearer abc"), "abc");
  EXPECT_EQ(BearerToken("bEaReR   abc"), "abc");
  EXPECT_EQ(BearerToken("Bearer "), "");
  EXPECT_EQ(BearerToken("Bearer    "), "");
  EXPECT_EQ(BearerToken("Basic abc"), "");
}

TEST(ParseBodyTest, ReadsTheFieldsOfEachAction) {
  Result<Body> ack = ParseBody(Action::kAck, R"({"worker":"w1","epoch":4})", "w1");
  ASSERT_TRUE(ack.ok()) << ack.status().message();
  EXPECT_EQ(ack->epoch, 4);
  Result<Body> failure =
      ParseBody(Action::kFailure, R"({"worker":"w1","epoch":4,"step":9,"message":"m"})", "w1");
  ASSERT_TRUE(failure.ok());
  EXPECT_EQ(failure->step, 9);
  EXPECT_EQ(failure->message, "m");
}

TEST(ParseBodyTest, ABodyForAnotherWorkerIsDeniedAndAMissingFieldNamed) {
  EXPECT_EQ(ParseBody(Action::kLeave, R"({"worker":"w2"})", "w1").status().code(),
            StatusCode::kPermissionDenied);
  Result<Body> missing = ParseBody(Action::kAck, R"({"worker":"w1"})", "w1");
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("epoch"), std::string::npos);
  EXPECT_FALSE(ParseBody(Action::kPlan, R"({"worker":"w1"})", "w1").ok());
}

}  // namespace
}  // namespace vf::coordinator
