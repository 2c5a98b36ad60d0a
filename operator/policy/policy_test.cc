#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "operator/policy/policy.h"

namespace vf::policy {
namespace {

// ---- A policy added outside operator/policy ------------------------------------------------

// A policy defined here, as a new policy's own file would define it: a job starts on its
// minimum of workers, or waits, and keeps what it holds (the static policy's decision with each
// request lowered to that). It registers itself below; no other file names it, yet it is created
// by name, accepted by validation, listed in help and held to the contract of every policy
// (EveryPolicy). Immutable; safe to share between threads.
class MinimumPolicy final : public Policy {
 public:
  explicit MinimumPolicy(const PolicyOptions& options) : options_(options) {}

  const std::string& name() const override {
    static const std::string kName = "minimum";
    return kName;
  }

  Result<Decision> Decide(const std::vector<PolicyJob>& jobs, const GpuInventory& inventory,
                          double now) const override {
    std::vector<PolicyJob> view = jobs;
    for (PolicyJob& j : view) {
      const int held = TotalWorkers(j.current) + j.unbound_workers;
      j.requested_workers =
          held > 0 ? std::clamp(held, j.min_workers, j.max_workers) : j.min_workers;
      j.policy.clear();  // decided here, whatever the job names
    }
    VF_ASSIGN_OR_RETURN(std::unique_ptr<Policy> fixed, CreatePolicy("static", options_));
    return fixed->Decide(view, inventory, now);
  }

 private:
  const PolicyOptions options_;
};

const Status kMinimumRegistered = RegisterPolicy(
    {"minimum", "every job on its minimum of workers, or it waits; never resized", Sharing::kFixed,
     [](const PolicyOptions& o) { return std::make_unique<MinimumPolicy>(o); }});

// The policies the product ships: every registered one but this file's own.
std::vector<std::string> ShippedPolicyNames() {
  std::vector<std::string> names = KnownPolicyNames();
  names.erase(std::remove(names.begin(), names.end(), "minimum"), names.end());
  return names;
}

PolicyJob Job(const std::string& id, int priority, int min, int max, double arrival = 0.0) {
  PolicyJob j;
  j.id = id;
  j.priority = priority;
  j.min_workers = min;
  j.max_workers = max;
  j.requested_workers = max;
  j.virtual_nodes = std::max(8, max);
  j.arrival_time = arrival;
  return j;
}

GpuInventory Gpus(std::map<std::string, int> gpus) { return GpuInventory{std::move(gpus)}; }

std::unique_ptr<Policy> Make(const std::string& name, const PolicyOptions& options = {}) {
  auto p = CreatePolicy(name, options);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return std::move(p).value();
}

Decision Decide(const Policy& p, const std::vector<PolicyJob>& jobs, const GpuInventory& inv,
                double now = 1000.0) {
  auto d = p.Decide(jobs, inv, now);
  EXPECT_TRUE(d.ok()) << d.status().message();
  return d.ok() ? *d : Decision{};
}

int Workers(const Decision& d, const std::string& id) {
  const JobDecision* j = d.Find(id);
  return j ? TotalWorkers(j->workers) : -1;
}

std::string Reason(const Decision& d, const std::string& id) {
  const JobDecision* j = d.Find(id);
  return j ? j->reason : "<missing>";
}

// ---- Creation ------------------------------------------------------------------------------

TEST(CreatePolicy, KnowsEveryListedName) {
  for (const auto& name : KnownPolicyNames()) {
    auto p = CreatePolicy(name, {});
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_EQ((*p)->name(), name);
  }
}

TEST(CreatePolicy, UnknownNameListsTheKnownOnes) {
  auto p = CreatePolicy("fastest", {});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("'fastest'"), std::string::npos) << p.status().message();
  for (const std::string& known : KnownPolicyNames()) {
    EXPECT_NE(p.status().message().find(known), std::string::npos) << p.status().message();
  }
}

// ---- The registry --------------------------------------------------------------------------

TEST(PolicyRegistry, ThePoliciesShippedAreStaticElasticAutoscaleInThatOrder) {
  EXPECT_EQ(ShippedPolicyNames(), (std::vector<std::string>{"static", "elastic", "autoscale"}));
}

TEST(PolicyRegistry, APolicyThatRegistersItselfIsCreatedByName) {
  ASSERT_TRUE(kMinimumRegistered.ok()) << kMinimumRegistered.message();
  EXPECT_EQ(KnownPolicyNames().back(), "minimum");  // after the built-ins
  PolicyJob j = Job("j", 1, 1, 4);
  j.requested_workers = 2;
  const Decision own = Decide(*Make("minimum"), {j}, Gpus({{"V100", 8}}));
  EXPECT_EQ(Workers(own, "j"), 1);  // its own decision: the minimum
  EXPECT_EQ(Workers(Decide(*Make("static"), {j}, Gpus({{"V100", 8}})), "j"), 2);
  // A job that names it is sized by it under any default, beside jobs of other policies.
  j.policy = "minimum";
  for (const std::string& fallback : ShippedPolicyNames()) {
    EXPECT_EQ(Workers(Decide(*Make(fallback), {j}, Gpus({{"V100", 8}})), "j"), 1) << fallback;
  }
  PolicyJob shared = Job("shared", 1, 1, 8);
  shared.policy = "elastic";
  PolicyJob fixed = Job("fixed", 1, 2, 2, 1.0);
  fixed.policy = "minimum";
  const Decision mixed = Decide(*Make("autoscale"), {shared, fixed}, Gpus({{"V100", 8}}));
  EXPECT_EQ(Workers(mixed, "fixed"), 2);
  EXPECT_EQ(Workers(mixed, "shared"), 6);
}

TEST(PolicyRegistry, APolicyThatRegistersItselfIsValid) {
  EXPECT_TRUE(CheckPolicyName("--policy", "minimum").ok());
  EXPECT_TRUE(IsKnownPolicy("minimum"));
  EXPECT_EQ(SharingOf("minimum"), Sharing::kFixed);
  EXPECT_EQ(SharingOf("static"), Sharing::kFixed);
  EXPECT_EQ(SharingOf("elastic"), Sharing::kByWeight);
  EXPECT_EQ(SharingOf("fastest"), std::nullopt);
  const Status unknown = CheckPolicyName("spec.elasticity.policy", "fastest");
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.message(),
            "spec.elasticity.policy: unknown policy 'fastest' (known: static, elastic, autoscale, "
            "minimum)");
  // A job naming it is not "invalid: unknown policy", as one naming a policy nobody added is.
  PolicyJob j = Job("j", 1, 1, 2);
  j.policy = "minimum";
  PolicyJob odd = Job("odd", 1, 1, 2);
  odd.policy = "fastest";
  const Decision d = Decide(*Make("elastic"), {j, odd}, Gpus({{"V100", 4}}));
  EXPECT_GT(Workers(d, "j"), 0) << Reason(d, "j");
  EXPECT_NE(Reason(d, "odd").find("invalid: unknown policy 'fastest'"), std::string::npos);
}

