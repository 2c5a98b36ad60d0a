#include "tests/e2e/pod_runner/volumes.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace vf::podrunner {
namespace {

using nlohmann::json;

constexpr const char* kPodDir = "/state/pods/uid-1";

json Pod(json volumes) {
  return {{"metadata", {{"name", "p"}, {"namespace", "team"}, {"uid", "uid-1"}}},
          {"spec", {{"volumes", std::move(volumes)}}}};
}

json Container(json mounts) { return {{"name", "main"}, {"volumeMounts", std::move(mounts)}}; }

// An API with a Secret team/creds, a ConfigMap team/settings, a Bound claim team/data on the
// hostPath volume pv-data, a Pending claim team/waiting, and a PV without a host path.
VolumeLookups Api() {
  VolumeLookups l;
  l.objects = [](SourceKind kind, const std::string& ns, const std::string& name) -> Result<json> {
    if (kind == SourceKind::kSecret && ns == "team" && name == "creds") {
      return json{{"data", {{"password", "c2VjcmV0"}, {"user", "YWRh"}}}};  // secret, ada
    }
    if (kind == SourceKind::kConfigMap && ns == "team" && name == "settings") {
      return json{{"data", {{"mode", "fast"}}}};
    }
    return NotFound("not found");
  };
  l.claim = [](const std::string& ns, const std::string& name) -> Result<json> {
    if (ns != "team") return NotFound("not found");
    if (name == "data") {
      return json{{"spec", {{"volumeName", "pv-data"}}}, {"status", {{"phase", "Bound"}}}};
    }
    if (name == "nfs") {
      return json{{"spec", {{"volumeName", "pv-nfs"}}}, {"status", {{"phase", "Bound"}}}};
    }
    if (name == "waiting")
      return json{{"spec", json::object()}, {"status", {{"phase", "Pending"}}}};
    return NotFound("not found");
  };
  l.volume = [](const std::string& name) -> Result<json> {
    if (name == "pv-data") return json{{"spec", {{"hostPath", {{"path", "/srv/pv-data"}}}}}};
    if (name == "pv-nfs") return json{{"spec", {{"nfs", {{"path", "/x"}}}}}};
    return NotFound("not found");
  };
  return l;
}

Result<VolumePlan> Plan(const json& volumes, const json& mounts) {
  return PlanVolumes(Pod(volumes), Container(mounts), Api(), kPodDir, EnvContext());
}

TEST(PlanVolumesTest, NoMountsNoPlan) {
  auto plan = PlanVolumes(Pod(json::array()), json{{"name", "main"}}, Api(), kPodDir, {});
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->mounts.empty());
  EXPECT_TRUE(plan->volumes.empty());
}

TEST(PlanVolumesTest, TheServiceAccountTokenVolumeIsLeftOut) {
  auto plan = Plan(json::parse(R"([{"name": "kube-api-access-x7k2p", "projected": {"sources": [
                                      {"serviceAccountToken": {"path": "token"}}]}}])"),
                   json::parse(R"([{"name": "kube-api-access-x7k2p", "readOnly": true,
                      "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}])"));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_TRUE(plan->mounts.empty());
  EXPECT_TRUE(plan->volumes.empty());
}

TEST(PlanVolumesTest, EmptyDirLivesInThePodDirectory) {
  auto plan = Plan(json::parse(R"([{"name": "scratch", "emptyDir": {}},
                                   {"name": "unused", "emptyDir": {}}])"),
                   json::parse(R"([{"name": "scratch", "mountPath": "/scratch"}])"));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->volumes.size(), 1U) << "only mounted volumes are made";
  EXPECT_EQ(plan->volumes[0].kind, VolumeSource::Kind::kDirectory);
  EXPECT_EQ(plan->volumes[0].path, std::string(kPodDir) + "/volumes/scratch");
  ASSERT_EQ(plan->mounts.size(), 1U);
  EXPECT_EQ(plan->mounts[0],
            (BindMount{std::string(kPodDir) + "/volumes/scratch", "/scratch", false}));
}

