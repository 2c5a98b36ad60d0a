// Kubeconfig files and in-cluster configuration, with files written for each test.
#include "operator/kube/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "operator/kube/client.h"
#include "operator/kube/test_util.h"

namespace vf::kube {
namespace {

using testing::KeyPair;
using testing::TempDir;
using testing::TestCa;

std::string Base64(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t n = (static_cast<uint8_t>(bytes[i]) << 16) |
                       (static_cast<uint8_t>(bytes[i + 1]) << 8) |
                       static_cast<uint8_t>(bytes[i + 2]);
    for (int shift = 18; shift >= 0; shift -= 6) out += kAlphabet[(n >> shift) & 63];
  }
  if (i + 1 == bytes.size()) {
    const uint32_t n = static_cast<uint8_t>(bytes[i]) << 16;
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    const uint32_t n =
        (static_cast<uint8_t>(bytes[i]) << 16) | (static_cast<uint8_t>(bytes[i + 1]) << 8);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += '=';
  }
  return out;
}

// Sets (or, with nullopt, unsets) an environment variable for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value.has_value()) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_.has_value()) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(DecodeBase64Test, DecodesPaddedUnpaddedAndWrapped) {
  EXPECT_EQ(*DecodeBase64("aGVsbG8="), "hello");
  EXPECT_EQ(*DecodeBase64("aGVsbG8"), "hello");
  EXPECT_EQ(*DecodeBase64("aGVs\nbG8h\n"), "hello!");
  EXPECT_EQ(*DecodeBase64(""), "");
  for (const std::string text : {"", "a", "ab", "abc", "abcd", "\x01\xff\x80 binary"}) {
    EXPECT_EQ(*DecodeBase64(Base64(text)), text);
  }
  EXPECT_FALSE(DecodeBase64("a$b=").ok());
  EXPECT_FALSE(DecodeBase64("aGVs=bG8").ok());
  EXPECT_FALSE(DecodeBase64("a").ok());
}

class KubeconfigTest : public ::testing::Test {
 protected:
  TempDir dir_;
  TestCa ca_;
  KeyPair admin_ = ca_.Issue("admin", /*server=*/false);
};

TEST_F(KubeconfigTest, EmbeddedCertificatesOfTheCurrentContext) {
  const std::string yaml = R"(apiVersion: v1
kind: Config
current-context: admin@e2e
clusters:
- name: e2e
  cluster:
    server: https://127.0.0.1:6443/
    certificate-authority-data: )" +
                           Base64(ca_.cert_pem()) +
                           R"(
contexts:
- name: admin@e2e
  context: {cluster: e2e, user: admin, namespace: team}
- name: other
  context: {cluster: e2e, user: nobody}
users:
- name: admin
  user:
    client-certificate-data: )" +
                           Base64(admin_.cert_pem) +
                           R"(
    client-key-data: )" + Base64(admin_.key_pem) +
                           "\n";
  Result<Config> config = ParseKubeconfig(yaml, dir_.path());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->server, "https://127.0.0.1:6443");  // trailing slash dropped
  EXPECT_EQ(config->ca_pem, ca_.cert_pem());
  EXPECT_EQ(config->client_cert_pem, admin_.cert_pem);
  EXPECT_EQ(config->client_key_pem, admin_.key_pem);
  EXPECT_EQ(config->default_namespace, "team");
  EXPECT_TRUE(config->token.empty());
  // The same material builds a working client configuration.
  EXPECT_TRUE(Client::Create(*config).ok());
}

TEST_F(KubeconfigTest, FilesRelativeToTheKubeconfigAndAnExplicitContext) {
  dir_.Write("ca.crt", ca_.cert_pem());
  std::filesystem::create_directory(dir_.path() + "/pki");
  dir_.Write("pki/admin.crt", admin_.cert_pem);
  dir_.Write("pki/admin.key", admin_.key_pem);
  dir_.Write("token", "  file-token\n");
  const std::string path = dir_.Write("config", R"(
current-context: certs
clusters:
- name: c
  cluster:
    server: https://10.0.0.1:443
    certificate-authority: ca.crt
    tls-server-name: kubernetes.default
contexts:
- name: certs
  context: {cluster: c, user: certs}
- name: token
  context: {cluster: c, user: token, namespace: ops}
users:
- name: certs
  user: {client-certificate: pki/admin.crt, client-key: pki/admin.key}
- name: token
  user: {tokenFile: token}
)");
  Result<Config> certs = LoadKubeconfig(path);
  ASSERT_TRUE(certs.ok()) << certs.status().ToString();
  EXPECT_EQ(certs->client_cert_pem, admin_.cert_pem);
  EXPECT_EQ(certs->tls_server_name, "kubernetes.default");
  EXPECT_EQ(certs->ca_pem, ca_.cert_pem());

  Result<Config> token = LoadKubeconfig(path, "token");
  ASSERT_TRUE(token.ok()) << token.status().ToString();
  EXPECT_EQ(token->token, "file-token");
  EXPECT_EQ(token->token_file, dir_.path() + "/token");
  EXPECT_TRUE(token->client_cert_pem.empty());
  EXPECT_EQ(token->default_namespace, "ops");
}

TEST_F(KubeconfigTest, InlineTokenAndInsecureCluster) {
  Result<Config> config = ParseKubeconfig(R"(
current-context: x
clusters: [{name: c, cluster: {server: "https://h:1", insecure-skip-tls-verify: true}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
users: [{name: u, user: {token: abc.def}}]
)",
                                          dir_.path());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->token, "abc.def");
  EXPECT_TRUE(config->insecure_skip_tls_verify);
  EXPECT_TRUE(config->ca_pem.empty());
}