TEST(PolicyRegistry, APolicyThatRegistersItselfIsInTheHelp) {
  const std::string help = PolicyHelp("  ");
  EXPECT_NE(help.find("\n  minimum    every job on its minimum of workers, or it waits; never "
                      "resized"),
            std::string::npos)
      << help;
  for (const PolicyInfo& p : RegisteredPolicies()) {
    EXPECT_NE(help.find("  " + p.name + " "), std::string::npos) << p.name << "\n" << help;
    EXPECT_NE(help.find(p.description), std::string::npos) << p.name << "\n" << help;
  }
  EXPECT_EQ(std::count(help.begin(), help.end(), '\n') + 1,
            static_cast<long>(RegisteredPolicies().size()));
}

TEST(PolicyRegistry, RefusesATakenNameAndNamesNoManifestCanCarry) {
  auto factory = [](const PolicyOptions& o) { return std::make_unique<MinimumPolicy>(o); };
  EXPECT_EQ(RegisterPolicy({"elastic", "again", Sharing::kByWeight, factory}).code(),
            StatusCode::kFailedPrecondition);
  for (const char* bad : {"", "Elastic", "two words", "-lead", "trail-", "under_score"}) {
    EXPECT_EQ(RegisterPolicy({bad, "bad", Sharing::kByWeight, factory}).code(),
              StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_EQ(RegisterPolicy({"no-factory", "none", Sharing::kByWeight, nullptr}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(RegisterPolicy({"no-help", "", Sharing::kByWeight, factory}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(IsKnownPolicy("no-factory"));
  EXPECT_FALSE(IsKnownPolicy("Elastic"));
  EXPECT_EQ(KnownPolicyNames().size(), ShippedPolicyNames().size() + 1);
}

std::string SourceFile(const std::string& relative) {
  std::ifstream in(std::string(VF_SOURCE_DIR) + "/" + relative);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> Strings(const YAML::Node& list) {
  std::vector<std::string> out;
  for (const auto& item : list) out.push_back(item.as<std::string>());
  return out;
}

// The API server's enum of spec.elasticity.policy, in the CRD and its copy in the chart, and the
// chart's schema of its `policy` value (JSON, which YAML reads): the registry's names.
TEST(PolicyRegistry, TheCrdAndTheChartEnumerateTheShippedPolicies) {
  for (const char* file :
       {"crds/virtualflowjob.yaml", "charts/virtualflow/files/virtualflowjob.yaml"}) {
    const YAML::Node crd = YAML::Load(SourceFile(file));
    const YAML::Node spec =
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    EXPECT_EQ(Strings(spec["properties"]["elasticity"]["properties"]["policy"]["enum"]),
              ShippedPolicyNames())
        << file;
  }
  const YAML::Node values = YAML::Load(SourceFile("charts/virtualflow/values.schema.json"));
  EXPECT_EQ(Strings(values["properties"]["policy"]["enum"]), ShippedPolicyNames());
}

// The words in backquotes of `column` (0: the first) of the first table row that starts with
// `start`.
std::vector<std::string> QuotedInRow(const std::string& doc, const std::string& start,
                                     size_t column) {
  const std::string text = SourceFile(doc);
  const size_t at = text.find("\n" + start);
  if (at == std::string::npos) return {"<no row " + start + ">"};
  const std::string row = text.substr(at + 1, text.find('\n', at + 1) - at - 1);
  std::vector<std::string> cells;
  for (size_t from = 1, bar = 0; (bar = row.find('|', from)) != std::string::npos; from = bar + 1) {
    cells.push_back(row.substr(from, bar - from));
  }
  if (column >= cells.size()) return {"<no column " + std::to_string(column) + ">"};
  std::vector<std::string> words;
  const std::string& cell = cells[column];
  for (size_t open = cell.find('`'); open != std::string::npos; open = cell.find('`', open + 1)) {
    const size_t close = cell.find('`', open + 1);
    if (close == std::string::npos) break;
    words.push_back(cell.substr(open + 1, close - open - 1));
    open = close;
  }
  return words;
}

TEST(PolicyRegistry, TheDocsListTheShippedPolicies) {
  EXPECT_EQ(QuotedInRow("docs/crd-reference.md", "| `spec.elasticity.policy` |", 3),
            ShippedPolicyNames());
  EXPECT_EQ(QuotedInRow("docs/user-guide.md", "| `elasticity.policy` |", 1), ShippedPolicyNames());
  // The chart's `policy` value: its description begins with the names.
  std::vector<std::string> chart = QuotedInRow("docs/operations.md", "| `policy` |", 2);
  chart.resize(std::min(chart.size(), ShippedPolicyNames().size()));
  EXPECT_EQ(chart, ShippedPolicyNames());
}

TEST(CreatePolicy, RejectsNegativeCooldown) {
  PolicyOptions o;
  o.cooldown_seconds = -1.0;
  EXPECT_FALSE(CreatePolicy("elastic", o).ok());
}

// ---- Shared input checks -------------------------------------------------------------------

class EveryPolicy : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryPolicy, DuplicateIdsAreInvalidArgument) {
  auto p = Make(GetParam());
  auto d = p->Decide({Job("a", 1, 1, 2), Job("a", 1, 1, 2)}, Gpus({{"V100", 4}}), 0.0);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
}

TEST_P(EveryPolicy, NegativeInventoryIsInvalidArgument) {
  auto p = Make(GetParam());
  EXPECT_FALSE(p->Decide({Job("a", 1, 1, 2)}, Gpus({{"V100", -1}}), 0.0).ok());
}

TEST_P(EveryPolicy, InconsistentSpecWaitsWithReason) {
  auto p = Make(GetParam());
  PolicyJob bad = Job("bad", 1, 3, 2);
  const Decision d = Decide(*p, {bad, Job("good", 1, 1, 2)}, Gpus({{"V100", 4}}));
  EXPECT_EQ(Workers(d, "bad"), 0);
  EXPECT_NE(Reason(d, "bad").find("invalid: min_workers 3 > max_workers 2"), std::string::npos);
  EXPECT_GT(Workers(d, "good"), 0);
}

TEST_P(EveryPolicy, MaxAboveVirtualNodesIsInvalid) {
  auto p = Make(GetParam());
  PolicyJob j = Job("j", 1, 1, 4);
  j.virtual_nodes = 2;
  const Decision d = Decide(*p, {j}, Gpus({{"V100", 4}}));
  EXPECT_EQ(Workers(d, "j"), 0);
  EXPECT_NE(Reason(d, "j").find("invalid"), std::string::npos);
}

TEST_P(EveryPolicy, JobThatCannotGetItsMinimumWaits) {
  auto p = Make(GetParam());
  const Decision d = Decide(*p, {Job("big", 1, 6, 6)}, Gpus({{"V100", 4}}));
  EXPECT_EQ(Workers(d, "big"), 0);
  EXPECT_FALSE(d.Find("big")->changed);
  EXPECT_NE(Reason(d, "big").find("waiting: needs 6 GPUs"), std::string::npos) << Reason(d, "big");
  EXPECT_NE(Reason(d, "big").find("4 free"), std::string::npos) << Reason(d, "big");
}

TEST_P(EveryPolicy, GpusPerWorkerCountInTheInventory) {
  auto p = Make(GetParam());
  PolicyJob j = Job("j", 1, 1, 4);
  j.gpus_per_worker = 2;
  j.requested_workers = 2;
  const Decision d = Decide(*p, {j}, Gpus({{"V100", 5}}));
  const int w = Workers(d, "j");
  EXPECT_GE(w, 1);
  EXPECT_LE(w * 2, 5);
}

// A job's pods are bound to nodes one by one. One that holds 3 and waits for the scheduler to
// place the 4th is a job of 4, in cooldown or not: deciding 3 would have its newest pod deleted.
TEST_P(EveryPolicy, KeepsWorkersTheSchedulerHasNotPlacedYet) {
  auto p = Make(GetParam());
  PolicyJob j = Job("j", 1, 1, 4);
  j.current = {{"V100", 3}};
  j.unbound_workers = 1;
  j.last_resize_time = 995.0;  // started 5 s ago: in cooldown
  const Decision d = Decide(*p, {j}, Gpus({{"V100", 4}}), 1000.0);
  EXPECT_EQ(Workers(d, "j"), 4);
  EXPECT_EQ(Reason(d, "j").find("grew"), std::string::npos) << Reason(d, "j");
  // Where no GPU is free for it, the scheduler cannot place it either.
  EXPECT_EQ(Workers(Decide(*p, {j}, Gpus({{"V100", 3}}), 1000.0), "j"), 3);
}

TEST_P(EveryPolicy, UnplacedWorkersNeverDisplaceHeldOnes) {
  auto p = Make(GetParam());
  PolicyJob a = Job("a", 1, 1, 4, 1.0);  // ahead of b in service order
  a.current = {{"V100", 2}};
  a.unbound_workers = 2;
  a.last_resize_time = 995.0;
  PolicyJob b = Job("b", 1, 1, 2, 2.0);
  b.current = {{"V100", 2}};
  b.last_resize_time = 995.0;
  const Decision d = Decide(*p, {a, b}, Gpus({{"V100", 4}}), 1000.0);
  EXPECT_EQ(Workers(d, "a"), 2);
  EXPECT_EQ(Workers(d, "b"), 2);
}

TEST_P(EveryPolicy, NegativeUnboundWorkersAreInvalid) {
  auto p = Make(GetParam());
  PolicyJob j = Job("j", 1, 1, 2);
  j.unbound_workers = -1;
  const Decision d = Decide(*p, {j}, Gpus({{"V100", 4}}));
  EXPECT_EQ(Workers(d, "j"), 0);
  EXPECT_NE(Reason(d, "j").find("invalid: unbound_workers -1 < 0"), std::string::npos)
      << Reason(d, "j");
}

TEST_P(EveryPolicy, HigherPriorityWaitingJobStartsFirst) {
  auto p = Make(GetParam());
  // Room for one of them only.
  const Decision d =
      Decide(*p, {Job("low", 1, 3, 3, 0.0), Job("high", 10, 3, 3, 5.0)}, Gpus({{"V100", 4}}));
  EXPECT_EQ(Workers(d, "high"), 3);
  EXPECT_EQ(Workers(d, "low"), 0);
  EXPECT_NE(Reason(d, "low").find("waiting"), std::string::npos);
}

TEST_P(EveryPolicy, EarlierArrivalBreaksPriorityTies) {
  auto p = Make(GetParam());
  const Decision d =
      Decide(*p, {Job("late", 5, 3, 3, 9.0), Job("early", 5, 3, 3, 1.0)}, Gpus({{"V100", 4}}));
  EXPECT_EQ(Workers(d, "early"), 3);
  EXPECT_EQ(Workers(d, "late"), 0);
}

TEST_P(EveryPolicy, StrictOrderBlocksSmallerJobsBehindAWaitingOne) {
  auto p = Make(GetParam());
  PolicyJob running = Job("running", 10, 2, 2);
  running.current = {{"V100", 2}};
  const Decision d = Decide(*p, {running, Job("big", 5, 4, 4, 1.0), Job("small", 1, 1, 1, 2.0)},
                            Gpus({{"V100", 4}}));
  EXPECT_EQ(Workers(d, "big"), 0);
  EXPECT_EQ(Workers(d, "small"), 0);
  EXPECT_NE(Reason(d, "small").find("behind higher-priority job big"), std::string::npos)
      << Reason(d, "small");
}

TEST_P(EveryPolicy, BackfillLetsASmallerJobStart) {
  PolicyOptions o;
  o.backfill = true;
  auto p = Make(GetParam(), o);
  PolicyJob running = Job("running", 10, 2, 2);
  running.current = {{"V100", 2}};
  const Decision d = Decide(*p, {running, Job("big", 5, 4, 4, 1.0), Job("small", 1, 1, 1, 2.0)},
                            Gpus({{"V100", 4}}));
  EXPECT_EQ(Workers(d, "big"), 0);
  EXPECT_EQ(Workers(d, "small"), 1);
}

TEST_P(EveryPolicy, SameInputSameDecisionWhateverTheInputOrder) {
  auto p = Make(GetParam());
  std::vector<PolicyJob> jobs = {Job("a", 1, 1, 4, 0.0), Job("b", 5, 2, 6, 1.0),
                                 Job("c", 10, 1, 3, 2.0), Job("d", 5, 1, 8, 3.0)};
  jobs[0].current = {{"V100", 2}};
  const GpuInventory inv = Gpus({{"V100", 6}, {"P100", 3}});
  const Decision first = Decide(*p, jobs, inv);
  const Decision again = Decide(*p, jobs, inv);
  std::reverse(jobs.begin(), jobs.end());
  const Decision reversed = Decide(*p, jobs, inv);
  for (const char* id : {"a", "b", "c", "d"}) {
    EXPECT_EQ(first.Find(id)->workers, again.Find(id)->workers) << id;
    EXPECT_EQ(first.Find(id)->workers, reversed.Find(id)->workers) << id;
    EXPECT_EQ(first.Find(id)->reason, reversed.Find(id)->reason) << id;
  }
}

TEST_P(EveryPolicy, DecisionsComeInInputOrder) {
  auto p = Make(GetParam());
  const Decision d = Decide(*p, {Job("z", 1, 1, 1), Job("a", 1, 1, 1)}, Gpus({{"V100", 2}}));
  ASSERT_EQ(d.jobs.size(), 2u);
  EXPECT_EQ(d.jobs[0].id, "z");
  EXPECT_EQ(d.jobs[1].id, "a");
}

// Invariants over many random decision sequences: each decision is fed back as the jobs'
// current allocation, jobs arrive and finish, and the clock moves.
TEST_P(EveryPolicy, InvariantsHoldOverRandomSequences) {
  auto p = Make(GetParam());
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 150; ++trial) {
    GpuInventory inv =
        Gpus({{"V100", static_cast<int>(rng() % 9)}, {"P100", static_cast<int>(rng() % 9)}});
    std::vector<PolicyJob> jobs;
    double now = 0.0;
    int next_id = 0;
    for (int step = 0; step < 25; ++step) {
      now += static_cast<double>(rng() % 60);
      if (rng() % 3 == 0 || jobs.empty()) {
        const int priorities[] = {1, 5, 10};
        const int min = 1 + static_cast<int>(rng() % 3);
        const int max = min + static_cast<int>(rng() % 5);
        PolicyJob j = Job("job" + std::to_string(next_id++), priorities[rng() % 3], min, max, now);
        j.gpus_per_worker = 1 + static_cast<int>(rng() % 2);
        j.requested_workers = min + static_cast<int>(rng() % (max - min + 1));
        j.resize_pause_seconds = static_cast<double>(rng() % 5);
        jobs.push_back(j);
      }
      if (rng() % 4 == 0) jobs.erase(jobs.begin() + static_cast<long>(rng() % jobs.size()));
      auto result = p->Decide(jobs, inv, now);
      ASSERT_TRUE(result.ok()) << result.status().message();
      const Decision& d = *result;
      ASSERT_EQ(d.jobs.size(), jobs.size());
      std::map<std::string, int> used;
      for (size_t i = 0; i < jobs.size(); ++i) {
        const PolicyJob& j = jobs[i];
        const JobDecision& out = d.jobs[i];
        ASSERT_EQ(out.id, j.id);
        const int w = TotalWorkers(out.workers);
        for (const auto& [type, n] : out.workers) {
          EXPECT_GT(n, 0);
          used[type] += n * j.gpus_per_worker;
        }
        if (w > 0) {
          EXPECT_GE(w, j.min_workers) << GetParam() << " " << j.id;
          EXPECT_LE(w, j.max_workers) << GetParam() << " " << j.id;
        } else {
          EXPECT_FALSE(out.reason.empty()) << j.id << " waits without a reason";
        }
        // Once running, a job keeps running while the inventory does not shrink.
        if (TotalWorkers(j.current) > 0) {
          EXPECT_GT(w, 0) << GetParam() << " " << j.id;
        }
        EXPECT_EQ(out.changed, out.workers != j.current);
        if (GetParam() == "static" && TotalWorkers(j.current) > 0) {
          EXPECT_EQ(out.workers, j.current) << "static resized " << j.id;
        }
      }
      for (const auto& [type, n] : used) {
        EXPECT_LE(n, inv.gpus[type]) << GetParam() << " oversubscribed " << type;
      }
      // Priority order: nothing starts while a job ahead of it in service order waits.
      for (size_t i = 0; i < jobs.size(); ++i) {
        if (TotalWorkers(jobs[i].current) > 0 || TotalWorkers(d.jobs[i].workers) == 0) continue;
        for (size_t k = 0; k < jobs.size(); ++k) {
          const bool ahead =
              jobs[k].priority > jobs[i].priority ||
              (jobs[k].priority == jobs[i].priority && jobs[k].arrival_time < jobs[i].arrival_time);
          if (ahead && TotalWorkers(jobs[k].current) == 0) {
            EXPECT_GT(TotalWorkers(d.jobs[k].workers), 0)
                << GetParam() << ": " << jobs[i].id << " started while " << jobs[k].id
                << " (ahead of it) waits";
          }
        }
      }
      // Feed the decision back, as the operator would after carrying it out.
      for (size_t i = 0; i < jobs.size(); ++i) {
        if (d.jobs[i].changed) jobs[i].last_resize_time = now;
        jobs[i].current = d.jobs[i].workers;
      }
    }
  }
}

// Every registered policy, the test's own included (the generator runs after static
// initialisation, so after every policy has registered itself).
INSTANTIATE_TEST_SUITE_P(Policies, EveryPolicy, ::testing::ValuesIn(KnownPolicyNames()),
                         [](const auto& param_info) {
                           std::string name = param_info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// ---- static --------------------------------------------------------------------------------

TEST(StaticPolicy, GivesExactlyTheRequestedWorkers) {
  auto p = Make("static");
  PolicyJob j = Job("j", 1, 1, 8);
  j.requested_workers = 3;
  const Decision d = Decide(*p, {j}, Gpus({{"V100", 8}}));
  EXPECT_EQ(Workers(d, "j"), 3);
  EXPECT_TRUE(d.Find("j")->changed);
}

TEST(StaticPolicy, NeverGrowsIntoIdleGpus) {
  auto p = Make("static");
  PolicyJob j = Job("j", 1, 1, 8);
  j.requested_workers = 2;
  j.current = {{"V100", 2}};
  const Decision d = Decide(*p, {j}, Gpus({{"V100", 8}}));
  EXPECT_EQ(Workers(d, "j"), 2);
  EXPECT_FALSE(d.Find("j")->changed);
}

TEST(StaticPolicy, NeverShrinksForAHigherPriorityJob) {
  auto p = Make("static");
  PolicyJob low = Job("low", 1, 1, 8);
  low.current = {{"V100", 8}};
  const Decision d = Decide(*p, {low, Job("high", 10, 1, 2, 5.0)}, Gpus({{"V100", 8}}));
  EXPECT_EQ(Workers(d, "low"), 8);
  EXPECT_EQ(Workers(d, "high"), 0);
}

// ---- elastic -------------------------------------------------------------------------------

TEST(ElasticPolicy, LendsIdleGpusToARunningJob) {
  auto p = Make("elastic");
  PolicyJob j = Job("j", 1, 1, 8);
  j.requested_workers = 2;
  j.current = {{"V100", 2}};
  const Decision d = Decide(*p, {j}, Gpus({{"V100", 8}}));
  EXPECT_EQ(Workers(d, "j"), 8);
  EXPECT_NE(Reason(d, "j").find("grew: 2 -> 8 workers (idle GPUs lent)"), std::string::npos)
      << Reason(d, "j");
}

TEST(ElasticPolicy, TakesLentGpusBackWhenANewJobArrivesEvenInCooldown) {
  auto p = Make("elastic");
  PolicyJob lender = Job("lender", 1, 1, 8);
  lender.current = {{"V100", 8}};
  lender.last_resize_time = 995.0;  // 5 s ago: in cooldown
  const Decision d = Decide(*p, {lender, Job("b", 10, 2, 4, 990.0)}, Gpus({{"V100", 8}}), 1000);
  EXPECT_GE(Workers(d, "b"), 2);
  EXPECT_EQ(Workers(d, "lender") + Workers(d, "b"), 8);
  EXPECT_NE(Reason(d, "lender").find("GPUs returned to job b (priority 10)"), std::string::npos)
      << Reason(d, "lender");
}

TEST(ElasticPolicy, SharesInProportionToPriority) {
  auto p = Make("elastic");
  PolicyJob a = Job("a", 1, 1, 8);
  PolicyJob b = Job("b", 3, 1, 8);
  a.current = {{"V100", 4}};
  b.current = {{"V100", 4}};
  const Decision d = Decide(*p, {a, b}, Gpus({{"V100", 8}}));
  EXPECT_EQ(Workers(d, "a"), 2);
  EXPECT_EQ(Workers(d, "b"), 6);
}

TEST(ElasticPolicy, HigherPriorityNeverGetsLessThanAnEqualLowerPriorityJob) {
  auto p = Make("elastic");
  for (int gpus = 2; gpus <= 12; ++gpus) {
    const Decision d =
        Decide(*p, {Job("low", 1, 1, 8), Job("high", 5, 1, 8, 1.0)}, Gpus({{"V100", gpus}}));
    EXPECT_GE(Workers(d, "high"), Workers(d, "low")) << gpus << " GPUs";
  }
}

TEST(ElasticPolicy, CapsAtMaxAndLendsTheRestToOthers) {
  auto p = Make("elastic");
  const Decision d =
      Decide(*p, {Job("capped", 10, 1, 2), Job("other", 1, 1, 8, 1.0)}, Gpus({{"V100", 8}}));
  EXPECT_EQ(Workers(d, "capped"), 2);
  EXPECT_EQ(Workers(d, "other"), 6);
}

TEST(ElasticPolicy, CooldownHoldsGrowthUntilItEnds) {
  auto p = Make("elastic");
  PolicyJob j = Job("j", 1, 1, 8);
  j.current = {{"V100", 2}};
  j.last_resize_time = 990.0;
  EXPECT_EQ(Workers(Decide(*p, {j}, Gpus({{"V100", 8}}), 1000.0), "j"), 2);
  EXPECT_EQ(Workers(Decide(*p, {j}, Gpus({{"V100", 8}}), 1021.0), "j"), 8);
}

TEST(ElasticPolicy, PerJobCooldownOverridesTheDefault) {
  auto p = Make("elastic");
  PolicyJob j = Job("j", 1, 1, 8);
  j.current = {{"V100", 2}};
  j.last_resize_time = 990.0;
  j.cooldown_seconds = 5.0;
  EXPECT_EQ(Workers(Decide(*p, {j}, Gpus({{"V100", 8}}), 1000.0), "j"), 8);
}

TEST(ElasticPolicy, HoldsAResizeWhosePauseCostsMoreThanItGains) {
  auto p = Make("elastic");
  PolicyJob j = Job("j", 1, 1, 8);
  j.current = {{"V100", 2}};
  j.throughput = {{{{"V100", 2}}, 200.0}};
  j.resize_pause_seconds = 30.0;
  j.remaining_samples = 1000.0;  // 5 s of work left: a 30 s pause never pays
  const Decision d = Decide(*p, {j}, Gpus({{"V100", 8}}));
  EXPECT_EQ(Workers(d, "j"), 2);
  EXPECT_NE(Reason(d, "j").find("held: a resize would not repay its 30 s pause"), std::string::npos)
      << Reason(d, "j");
  j.remaining_samples = 1e7;  // hours left: it pays
  EXPECT_EQ(Workers(Decide(*p, {j}, Gpus({{"V100", 8}})), "j"), 8);
}

TEST(ElasticPolicy, RunningJobKeepsItsGpuTypes) {
  auto p = Make("elastic");
  PolicyJob a = Job("a", 1, 2, 2);
  a.current = {{"P100", 2}};
  const Decision d = Decide(*p, {a}, Gpus({{"P100", 2}, {"V100", 2}}));
  EXPECT_EQ(d.Find("a")->workers, (Allocation{{"P100", 2}}));
  EXPECT_FALSE(d.Find("a")->changed);
}

TEST(ElasticPolicy, NewJobsGetTheFastestTypeFirst) {
  PolicyOptions o;
  o.gpu_type_speed = {{"V100", 1.6}, {"P100", 1.0}};
  auto p = Make("elastic", o);
  const Decision d = Decide(*p, {Job("a", 1, 2, 2)}, Gpus({{"P100", 8}, {"V100", 2}}));
  EXPECT_EQ(d.Find("a")->workers, (Allocation{{"V100", 2}}));
}

TEST(ElasticPolicy, MeasuredSpeedBeatsTheHints) {
  PolicyOptions o;
  o.gpu_type_speed = {{"V100", 1.6}, {"P100", 1.0}};
  auto p = Make("elastic", o);
  PolicyJob j = Job("a", 1, 2, 2);
  j.throughput = {{{{"V100", 1}}, 100.0}, {{{"P100", 1}}, 150.0}};
  const Decision d = Decide(*p, {j}, Gpus({{"P100", 8}, {"V100", 2}}));
  EXPECT_EQ(d.Find("a")->workers, (Allocation{{"P100", 2}}));
}

TEST(ElasticPolicy, SpansGpuTypesWhenAllowed) {
  PolicyOptions o;
  o.gpu_type_speed = {{"V100", 1.6}, {"P100", 1.0}};
  auto p = Make("elastic", o);
  const Decision d = Decide(*p, {Job("a", 1, 1, 10)}, Gpus({{"P100", 8}, {"V100", 2}}));
  EXPECT_EQ(d.Find("a")->workers, (Allocation{{"V100", 2}, {"P100", 8}}));
}

TEST(ElasticPolicy, KeepsOneTypePerJobWhenMixingIsOff) {
  PolicyOptions o;
  o.allow_mixed_types = false;
  o.gpu_type_speed = {{"V100", 1.6}, {"P100", 1.0}};
  auto p = Make("elastic", o);
  const Decision d = Decide(*p, {Job("a", 1, 1, 10)}, Gpus({{"P100", 8}, {"V100", 2}}));
  EXPECT_EQ(d.Find("a")->workers.size(), 1u);
}

TEST(ElasticPolicy, JobWhoseGpusVanishedStopsWithAReason) {
  auto p = Make("elastic");
  PolicyJob j = Job("j", 1, 4, 4);
  j.current = {{"V100", 4}};
  const Decision d = Decide(*p, {j}, Gpus({{"V100", 2}}));
  EXPECT_EQ(Workers(d, "j"), 0);
  EXPECT_NE(Reason(d, "j").find("stopped"), std::string::npos);
}

TEST(ElasticPolicy, JobInCooldownStillShrinksToALoweredMax) {
  auto p = Make("elastic");
  PolicyJob j = Job("j", 1, 1, 3);
  j.current = {{"V100", 6}};
  j.last_resize_time = 995.0;
  EXPECT_EQ(Workers(Decide(*p, {j}, Gpus({{"V100", 8}})), "j"), 3);
}

// ---- autoscale -----------------------------------------------------------------------------

PolicyJob Scaling(const std::vector<std::pair<int, double>>& measured, int current) {
  PolicyJob j = Job("j", 1, 1, 8);
  j.requested_workers = 1;
  j.current = {{"V100", current}};
  for (const auto& [n, t] : measured) j.throughput.push_back({{{"V100", n}}, t});
  return j;
}

TEST(AutoscalePolicy, StartsAtTheRequest) {
  auto p = Make("autoscale");
  PolicyJob j = Job("j", 1, 1, 8);
  j.requested_workers = 3;
  EXPECT_EQ(Workers(Decide(*p, {j}, Gpus({{"V100", 8}})), "j"), 3);
}

TEST(AutoscalePolicy, ProbesOneMoreWorkerWhileTheLastOnePaid) {
  auto p = Make("autoscale");
  const Decision d = Decide(*p, {Scaling({{1, 100.0}, {2, 190.0}}, 2)}, Gpus({{"V100", 8}}));
  EXPECT_EQ(Workers(d, "j"), 3);
  EXPECT_NE(Reason(d, "j").find("probing"), std::string::npos) << Reason(d, "j");
}

TEST(AutoscalePolicy, DoesNotAddAWorkerMeasuredToAddTooLittle) {
  auto p = Make("autoscale");
  // Worker 3 added (195 - 190) / 95 = 5% of an average worker: below 10%.
  const Decision d =
      Decide(*p, {Scaling({{1, 100.0}, {2, 190.0}, {3, 195.0}}, 2)}, Gpus({{"V100", 8}}));
  EXPECT_EQ(Workers(d, "j"), 2);
}

TEST(AutoscalePolicy, AddsAWorkerMeasuredToPay) {
  auto p = Make("autoscale");
  const Decision d =
      Decide(*p, {Scaling({{1, 100.0}, {2, 190.0}, {3, 270.0}}, 2)}, Gpus({{"V100", 8}}));
  EXPECT_EQ(Workers(d, "j"), 3);
  EXPECT_NE(Reason(d, "j").find("adds 84%"), std::string::npos) << Reason(d, "j");
}

TEST(AutoscalePolicy, GivesBackAWorkerThatDoesNotPayForItself) {
  auto p = Make("autoscale");
  const Decision d = Decide(*p, {Scaling({{2, 190.0}, {3, 195.0}}, 3)}, Gpus({{"V100", 8}}));
  EXPECT_EQ(Workers(d, "j"), 2);
  EXPECT_NE(Reason(d, "j").find("shrank: 3 -> 2"), std::string::npos) << Reason(d, "j");
}

TEST(AutoscalePolicy, ThresholdIsConfigurable) {
  PolicyOptions o;
  o.scaling_efficiency_threshold = 0.01;
  auto p = Make("autoscale", o);
  const Decision d = Decide(*p, {Scaling({{2, 190.0}, {3, 195.0}}, 3)}, Gpus({{"V100", 8}}));
  EXPECT_GE(Workers(d, "j"), 3);  // 5% is above 1%: it keeps worker 3 (and may probe a 4th)
}

TEST(AutoscalePolicy, WaitsForTheCooldownBetweenSteps) {
  auto p = Make("autoscale");
  PolicyJob j = Scaling({{1, 100.0}, {2, 190.0}}, 2);
  j.last_resize_time = 990.0;
  EXPECT_EQ(Workers(Decide(*p, {j}, Gpus({{"V100", 8}}), 1000.0), "j"), 2);
}

TEST(AutoscalePolicy, StartingJobTakesItsMinimumFromExtraWorkers) {
  auto p = Make("autoscale");
  PolicyJob big = Scaling({{7, 700.0}, {8, 800.0}}, 8);
  const Decision d = Decide(*p, {big, Job("new", 1, 2, 2, 5.0)}, Gpus({{"V100", 8}}));
  EXPECT_EQ(Workers(d, "new"), 2);
  EXPECT_EQ(Workers(d, "j"), 6);
}

// ---- throughput estimates ------------------------------------------------------------------

TEST(EstimateThroughput, UsesTheExactMeasurement) {
  PolicyJob j = Job("j", 1, 1, 8);
  j.throughput = {{{{"V100", 2}}, 150.0}, {{{"V100", 2}}, 180.0}};
  EXPECT_DOUBLE_EQ(EstimateThroughput(j, {{"V100", 2}}), 180.0);
}

TEST(EstimateThroughput, ScalesLinearlyFromTheNearestMeasuredSize) {
  PolicyJob j = Job("j", 1, 1, 8);
  j.throughput = {{{{"V100", 1}}, 100.0}, {{{"V100", 4}}, 360.0}};
  EXPECT_DOUBLE_EQ(EstimateThroughput(j, {{"V100", 5}}), 450.0);
  EXPECT_DOUBLE_EQ(EstimateThroughput(j, {{"V100", 2}}), 200.0);
}

TEST(EstimateThroughput, AddsPerTypeRatesForMixedAllocations) {
  PolicyJob j = Job("j", 1, 1, 10);
  j.throughput = {{{{"V100", 1}}, 160.0}, {{{"P100", 1}}, 100.0}};
  EXPECT_DOUBLE_EQ(EstimateThroughput(j, {{"V100", 2}, {"P100", 8}}), 1120.0);
}

TEST(EstimateThroughput, UnknownTypeIsNegative) {
  PolicyJob j = Job("j", 1, 1, 8);
  j.throughput = {{{{"V100", 1}}, 160.0}};
  EXPECT_LT(EstimateThroughput(j, {{"K80", 1}}), 0.0);
  EXPECT_DOUBLE_EQ(EstimateThroughput(j, {}), 0.0);
}

// ---- each job by its own policy ------------------------------------------------------------

PolicyJob Named(PolicyJob j, const std::string& policy) {
  j.policy = policy;
  return j;
}

// A static job at its request, an autoscale job whose third worker added too little, an elastic
// job that can use idle GPUs: one inventory, each sized by its own policy, whichever policy the
// operator was started with.
TEST(PerJobPolicy, AMixedSetIsSizedEachByItsOwnPolicy) {
  PolicyJob fixed = Named(Job("fixed", 1, 1, 4), "static");
  fixed.current = {{"V100", 4}};
  PolicyJob scaled = Scaling({{2, 190.0}, {3, 195.0}}, 3);
  scaled.id = "scaled";
  scaled = Named(scaled, "autoscale");
  PolicyJob shared = Named(Job("shared", 1, 1, 8), "elastic");
  shared.current = {{"V100", 2}};
  for (const std::string& fallback : KnownPolicyNames()) {
    auto p = Make(fallback);
    const Decision d = Decide(*p, {fixed, scaled, shared}, Gpus({{"V100", 12}}));
    EXPECT_EQ(Workers(d, "fixed"), 4) << fallback;  // never grows into idle GPUs
    EXPECT_EQ(Workers(d, "scaled"), 2) << fallback;
    EXPECT_NE(Reason(d, "scaled").find("shrank: 3 -> 2"), std::string::npos) << Reason(d, "scaled");
    EXPECT_EQ(Workers(d, "shared"), 6) << fallback;  // the idle rest, lent
    EXPECT_NE(Reason(d, "shared").find("grew: 2 -> 6"), std::string::npos) << Reason(d, "shared");
  }
}

TEST(PerJobPolicy, UnderOnePolicyTheSameSetIsSizedDifferently) {
  // The control: the same jobs naming none are all sized by the elastic policy.
  PolicyJob fixed = Job("fixed", 1, 1, 4);
  fixed.current = {{"V100", 4}};
  PolicyJob scaled = Scaling({{2, 190.0}, {3, 195.0}}, 3);
  scaled.id = "scaled";
  PolicyJob shared = Job("shared", 1, 1, 8);
  shared.current = {{"V100", 2}};
  const Decision d = Decide(*Make("elastic"), {fixed, scaled, shared}, Gpus({{"V100", 12}}));
  EXPECT_NE(Workers(d, "scaled"), 2);
}

TEST(PerJobPolicy, AStaticJobTakesItsRequestBackFromLentGpus) {
  PolicyJob shared = Named(Job("shared", 1, 1, 8), "elastic");
  shared.current = {{"V100", 8}};
  shared.last_resize_time = 999.0;  // in cooldown: lent GPUs go back all the same
  const PolicyJob fixed = Named(Job("fixed", 1, 1, 4, 10.0), "static");
  const Decision d = Decide(*Make("autoscale"), {shared, fixed}, Gpus({{"V100", 8}}));
  EXPECT_EQ(Workers(d, "fixed"), 4);
  EXPECT_EQ(Workers(d, "shared"), 4);
}

TEST(PerJobPolicy, AnAutoscaleJobStartsAtItsRequestBesideAnElasticOne) {
  PolicyJob shared = Named(Job("shared", 1, 1, 8), "elastic");
  shared.current = {{"V100", 8}};
  PolicyJob scaled = Named(Job("scaled", 1, 1, 8, 10.0), "autoscale");
  scaled.requested_workers = 3;
  const Decision d = Decide(*Make("static"), {shared, scaled}, Gpus({{"V100", 8}}));
  EXPECT_EQ(Workers(d, "scaled"), 3);
  EXPECT_EQ(Workers(d, "shared"), 5);
}

TEST(PerJobPolicy, AnUnknownPolicyNameMakesThatJobWait) {
  const PolicyJob odd = Named(Job("odd", 1, 1, 2), "fastest");
  const PolicyJob fine = Named(Job("fine", 1, 1, 2), "elastic");
  const Decision d = Decide(*Make("elastic"), {odd, fine}, Gpus({{"V100", 4}}));
  EXPECT_EQ(Workers(d, "odd"), 0);
  EXPECT_NE(Reason(d, "odd").find("unknown policy 'fastest'"), std::string::npos)
      << Reason(d, "odd");
  EXPECT_EQ(Workers(d, "fine"), 2);
}

TEST(PerJobPolicy, InvariantsHoldOverRandomMixedSequences) {
  const std::vector<std::string> names = KnownPolicyNames();  // the test's own policy too
  for (const std::string& fallback : names) {
    auto p = Make(fallback);
    std::mt19937 rng(4321);
    for (int trial = 0; trial < 100; ++trial) {
      GpuInventory inv =
          Gpus({{"V100", static_cast<int>(rng() % 9)}, {"P100", static_cast<int>(rng() % 9)}});
      std::vector<PolicyJob> jobs;
      double now = 0.0;
      int next_id = 0;
      for (int step = 0; step < 25; ++step) {
        now += static_cast<double>(rng() % 60);
        if (rng() % 3 == 0 || jobs.empty()) {
          const int priorities[] = {1, 5, 10};
          const int min = 1 + static_cast<int>(rng() % 3);
          const int max = min + static_cast<int>(rng() % 5);
          PolicyJob j =
              Job("job" + std::to_string(next_id++), priorities[rng() % 3], min, max, now);
          j.gpus_per_worker = 1 + static_cast<int>(rng() % 2);
          j.requested_workers = min + static_cast<int>(rng() % (max - min + 1));
          j.resize_pause_seconds = static_cast<double>(rng() % 5);
          const size_t pick = rng() % (names.size() + 1);  // one in four names none
          j.policy = pick < names.size() ? names[pick] : "";
          jobs.push_back(j);
        }
        if (rng() % 4 == 0) jobs.erase(jobs.begin() + static_cast<long>(rng() % jobs.size()));
        auto result = p->Decide(jobs, inv, now);
        ASSERT_TRUE(result.ok()) << result.status().message();
        const Decision& d = *result;
        ASSERT_EQ(d.jobs.size(), jobs.size());
        std::map<std::string, int> used;
        for (size_t i = 0; i < jobs.size(); ++i) {
          const PolicyJob& j = jobs[i];
          const JobDecision& out = d.jobs[i];
          ASSERT_EQ(out.id, j.id);
          const int w = TotalWorkers(out.workers);
          for (const auto& [type, n] : out.workers) used[type] += n * j.gpus_per_worker;
          if (w > 0) {
            EXPECT_GE(w, j.min_workers) << fallback << " " << j.id;
            EXPECT_LE(w, j.max_workers) << fallback << " " << j.id;
          } else {
            EXPECT_FALSE(out.reason.empty()) << j.id << " waits without a reason";
          }
          if (TotalWorkers(j.current) > 0) {
            EXPECT_GT(w, 0) << fallback << " " << j.id;
          }
          EXPECT_EQ(out.changed, out.workers != j.current);
          const std::string& own = j.policy.empty() ? fallback : j.policy;
          if (own == "static" && TotalWorkers(j.current) > 0) {
            EXPECT_EQ(out.workers, j.current) << fallback << ": static resized " << j.id;
          }
        }
        for (const auto& [type, n] : used) {
          EXPECT_LE(n, inv.gpus[type]) << fallback << " oversubscribed " << type;
        }
        for (size_t i = 0; i < jobs.size(); ++i) {
          if (d.jobs[i].changed) jobs[i].last_resize_time = now;
          jobs[i].current = d.jobs[i].workers;
        }
      }
    }
  }
}

}  // namespace
}  // namespace vf::policy