TEST(PlanVolumesTest, MemoryEmptyDirIsATmpfsWithItsSizeLimit) {
  auto plan = Plan(json::parse(R"([{"name": "shm", "emptyDir": {"medium": "Memory",
                                                                 "sizeLimit": "64Mi"}}])"),
                   json::parse(R"([{"name": "shm", "mountPath": "/dev/shm"}])"));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->volumes[0].kind, VolumeSource::Kind::kMemory);
  EXPECT_EQ(plan->volumes[0].size_limit, 64 * 1024 * 1024);
}

TEST(PlanVolumesTest, HostPathWithSubPathAndReadOnly) {
  auto plan =
      Plan(json::parse(
               R"([{"name": "h", "hostPath": {"path": "/srv/h", "type": "DirectoryOrCreate"}}])"),
           json::parse(
               R"([{"name": "h", "mountPath": "/data/in", "subPath": "a/b", "readOnly": true}])"));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->volumes[0].host_path_type, "DirectoryOrCreate");
  EXPECT_EQ(plan->mounts[0], (BindMount{"/srv/h/a/b", "/data/in", true}));
  EXPECT_EQ(plan->sub_path_dirs, std::vector<std::string>{"/srv/h/a/b"});
}

TEST(PlanVolumesTest, ClaimFollowsItsPersistentVolumeToTheHostPath) {
  auto plan = Plan(json::parse(R"([{"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
                                   {"name": "r", "persistentVolumeClaim": {"claimName": "data",
                                                                           "readOnly": true}}])"),
                   json::parse(R"([{"name": "d", "mountPath": "/ckpt"},
                                   {"name": "r", "mountPath": "/ro"}])"));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->mounts[0], (BindMount{"/srv/pv-data", "/ckpt", false}));
  EXPECT_EQ(plan->mounts[1], (BindMount{"/srv/pv-data", "/ro", true}));
}

TEST(PlanVolumesTest, MissingOrUnboundClaimIsWorthWaitingFor) {
  auto missing = Plan(json::parse(R"([{"name": "d", "persistentVolumeClaim":
                                       {"claimName": "absent"}}])"),
                      json::parse(R"([{"name": "d", "mountPath": "/ckpt"}])"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("persistentvolumeclaim \"absent\" not found"),
            std::string::npos)
      << missing.status().message();
  auto unbound = Plan(json::parse(R"([{"name": "d", "persistentVolumeClaim":
                                       {"claimName": "waiting"}}])"),
                      json::parse(R"([{"name": "d", "mountPath": "/ckpt"}])"));
  ASSERT_FALSE(unbound.ok());
  EXPECT_NE(unbound.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unbound.status().message().find("not bound (phase Pending)"), std::string::npos);
}

TEST(PlanVolumesTest, ClaimOnAVolumeWithoutAHostPathCannotWork) {
  auto plan = Plan(json::parse(R"([{"name": "d", "persistentVolumeClaim": {"claimName": "nfs"}}])"),
                   json::parse(R"([{"name": "d", "mountPath": "/ckpt"}])"));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
}

TEST(PlanVolumesTest, SecretKeysBecomeReadOnlyFilesWithTheirModes) {
  auto plan = Plan(json::parse(R"([{"name": "s", "secret": {"secretName": "creds",
                                                            "defaultMode": 256}}])"),
                   json::parse(R"([{"name": "s", "mountPath": "/etc/creds"}])"));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const VolumeSource& v = plan->volumes[0];
  EXPECT_EQ(v.kind, VolumeSource::Kind::kFiles);
  EXPECT_EQ(v.files,
            (std::vector<VolumeFile>{{"password", "secret", 0400}, {"user", "ada", 0400}}));
  EXPECT_TRUE(plan->mounts[0].read_only);
}

TEST(PlanVolumesTest, ItemsPickKeysAndPaths) {
  auto plan = Plan(json::parse(R"([{"name": "c", "configMap": {"name": "settings", "items": [
                                      {"key": "mode", "path": "conf/mode.txt", "mode": 384}]}}])"),
                   json::parse(R"([{"name": "c", "mountPath": "/etc/app"}])"));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->volumes[0].files, (std::vector<VolumeFile>{{"conf/mode.txt", "fast", 0600}}));
}