TEST_F(KubeconfigTest, ErrorsNameWhatIsWrong) {
  struct Case {
    const char* yaml;
    const char* context;
    const char* expected;
  };
  const Case cases[] = {
      {"clusters: []", "", "no current-context"},
      {"current-context: a\ncontexts: []", "", "no entry named \"a\" in contexts"},
      {"current-context: a\ncontexts: [{name: a, context: {cluster: c}}]", "",
       "no entry named \"c\" in clusters"},
      {"current-context: a\ncontexts: [{name: a, context: {user: u}}]", "", "names no cluster"},
      {"contexts: [{name: a, context: {cluster: c}}]\nclusters: [{name: c, cluster: {}}]", "a",
       "has no server"},
      {"contexts: [{name: a, context: {cluster: c, user: u}}]\n"
       "clusters: [{name: c, cluster: {server: 'https://h'}}]\n"
       "users: [{name: u, user: {exec: {command: aws}}}]",
       "a", "\"exec\" credentials are not supported"},
      {"contexts: [{name: a, context: {cluster: c}}]\n"
       "clusters: [{name: c, cluster: {server: 'https://h', certificate-authority: nope.crt}}]",
       "a", "nope.crt"},
      {"contexts: [{name: a, context: {cluster: c}}]\n"
       "clusters: [{name: c, cluster: {server: 'https://h', certificate-authority-data: '@@'}}]",
       "a", "invalid base64"},
      {"contexts: [{name: a, context: {cluster: c, user: u}}]\n"
       "clusters: [{name: c, cluster: {server: 'https://h'}}]\n"
       "users: [{name: u, user: {client-certificate-data: 'YQ=='}}]",
       "a", "without a key"},
      {"{{{", "", "malformed kubeconfig"},
  };
  for (const Case& c : cases) {
    Result<Config> config = ParseKubeconfig(c.yaml, dir_.path(), c.context);
    ASSERT_FALSE(config.ok()) << c.yaml;
    EXPECT_NE(config.status().message().find(c.expected), std::string::npos)
        << config.status().message();
  }
  Result<Config> missing = LoadKubeconfig(dir_.path() + "/absent");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST_F(KubeconfigTest, InClusterFromAServiceAccountDirectory) {
  dir_.Write("token", "sa-token\n");
  dir_.Write("ca.crt", ca_.cert_pem());
  dir_.Write("namespace", "team");
  ScopedEnv sa("VF_SERVICEACCOUNT_DIR", dir_.path());
  ScopedEnv host("KUBERNETES_SERVICE_HOST", "127.0.0.1");
  ScopedEnv port("KUBERNETES_SERVICE_PORT", "6443");
  Result<Config> config = InClusterConfig();
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->server, "https://127.0.0.1:6443");
  EXPECT_EQ(config->token, "sa-token");
  EXPECT_EQ(config->token_file, dir_.path() + "/token");
  EXPECT_EQ(config->ca_pem, ca_.cert_pem());
  EXPECT_EQ(config->default_namespace, "team");
  EXPECT_TRUE(Client::Create(*config).ok());
  // DefaultConfig prefers the in-cluster configuration when it is there.
  Result<Config> chosen = DefaultConfig();
  ASSERT_TRUE(chosen.ok());
  EXPECT_EQ(chosen->token, "sa-token");
}

TEST_F(KubeconfigTest, InClusterIPv6HostIsBracketed) {
  dir_.Write("token", "t");
  dir_.Write("ca.crt", ca_.cert_pem());
  ScopedEnv sa("VF_SERVICEACCOUNT_DIR", dir_.path());
  ScopedEnv host("KUBERNETES_SERVICE_HOST", "fd00::1");
  ScopedEnv port("KUBERNETES_SERVICE_PORT", "443");
  Result<Config> config = InClusterConfig();
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->server, "https://[fd00::1]:443");
  EXPECT_EQ(config->default_namespace, "");
}

TEST_F(KubeconfigTest, InClusterNeedsTheEnvironmentAndTheToken) {
  {
    ScopedEnv host("KUBERNETES_SERVICE_HOST", std::nullopt);
    Result<Config> config = InClusterConfig();
    ASSERT_FALSE(config.ok());
    EXPECT_NE(config.status().message().find("KUBERNETES_SERVICE_HOST"), std::string::npos);
  }
  ScopedEnv sa("VF_SERVICEACCOUNT_DIR", dir_.path());
  ScopedEnv host("KUBERNETES_SERVICE_HOST", "127.0.0.1");
  ScopedEnv port("KUBERNETES_SERVICE_PORT", "6443");
  Result<Config> config = InClusterConfig();
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find(dir_.path() + "/token"), std::string::npos);
}

TEST_F(KubeconfigTest, ClientRefusesMaterialThatCannotWork) {
  Config config;
  EXPECT_FALSE(Client::Create(config).ok());  // no server
  config.server = "ftp://h";
  EXPECT_FALSE(Client::Create(config).ok());
  config.server = "https://127.0.0.1:6443";
  EXPECT_TRUE(Client::Create(config).ok());

  Config bad_ca = config;
  bad_ca.ca_pem = "not a certificate";
  Result<std::unique_ptr<Client>> client = Client::Create(bad_ca);
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("certificate authority"), std::string::npos);

  Config mismatched = config;
  mismatched.client_cert_pem = admin_.cert_pem;
  mismatched.client_key_pem = ca_.Issue("other", false).key_pem;
  client = Client::Create(mismatched);
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("client key"), std::string::npos)
      << client.status().message();

  Config missing_token = config;
  missing_token.token_file = dir_.path() + "/absent";
  client = Client::Create(missing_token);
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("absent"), std::string::npos);
}

}  // namespace
}  // namespace vf::kube
