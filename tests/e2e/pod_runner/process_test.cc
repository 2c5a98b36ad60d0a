#include "tests/e2e/pod_runner/process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace vf::podrunner {
namespace {

class ProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vf-pod-runner-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  LaunchSpec Shell(const std::string& script) {
    LaunchSpec spec;
    spec.argv = {"sh", "-c", script};
    spec.env = {"PATH=/usr/bin:/bin", "ONLY=this"};
    spec.path = "/usr/bin:/bin";
    spec.working_dir = dir_;
    spec.log_path = dir_ + "/c.log";
    return spec;
  }

  std::string Read(const std::string& name) {
    std::ifstream in(dir_ + "/" + name);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  void WriteScript(const std::string& name, const std::string& text, mode_t mode) {
    std::ofstream(dir_ + "/" + name) << text;
    chmod((dir_ + "/" + name).c_str(), mode);
  }

  static ProcessExit WaitExit(ChildProcess& p,
                              std::chrono::seconds limit = std::chrono::seconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (auto e = p.Poll()) return *e;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "process " << p.pid() << " did not exit";
    return {-1, -1};
  }

  // Running, not a zombie waiting for whoever reaps orphans here.
  static bool Alive(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat;
    if (!std::getline(in, stat)) return false;
    const size_t paren = stat.rfind(')');
    return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
  }

  std::string dir_;
};

TEST_F(ProcessTest, ExitCodeAndOutputInTheLog) {
  auto p = ChildProcess::Start(Shell("echo out; echo err >&2; exit 3"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const ProcessExit e = WaitExit(**p);
  EXPECT_EQ(e.exit_code, 3);
  EXPECT_EQ(e.signal, 0);
  EXPECT_EQ(Read("c.log"), "out\nerr\n");
  EXPECT_TRUE((*p)->exited());
  EXPECT_EQ((*p)->Poll()->exit_code, 3);  // again, without waiting
}

TEST_F(ProcessTest, LogIsAppendedAndOffsetMarksThisRun) {
  auto first = ChildProcess::Start(Shell("echo one"));
  ASSERT_TRUE(first.ok());
  WaitExit(**first);
  auto second = ChildProcess::Start(Shell("echo two; exit 1"));
  ASSERT_TRUE(second.ok());
  WaitExit(**second);
  EXPECT_EQ(Read("c.log"), "one\ntwo\n");
  EXPECT_EQ((*second)->log_offset(), 4);
  EXPECT_EQ(ReadLogTail(dir_ + "/c.log", (*second)->log_offset(), 100), "two\n");
  EXPECT_EQ(ReadLogTail(dir_ + "/c.log", 0, 3), "wo\n");
  EXPECT_EQ(ReadLogTail(dir_ + "/missing.log", 0, 100), "");
}

TEST_F(ProcessTest, EnvironmentIsExactlyTheOneGivenAndWorkingDirIsSet) {
  auto p = ChildProcess::Start(Shell("env | grep -v '^PWD=\\|^SHLVL=\\|^_=' | sort; pwd"));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(WaitExit(**p).exit_code, 0);
  EXPECT_EQ(Read("c.log"), "ONLY=this\nPATH=/usr/bin:/bin\n" + dir_ + "\n");
}

TEST_F(ProcessTest, RunsInItsOwnProcessGroupWithStdinFromDevNull) {
  auto p = ChildProcess::Start(Shell("ps -o pgid= -p $$ | tr -d ' '; read x; echo read=$?"));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(WaitExit(**p).exit_code, 0);
  EXPECT_EQ(Read("c.log"), std::to_string((*p)->pid()) + "\nread=1\n");  // EOF at once
}

TEST_F(ProcessTest, StartsWithNoSignalBlockedOrIgnored) {
  // The test process ignores SIGUSR1 and blocks SIGUSR2; the program must have neither. (The
  // program itself reads its status: a shell blocks signals around its own forks.)
  std::signal(SIGUSR1, SIG_IGN);
  sigset_t block;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &block, nullptr);
  LaunchSpec spec = Shell("");
  spec.argv = {"grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"};
  auto p = ChildProcess::Start(spec);
  pthread_sigmask(SIG_UNBLOCK, &block, nullptr);
  std::signal(SIGUSR1, SIG_DFL);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(WaitExit(**p).exit_code, 0);
  EXPECT_EQ(Read("c.log"), "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
}

TEST_F(ProcessTest, NoDescriptorOfTheParentLeaks) {
  const int fd = open("/dev/null", O_RDONLY);  // not O_CLOEXEC
  ASSERT_GE(fd, 3);
  auto p = ChildProcess::Start(Shell("ls /proc/self/fd | sort -n | tr '\\n' ' '"));
  close(fd);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(WaitExit(**p).exit_code, 0);
  // ls's own directory handle is 3.
  EXPECT_EQ(Read("c.log"), "0 1 2 3 ");
}

TEST_F(ProcessTest, SignalReachesTheWholeGroupAndIsReported) {
  auto p = ChildProcess::Start(Shell("sleep 30 & echo $! > child.pid; wait"));
  ASSERT_TRUE(p.ok());
  while (Read("child.pid").empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const pid_t grandchild = std::stoi(Read("child.pid"));
  EXPECT_FALSE((*p)->Poll().has_value());
  ASSERT_TRUE((*p)->Signal(SIGTERM).ok());
  const ProcessExit e = WaitExit(**p);
  EXPECT_EQ(e.signal, SIGTERM);
  EXPECT_EQ(e.exit_code, 0);
  // Reaped by its new parent (init or a subreaper) shortly after dying.
  for (int i = 0; i < 500 && Alive(grandchild); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(Alive(grandchild));
  EXPECT_TRUE((*p)->Signal(SIGKILL).ok());  // after the exit: a no-op
}

TEST_F(ProcessTest, LeftoversOfTheGroupAreKilledWhenTheMainProcessExits) {
  auto p = ChildProcess::Start(Shell("trap '' TERM; sleep 30 & echo $! > child.pid; exit 0"));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(WaitExit(**p).exit_code, 0);
  const pid_t grandchild = std::stoi(Read("child.pid"));
  for (int i = 0; i < 500 && Alive(grandchild); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(Alive(grandchild));
}

TEST_F(ProcessTest, DestructorKillsARunningProcess) {
  pid_t pid = 0;
  {
    auto p = ChildProcess::Start(Shell("exec sleep 30"));
    ASSERT_TRUE(p.ok());
    pid = (*p)->pid();
    EXPECT_TRUE(Alive(pid));
  }
  EXPECT_FALSE(Alive(pid));  // killed and reaped
}

TEST_F(ProcessTest, MissingCommandCannotRun) {
  LaunchSpec spec = Shell("");
  spec.argv = {"vf-no-such-command", "x"};
  auto p = ChildProcess::Start(spec);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kNotFound);
  EXPECT_NE(p.status().message().find("exec: \"vf-no-such-command\": executable file not found"),
            std::string::npos)
      << p.status().message();
}

TEST_F(ProcessTest, FileThatIsNotExecutableCannotRun) {
  WriteScript("script", "#!/bin/sh\nexit 0\n", 0644);
  LaunchSpec spec = Shell("");
  spec.argv = {"./script"};
  auto p = ChildProcess::Start(spec);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("\"./script\""), std::string::npos);
  EXPECT_NE(p.status().message().find("ermission denied"), std::string::npos)
      << p.status().message();
}

TEST_F(ProcessTest, ExecFailureAfterForkIsReported) {
  WriteScript("bad-interpreter", "#!/nonexistent/interpreter\n", 0755);
  LaunchSpec spec = Shell("");
  spec.argv = {"bad-interpreter"};
  spec.path = dir_;
  auto p = ChildProcess::Start(spec);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("exec " + dir_ + "/bad-interpreter"), std::string::npos)
      << p.status().message();
}

TEST_F(ProcessTest, MissingWorkingDirectoryCannotRun) {
  LaunchSpec spec = Shell("true");
  spec.working_dir = dir_ + "/nope";
  auto p = ChildProcess::Start(spec);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("working directory"), std::string::npos);
}

TEST_F(ProcessTest, FindExecutableSearchesThePathInOrder) {
  ASSERT_EQ(mkdir((dir_ + "/a").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((dir_ + "/b").c_str(), 0755), 0);
  WriteScript("a/tool", "#!/bin/sh\n", 0644);  // not executable: skipped
  WriteScript("b/tool", "#!/bin/sh\n", 0755);
  auto found = FindExecutable("tool", dir_ + "/a:" + dir_ + "/b", "/");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(*found, dir_ + "/b/tool");
  auto denied = FindExecutable("tool", dir_ + "/a", "/");
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), StatusCode::kFailedPrecondition);
  auto relative = FindExecutable("b/tool", "", dir_);
  ASSERT_TRUE(relative.ok());
  EXPECT_EQ(*relative, dir_ + "/b/tool");
  auto empty_entry = FindExecutable("tool", ":/nonexistent", dir_ + "/b");
  ASSERT_TRUE(empty_entry.ok());
  EXPECT_EQ(*empty_entry, dir_ + "/b/tool");
  EXPECT_FALSE(FindExecutable("", "/bin", "/").ok());
  EXPECT_FALSE(FindExecutable("b", "", dir_).ok());  // a directory
}

TEST_F(ProcessTest, BindMountsAreSeenByTheProcessOnly) {
  if (geteuid() != 0) GTEST_SKIP() << "mount namespaces need root";
  ASSERT_EQ(mkdir((dir_ + "/src").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((dir_ + "/ro").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((dir_ + "/target").c_str(), 0755), 0);
  std::ofstream(dir_ + "/src/file") << "from src";
  LaunchSpec spec = Shell(
      "test \"$(cat target/file)\" = 'from src' && echo written > target/new && "
      "! touch ro/x 2>/dev/null");
  spec.mount_namespace = true;
  spec.mounts = {{dir_ + "/src", dir_ + "/target", false}, {dir_ + "/src", dir_ + "/ro", true}};
  auto p = ChildProcess::Start(spec);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(WaitExit(**p).exit_code, 0) << Read("c.log");
  EXPECT_EQ(Read("src/new"), "written\n");
  EXPECT_EQ(Read("target/file"), "") << "the mount must not leak to the host";
}

TEST_F(ProcessTest, AFailedMountIsReportedWithItsPaths) {
  if (geteuid() != 0) GTEST_SKIP() << "mount namespaces need root";
  LaunchSpec spec = Shell("true");
  spec.mount_namespace = true;
  spec.mounts = {{dir_ + "/absent", dir_, false}};
  auto p = ChildProcess::Start(spec);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("bind mount of " + dir_ + "/absent at " + dir_),
            std::string::npos)
      << p.status().message();
}

}  // namespace
}  // namespace vf::podrunner
