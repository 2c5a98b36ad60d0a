// The worker's environment table (worker_env.h): well formed, and the user guide's list of the
// variables is the table's, row for row.
#include "runtime/job/worker_env.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace vf::worker_env {
namespace {

TEST(WorkerEnv, NamesAreUniqueVfWordsWithAMeaning) {
  std::set<std::string> names;
  for (const Variable& v : kAll) {
    const std::string name = v.name;
    EXPECT_TRUE(names.insert(name).second) << name << " twice";
    EXPECT_EQ(name.rfind("VF_", 0), 0u) << name;
    EXPECT_EQ(name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"), std::string::npos)
        << name;
    EXPECT_FALSE(std::string(v.meaning).empty()) << name;
  }
  EXPECT_GE(names.size(), 25u);
}

TEST(WorkerEnv, FindsByNameAndTellsFactsFromSettings) {
  // Checked at run time: GCC's UBSan makes the pointer comparisons non-constant, so the
  // sanitizer build could not compile these as static_asserts.
  EXPECT_EQ(Find("VF_JOB_SPEC"), &kAll[0]);
  EXPECT_TRUE(IsFact("VF_WORKER") && IsFact("VF_TERMINATION_MESSAGE_PATH"));
  EXPECT_TRUE(!IsFact("VF_THREADS") && !IsFact("VF_NOT_A_VARIABLE"));
  EXPECT_EQ(Find("VF_NOT_A_VARIABLE"), nullptr);
  const Variable* pod_ip = Find("VF_POD_IP");
  ASSERT_NE(pod_ip, nullptr);
  EXPECT_STREQ(pod_ip->meaning, kPodIp.meaning);
}

const char* SetBy(Kind kind) {
  switch (kind) {
    case Kind::kFact:
      return "the operator and `vf run`";
    case Kind::kRunFlag:
      return "`vf run`, from its flags";
    case Kind::kSetting:
      break;
  }
  return "you: the template's `env`, or `vf run`'s environment";
}

// The table as docs/user-guide.md shows it.
std::string MarkdownTable() {
  std::string out = "| variable | set by | meaning |\n|---|---|---|\n";
  for (const Variable& v : kAll) {
    out += std::string("| `") + v.name + "` | " + SetBy(v.kind) + " | " + v.meaning + " |\n";
  }
  return out;
}

std::string SourceFile(const std::string& relative) {
  std::ifstream in(std::string(VF_SOURCE_DIR) + "/" + relative);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(WorkerEnv, TheUserGuideListsExactlyTheTable) {
  EXPECT_NE(SourceFile("docs/user-guide.md").find(MarkdownTable()), std::string::npos)
      << "docs/user-guide.md (The worker's environment) should hold this table:\n"
      << MarkdownTable();
}

// The CRD reference's list of what the operator sets in a worker pod's environment names only
// facts of the table.
TEST(WorkerEnv, TheCrdReferenceNamesOnlyFactsAsThePodsEnvironment) {
  const std::string text = SourceFile("docs/crd-reference.md");
  const size_t row = text.find("\n| environment |");
  ASSERT_NE(row, std::string::npos);
  const std::string line = text.substr(row + 1, text.find('\n', row + 1) - row - 1);
  int named = 0;
  for (size_t at = line.find("`VF_"); at != std::string::npos; at = line.find("`VF_", at + 1)) {
    const std::string name = line.substr(at + 1, line.find('`', at + 1) - at - 1);
    EXPECT_TRUE(IsFact(name)) << name << " in docs/crd-reference.md";
    ++named;
  }
  EXPECT_GE(named, 5);
}

}  // namespace
}  // namespace vf::worker_env
