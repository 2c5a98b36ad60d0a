// Coordinator::RestrictWorkers: how a credential, a pure function of its worker's name, is taken
// back once its worker has gone.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "operator/coordinator/coordinator.h"

namespace vf {
namespace {

constexpr char kAdmittedJob[] = "team/mnist";
constexpr char kAdmittedSecret[] = "secret-token";

class AdmittedWorkersTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(c_.AddJob(kAdmittedJob, kAdmittedSecret, "fp-1", "build-1").ok());
  }

  Status Check(const std::string& worker) {
    return c_.CheckCredential(kAdmittedJob, worker,
                              WorkerCredential(kAdmittedSecret, worker).value());
  }

  Coordinator c_;
};

TEST_F(AdmittedWorkersTest, AJobNeverRestrictedAcceptsEveryDerivedCredential) {
  EXPECT_TRUE(Check("w-0").ok());
  EXPECT_TRUE(Check("anyone").ok());
}

TEST_F(AdmittedWorkersTest, ARevokedWorkersOwnCredentialIsRefusedLikeAWrongOne) {
  ASSERT_TRUE(c_.RestrictWorkers(kAdmittedJob, {"w-0", "w-1"}).ok());
  EXPECT_TRUE(Check("w-0").ok());
  EXPECT_TRUE(Check("w-1").ok());
  EXPECT_EQ(Check("w-2").code(), StatusCode::kUnauthenticated);  // never admitted

  // w-1's pod is gone: its credential, still validly derived, is refused from now on, in the
  // words a wrong credential gets, so that the answer says nothing of who was admitted.
  ASSERT_TRUE(c_.RestrictWorkers(kAdmittedJob, {"w-0"}).ok());
  const Status revoked = Check("w-1");
  EXPECT_EQ(revoked.code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(revoked.message(),
            c_.CheckCredential(kAdmittedJob, "w-1", "not-a-credential").message());
  EXPECT_TRUE(Check("w-0").ok());
}

TEST_F(AdmittedWorkersTest, AnEmptySetRefusesEveryoneAndAnUnknownJobIsNotFound) {
  ASSERT_TRUE(c_.RestrictWorkers(kAdmittedJob, {}).ok());
  EXPECT_EQ(Check("w-0").code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(c_.RestrictWorkers("team/other", {"w-0"}).code(), StatusCode::kNotFound);
}

TEST_F(AdmittedWorkersTest, AJobAddedAgainStartsUnrestricted) {
  ASSERT_TRUE(c_.RestrictWorkers(kAdmittedJob, {"w-0"}).ok());
  ASSERT_TRUE(c_.RemoveJob(kAdmittedJob).ok());
  ASSERT_TRUE(c_.AddJob(kAdmittedJob, kAdmittedSecret, "fp-1", "build-1").ok());
  EXPECT_TRUE(Check("w-1").ok());
}

}  // namespace
}  // namespace vf