TEST(PlanVolumesTest, MissingSecretWaitsUnlessOptional) {
  auto plan = Plan(json::parse(R"([{"name": "s", "secret": {"secretName": "later"}}])"),
                   json::parse(R"([{"name": "s", "mountPath": "/s"}])"));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kNotFound);
  EXPECT_NE(plan.status().message().find("secret \"later\" not found"), std::string::npos);
  auto optional = Plan(json::parse(R"([{"name": "s", "secret": {"secretName": "later",
                                                                "optional": true}}])"),
                       json::parse(R"([{"name": "s", "mountPath": "/s"}])"));
  ASSERT_TRUE(optional.ok());
  EXPECT_TRUE(optional->volumes[0].files.empty());
  auto key = Plan(json::parse(R"([{"name": "s", "secret": {"secretName": "creds", "items": [
                                     {"key": "nope", "path": "x"}]}}])"),
                  json::parse(R"([{"name": "s", "mountPath": "/s"}])"));
  ASSERT_FALSE(key.ok());
  EXPECT_NE(key.status().message().find("couldn't find key nope in Secret team/creds"),
            std::string::npos);
}

TEST(PlanVolumesTest, DownwardApiWritesFieldValues) {
  auto plan = Plan(json::parse(R"([{"name": "info", "downwardAPI": {"items": [
                                      {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}}])"),
                   json::parse(R"([{"name": "info", "mountPath": "/etc/podinfo"}])"));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->volumes[0].files, (std::vector<VolumeFile>{{"name", "p", 0644}}));
}

TEST(PlanVolumesTest, WhatCanNeverWorkFailsThePod) {
  const json good = json::parse(R"([{"name": "v", "emptyDir": {}}])");
  struct Case {
    json volumes;
    json mounts;
    std::string says;
  };
  const Case cases[] = {
      {json::parse(R"([{"name": "v", "nfs": {"server": "x", "path": "/"}}])"),
       json::parse(R"([{"name": "v", "mountPath": "/v"}])"), "does not support nfs volumes"},
      {good, json::parse(R"([{"name": "other", "mountPath": "/v"}])"), "no volume other"},
      {good, json::parse(R"([{"name": "v", "mountPath": "relative"}])"), "must be absolute"},
      {good, json::parse(R"([{"name": "v", "mountPath": "/v", "subPath": "../up"}])"),
       "inside the volume"},
      {good, json::parse(R"([{"name": "v", "mountPath": "/v"}, {"name": "v", "mountPath": "/v"}])"),
       "used twice"},
      {json::parse(R"([{"name": "v", "hostPath": {"path": "rel"}}])"),
       json::parse(R"([{"name": "v", "mountPath": "/v"}])"), "must be absolute"},
  };
  for (const Case& c : cases) {
    auto plan = Plan(c.volumes, c.mounts);
    ASSERT_FALSE(plan.ok()) << c.says;
    EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument) << c.says;
    EXPECT_NE(plan.status().message().find(c.says), std::string::npos) << plan.status().message();
  }
}

TEST(PlanVolumesTest, ParentsAreMountedBeforeChildren) {
  auto plan = Plan(json::parse(R"([{"name": "a", "emptyDir": {}}, {"name": "b", "emptyDir": {}}])"),
                   json::parse(R"([{"name": "b", "mountPath": "/data/inner"},
                                   {"name": "a", "mountPath": "/data"}])"));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->mounts[0].target, "/data");
  EXPECT_EQ(plan->mounts[1].target, "/data/inner");
}

TEST(AddTerminationMessageTest, APodFileIsMountedAtTheContainersPath) {
  VolumePlan plan;
  AddTerminationMessage(plan, Container(json::array()), kPodDir);  // the API server's default
  EXPECT_EQ(plan.termination_message, std::string(kPodDir) + "/termination-log");
  ASSERT_EQ(plan.mounts.size(), 1U);
  EXPECT_EQ(plan.mounts[0], (BindMount{plan.termination_message, "/dev/termination-log", false}));

  VolumePlan custom;
  json container = Container(json::array());
  container["terminationMessagePath"] = "/var/log/outcome";
  AddTerminationMessage(custom, container, kPodDir);
  ASSERT_EQ(custom.mounts.size(), 1U);
  EXPECT_EQ(custom.mounts[0].target, "/var/log/outcome");

  VolumePlan none;
  container["terminationMessagePath"] = "relative";
  AddTerminationMessage(none, container, kPodDir);
  EXPECT_TRUE(none.mounts.empty());
  EXPECT_TRUE(none.termination_message.empty());
}

