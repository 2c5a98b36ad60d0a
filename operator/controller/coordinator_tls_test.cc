// The renewal rule of the coordinator's certificate (coordinator_tls.h). The Secret itself is
// read and written against a real API server in tests/e2e (test_operator.py, test_chart.py).
#include "operator/controller/coordinator_tls.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace vf::controller {
namespace {

using std::chrono::hours;
using Clock = std::chrono::system_clock;

const std::vector<std::string> kNames = {"vf.ops.svc", "vf.ops.svc.cluster.local", "localhost",
                                         "127.0.0.1"};

CoordinatorTls Fresh() {
  bool changed = false;
  Result<CoordinatorTls> tls = Renewed({}, kNames, Clock::now(), true, &changed);
  EXPECT_TRUE(tls.ok()) << tls.status().ToString();
  EXPECT_TRUE(changed);
  return tls.ok() ? *tls : CoordinatorTls{};
}

TEST(CoordinatorTlsTest, NamesAreTheUrlsHostAndLoopback) {
  EXPECT_EQ(CoordinatorNames("https://vf.ops.svc:7070"), kNames);
  EXPECT_EQ(CoordinatorNames("https://10.0.0.1:7070"),
            (std::vector<std::string>{"10.0.0.1", "localhost", "127.0.0.1"}));
  EXPECT_EQ(CoordinatorNames("https://127.0.0.1:7070"),
            (std::vector<std::string>{"127.0.0.1", "localhost"}));
}

TEST(CoordinatorTlsTest, AFirstStartMakesACaAndAServerCertificateForTheNames) {
  const CoordinatorTls tls = Fresh();
  EXPECT_TRUE(http::CheckServerCertificate(tls.server, tls.ca.certificate_pem).ok());
  EXPECT_EQ(*http::CertificateNames(tls.server.certificate_pem), kNames);
  const auto server_end = *http::CertificateNotAfter(tls.server.certificate_pem);
  EXPECT_LE(server_end, Clock::now() + kServerValidity);
  EXPECT_GT(server_end, Clock::now() + kServerValidity - hours(1));
  EXPECT_GT(*http::CertificateNotAfter(tls.ca.certificate_pem),
            Clock::now() + kCaValidity - hours(1));
}

TEST(CoordinatorTlsTest, NothingChangesWhileTheCertificatesAreFresh) {
  const CoordinatorTls tls = Fresh();
  bool changed = true;
  Result<CoordinatorTls> again = Renewed(tls, kNames, Clock::now(), true, &changed);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(changed);
  EXPECT_EQ(again->server.certificate_pem, tls.server.certificate_pem);
}

TEST(CoordinatorTlsTest, TheServerCertificateIsRenewedNearItsEndOrForNewNamesWithTheSameCa) {
  const CoordinatorTls tls = Fresh();
  // 60 of its 90 days gone: 30 left, the renewal point.
  bool changed = false;
  Result<CoordinatorTls> later =
      Renewed(tls, kNames, Clock::now() + kServerValidity - kServerRenewBefore, false, &changed);
  ASSERT_TRUE(later.ok());
  EXPECT_TRUE(changed);
  EXPECT_EQ(later->ca.certificate_pem, tls.ca.certificate_pem);
  EXPECT_NE(later->server.certificate_pem, tls.server.certificate_pem);
  EXPECT_TRUE(http::CheckServerCertificate(later->server, tls.ca.certificate_pem).ok());

  Result<CoordinatorTls> moved =
      Renewed(tls, {"vf.other.svc", "localhost"}, Clock::now(), false, &changed);
  ASSERT_TRUE(moved.ok());
  EXPECT_TRUE(changed);
  EXPECT_EQ(moved->ca.certificate_pem, tls.ca.certificate_pem);
  EXPECT_EQ(*http::CertificateNames(moved->server.certificate_pem),
            (std::vector<std::string>{"vf.other.svc", "localhost"}));
}

TEST(CoordinatorTlsTest, TheCaIsRenewedOnlyWhenAllowedAndNearItsEnd) {
  const CoordinatorTls tls = Fresh();
  const auto near_end = Clock::now() + kCaValidity - kCaRenewBefore;
  bool changed = false;
  Result<CoordinatorTls> kept = Renewed(tls, kNames, near_end, false, &changed);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->ca.certificate_pem, tls.ca.certificate_pem);
  Result<CoordinatorTls> renewed = Renewed(tls, kNames, near_end, true, &changed);
  ASSERT_TRUE(renewed.ok());
  EXPECT_TRUE(changed);
  EXPECT_NE(renewed->ca.certificate_pem, tls.ca.certificate_pem);
  EXPECT_TRUE(http::CheckServerCertificate(renewed->server, renewed->ca.certificate_pem).ok());
}

TEST(CoordinatorTlsTest, AServerCertificateOfAnotherCaIsReplaced) {
  const CoordinatorTls tls = Fresh();
  CoordinatorTls mixed = Fresh();
  mixed.server = tls.server;
  bool changed = false;
  Result<CoordinatorTls> fixed = Renewed(mixed, kNames, Clock::now(), false, &changed);
  ASSERT_TRUE(fixed.ok());
  EXPECT_TRUE(changed);
  EXPECT_TRUE(http::CheckServerCertificate(fixed->server, mixed.ca.certificate_pem).ok());
}

TEST(CoordinatorTlsTest, ARunningReplicaServesTheSecretsNewCertificateOfItsOwnCa) {
  const CoordinatorTls served = Fresh();
  EXPECT_FALSE(NextServed(served, served, kNames, Clock::now())->has_value());
  bool changed = false;
  Result<CoordinatorTls> stored =
      Renewed(served, kNames, Clock::now() + hours(24 * 61), false, &changed);
  ASSERT_TRUE(stored.ok() && changed);
  Result<std::optional<CoordinatorTls>> next = NextServed(served, *stored, kNames, Clock::now());
  ASSERT_TRUE(next.ok() && next->has_value());
  EXPECT_EQ((*next)->server.certificate_pem, stored->server.certificate_pem);
}

// Another replica's start rotated the CA: this one keeps the CA its jobs' workers trust, and
// renews its server certificate from that CA when due instead of serving one that expires.
TEST(CoordinatorTlsTest,
     AfterAnotherReplicaRotatedTheCaTheServedCaStaysAndItsCertificateIsRenewed) {
  const CoordinatorTls served = Fresh();
  const CoordinatorTls rotated = Fresh();
  Result<std::optional<CoordinatorTls>> fresh = NextServed(served, rotated, kNames, Clock::now());
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_FALSE(fresh->has_value()) << "a fresh certificate of the served CA was replaced";
  const auto due = Clock::now() + hours(24 * 61);
  Result<std::optional<CoordinatorTls>> next = NextServed(served, rotated, kNames, due);
  ASSERT_TRUE(next.ok() && next->has_value());
  EXPECT_EQ((*next)->ca.certificate_pem, served.ca.certificate_pem);
  EXPECT_NE((*next)->server.certificate_pem, served.server.certificate_pem);
  EXPECT_TRUE(http::CheckServerCertificate((*next)->server, served.ca.certificate_pem).ok());
}

}  // namespace
}  // namespace vf::controller