TEST(ParseQuantityTest, BinaryAndDecimalSuffixes) {
  EXPECT_EQ(*ParseQuantity("1500"), 1500);
  EXPECT_EQ(*ParseQuantity("64Mi"), 64 * 1024 * 1024);
  EXPECT_EQ(*ParseQuantity("1G"), 1000000000);
  EXPECT_EQ(*ParseQuantity("1.5Ki"), 1536);
  for (const char* bad : {"", "Mi", "1Xi", "1..5", "-1"})
    EXPECT_FALSE(ParseQuantity(bad).ok()) << bad;
}

TEST(MissingDirsTest, FromTheFirstMissingAncestorDown) {
  const std::set<std::string> present = {"/data"};
  auto exists = [&](const std::string& p) { return present.count(p) > 0; };
  EXPECT_EQ(MissingDirs("/data/a/b", exists), (std::vector<std::string>{"/data/a", "/data/a/b"}));
  EXPECT_TRUE(MissingDirs("/data", exists).empty());
  EXPECT_EQ(MissingDirs("/x", exists), std::vector<std::string>{"/x"});
}

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vf-volumes-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  static bool Exists(const std::string& p) { return access(p.c_str(), F_OK) == 0; }
  std::string dir_;
};

TEST_F(PrepareTest, MakesFilesAndMountPointsAndCleanupRemovesThem) {
  VolumePlan plan;
  VolumeSource files;
  files.name = "s";
  files.kind = VolumeSource::Kind::kFiles;
  files.path = dir_ + "/pod/volumes/s";
  files.files = {{"a/key", "value", 0600}};
  plan.volumes.push_back(files);
  plan.mounts.push_back({files.path, dir_ + "/host/made/here", true});
  VolumeState state;
  state.pod_dir = dir_ + "/pod";
  ASSERT_TRUE(Prepare(plan, state).ok());
  std::ifstream in(files.path + "/a/key");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "value");
  struct stat st {};
  ASSERT_EQ(stat((files.path + "/a/key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600U);
  EXPECT_EQ(state.created, (std::vector<std::string>{dir_ + "/host", dir_ + "/host/made",
                                                     dir_ + "/host/made/here"}));
  const auto left = Cleanup(state, {});
  EXPECT_TRUE(left.empty());
  EXPECT_FALSE(Exists(dir_ + "/host"));
  EXPECT_FALSE(Exists(dir_ + "/pod"));
}

TEST_F(PrepareTest, TheTerminationMessageFileIsMadeEmptyAndItsMountPointIsLeft) {
  VolumePlan plan;
  json container = Container(json::array());
  container["terminationMessagePath"] = dir_ + "/dev/termination-log";
  AddTerminationMessage(plan, container, dir_ + "/pod");
  VolumeState state;
  state.pod_dir = dir_ + "/pod";
  ASSERT_TRUE(Prepare(plan, state).ok());
  EXPECT_TRUE(Exists(dir_ + "/pod/termination-log"));
  EXPECT_EQ(ReadTerminationMessage(plan.termination_message), "");
  EXPECT_TRUE(Exists(dir_ + "/dev/termination-log"));
  {
    std::ofstream out(plan.termination_message);
    out << std::string(5000, 'x');
  }
  EXPECT_EQ(ReadTerminationMessage(plan.termination_message), std::string(4096, 'x'));
  EXPECT_EQ(ReadTerminationMessage(dir_ + "/missing"), "");
  Cleanup(state, {});
  // Other runners' pods may have it mounted: removing it would unmount it there.
  EXPECT_TRUE(Exists(dir_ + "/dev/termination-log"));
  EXPECT_FALSE(Exists(dir_ + "/pod"));
}

TEST_F(PrepareTest, MountPointsAnotherPodUsesAreLeftUntilItEnds) {
  std::vector<std::string> created = {dir_ + "/m", dir_ + "/m/x"};
  ASSERT_EQ(mkdir(created[0].c_str(), 0755), 0);
  ASSERT_EQ(mkdir(created[1].c_str(), 0755), 0);
  auto left = RemoveCreated(created, {dir_ + "/m/x"});
  EXPECT_EQ(left.size(), 2U);
  EXPECT_TRUE(Exists(dir_ + "/m/x"));
  left = RemoveCreated(left, {});
  EXPECT_TRUE(left.empty());
  EXPECT_FALSE(Exists(dir_ + "/m"));
}

// A pod of another runner: a process in a mount namespace of its own with a bind mount on a
// directory this runner made. Removing the directory would unmount it under that process.
TEST_F(PrepareTest, AMountPointAProcessInAnotherNamespaceUsesIsLeftUntilItEnds) {
  const std::string source = dir_ + "/secret";
  const std::string target = dir_ + "/link/m";  // reached through a symbolic link, as /var/run
  ASSERT_EQ(mkdir(source.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((dir_ + "/real").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((dir_ + "/real/m").c_str(), 0755), 0);
  ASSERT_EQ(symlink((dir_ + "/real").c_str(), (dir_ + "/link").c_str()), 0);
  std::ofstream(source + "/token") << "t";
  int ready[2];
  int done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  const pid_t pod = fork();
  ASSERT_GE(pod, 0);
  if (pod == 0) {
    char result = 'y';
    if (unshare(CLONE_NEWNS) != 0) {
      result = 's';  // no right to make a mount namespace here
    } else if (mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0 ||
               mount(source.c_str(), target.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      result = 'n';
    }
    (void)!write(ready[1], &result, 1);
    char c = 0;
    (void)!read(done[0], &c, 1);  // until the test has looked
    _exit(std::ifstream(target + "/token").good() ? 0 : 1);
  }
  char result = 0;
  ASSERT_EQ(read(ready[0], &result, 1), 1);
  if (result == 's') {
    (void)!write(done[1], "x", 1);
    waitpid(pod, nullptr, 0);
    GTEST_SKIP() << "no right to create a mount namespace";
  }
  ASSERT_EQ(result, 'y');
  auto left = RemoveCreated({target}, {});
  EXPECT_EQ(left, std::vector<std::string>{target});
  EXPECT_TRUE(Exists(dir_ + "/real/m"));
  ASSERT_EQ(write(done[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(pod, &status, 0), pod);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the mount went under the pod";
  EXPECT_TRUE(RemoveCreated(left, {}).empty());
  EXPECT_FALSE(Exists(dir_ + "/real/m"));
  for (int fd : {ready[0], ready[1], done[0], done[1]}) close(fd);
}

TEST_F(PrepareTest, ANonEmptyMadeDirectoryStays) {
  ASSERT_EQ(mkdir((dir_ + "/m").c_str(), 0755), 0);
  std::ofstream(dir_ + "/m/someone-elses") << "x";
  EXPECT_TRUE(RemoveCreated({dir_ + "/m"}, {}).empty());
  EXPECT_TRUE(Exists(dir_ + "/m/someone-elses"));
}

TEST_F(PrepareTest, HostPathOfTypeDirectoryMustExist) {
  VolumePlan plan;
  VolumeSource v;
  v.name = "h";
  v.kind = VolumeSource::Kind::kHost;
  v.path = dir_ + "/absent";
  v.host_path_type = "Directory";
  plan.volumes.push_back(v);
  VolumeState state;
  Status s = Prepare(plan, state);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("is not a directory"), std::string::npos) << s.message();
  plan.volumes[0].host_path_type = "DirectoryOrCreate";
  EXPECT_TRUE(Prepare(plan, state).ok());
  EXPECT_TRUE(Exists(dir_ + "/absent"));
}

TEST_F(PrepareTest, StaleStateOfAKilledRunnerIsUndone) {
  const std::string pod = dir_ + "/pods/uid-9";
  ASSERT_EQ(std::system(("mkdir -p '" + pod + "/volumes/x' '" + dir_ + "/made'").c_str()), 0);
  VolumeState state;
  state.pod_dir = pod;
  state.created = {dir_ + "/made"};
  SaveState(state);
  RemoveStaleStates(dir_ + "/pods");
  EXPECT_FALSE(Exists(pod));
  EXPECT_FALSE(Exists(dir_ + "/made"));
}

}  // namespace
}  // namespace vf::podrunner
