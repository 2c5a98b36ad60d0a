// docs/metrics.md is the metrics reference dashboards are built from: its table must list
// exactly the families OperatorMetrics and AgentMetrics register, with their types, label sets
// and exporters.
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "agent/metrics/agent_metrics.h"
#include "agent/metrics/described_registry.h"
#include "operator/metrics/operator_metrics.h"

#ifndef VF_METRICS_DOC
#error "VF_METRICS_DOC (the path of docs/metrics.md) must be defined by the build"
#endif

namespace vf {
namespace {

// One metric as the reference or the code describes it.
struct Entry {
  std::string type;  // counter, gauge, histogram
  std::set<std::string> labels;
  std::string exporter;  // operator, agent
  int line = 0;          // in the doc; 0 for the code
};

std::string Trim(const std::string& text) {
  const size_t start = text.find_first_not_of(" \t\r");
  if (start == std::string::npos) return "";
  const size_t end = text.find_last_not_of(" \t\r");
  return text.substr(start, end - start + 1);
}

std::string StripBackticks(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c != '`') out += c;
  }
  return Trim(out);
}

// The cells of a Markdown table row; "\|" is a pipe inside a cell.
std::vector<std::string> Cells(const std::string& row) {
  std::vector<std::string> cells;
  std::string cell;
  for (size_t i = 0; i < row.size(); ++i) {
    if (row[i] == '\\' && i + 1 < row.size() && row[i + 1] == '|') {
      cell += '|';
      ++i;
    } else if (row[i] == '|') {
      cells.push_back(Trim(cell));
      cell.clear();
    } else {
      cell += row[i];
    }
  }
  cells.push_back(Trim(cell));
  // A row starts and ends with a pipe: drop the empty cells outside them.
  if (!cells.empty() && cells.front().empty()) cells.erase(cells.begin());
  if (!cells.empty() && cells.back().empty()) cells.pop_back();
  return cells;
}

std::string Lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// The metrics table: the one whose header is "| Metric | Type | Labels | Exported by | ...".
// Problems with the doc itself (no table, a short row, a metric listed twice) go to `errors`.
std::map<std::string, Entry> ParseReference(const std::string& markdown,
                                            std::vector<std::string>& errors) {
  std::map<std::string, Entry> entries;
  std::istringstream in(markdown);
  std::string line;
  int number = 0;
  bool in_table = false;
  bool found = false;
  while (std::getline(in, line)) {
    ++number;
    const std::string trimmed = Trim(line);
    if (!in_table) {
      if (trimmed.empty() || trimmed[0] != '|') continue;
      const std::vector<std::string> header = Cells(trimmed);
      if (header.size() >= 4 && Lower(header[0]) == "metric" && Lower(header[1]) == "type" &&
          Lower(header[2]) == "labels" && Lower(header[3]) == "exported by") {
        in_table = true;
        found = true;
      }
      continue;
    }
    if (trimmed.empty() || trimmed[0] != '|') {
      in_table = false;
      continue;
    }
    if (trimmed.find_first_not_of("|-: ") == std::string::npos) continue;  // the --- row
    const std::vector<std::string> cells = Cells(trimmed);
    if (cells.size() < 4) {
      errors.push_back("docs/metrics.md:" + std::to_string(number) +
                       ": a row of the metrics table has fewer than 4 cells");
      continue;
    }
    const std::string name = StripBackticks(cells[0]);
    Entry entry;
    entry.type = Lower(StripBackticks(cells[1]));
    const std::string labels = StripBackticks(cells[2]);
    if (labels != "—" && labels != "-" && Lower(labels) != "none" && !labels.empty()) {
      std::istringstream list(labels);
      std::string label;
      while (std::getline(list, label, ',')) entry.labels.insert(StripBackticks(label));
    }
    entry.exporter = Lower(StripBackticks(cells[3]));
    entry.line = number;
    if (!entries.emplace(name, entry).second) {
      errors.push_back("docs/metrics.md:" + std::to_string(number) + ": " + name +
                       " is listed twice (first on line " + std::to_string(entries.at(name).line) +
                       ")");
    }
  }
  if (!found) {
    errors.push_back(
        "docs/metrics.md has no table with the header | Metric | Type | Labels | Exported by |");
  }
  return entries;
}

std::string Join(const std::set<std::string>& labels) {
  if (labels.empty()) return "{}";
  std::string out = "{";
  for (const std::string& label : labels) out += (out.size() > 1 ? ", " : "") + label;
  return out + "}";
}

// A family both register (vf_build_info) is one row, exported by "operator, agent"; should the
// two disagree on its type or labels, the type says so and the comparison reports it.
void AddFamilies(const std::vector<metrics::FamilyInfo>& families, const std::string& exporter,
                 std::map<std::string, Entry>& entries) {
  for (const metrics::FamilyInfo& family : families) {
    Entry entry;
    entry.type = std::string(metrics::TypeName(family.type));
    entry.labels.insert(family.label_names.begin(), family.label_names.end());
    entry.exporter = exporter;
    auto [it, added] = entries.emplace(family.name, entry);
    if (added) continue;
    if (it->second.type != entry.type || it->second.labels != entry.labels) {
      it->second.type = it->second.exporter + " and " + exporter + " disagree (" + it->second.type +
                        " " + Join(it->second.labels) + ", " + entry.type + " " +
                        Join(entry.labels) + ")";
    }
    it->second.exporter += ", " + exporter;
  }
}

std::map<std::string, Entry> CodeFamilies() {
  std::map<std::string, Entry> entries;
  OperatorMetrics operator_metrics;
  AddFamilies(operator_metrics.Describe(), "operator", entries);
  AgentMetrics agent_metrics("team", "mnist");
  AddFamilies(agent_metrics.Describe(), "agent", entries);
  return entries;
}

// Every difference, both ways, one a line.
std::vector<std::string> Compare(const std::map<std::string, Entry>& doc,
                                 const std::map<std::string, Entry>& code) {
  std::vector<std::string> differences;
  for (const auto& [name, c] : code) {
    auto it = doc.find(name);
    if (it == doc.end()) {
      differences.push_back(name + ": registered by the " + c.exporter +
                            " but missing from docs/metrics.md");
      continue;
    }
    const Entry& d = it->second;
    const std::string where = name + " (docs/metrics.md:" + std::to_string(d.line) + "): ";
    if (d.type != c.type) {
      differences.push_back(where + "type is " + c.type + " in the code, " + d.type +
                            " in the doc");
    }
    if (d.labels != c.labels) {
      differences.push_back(where + "labels are " + Join(c.labels) + " in the code, " +
                            Join(d.labels) + " in the doc");
    }
    if (d.exporter != c.exporter) {
      differences.push_back(where + "exported by the " + c.exporter + " in the code, by '" +
                            d.exporter + "' in the doc");
    }
  }
  for (const auto& [name, d] : doc) {
    if (code.count(name) == 0) {
      differences.push_back(name + " (docs/metrics.md:" + std::to_string(d.line) +
                            "): listed in the doc but registered by neither OperatorMetrics nor "
                            "AgentMetrics");
    }
  }
  return differences;
}

std::string Lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& line : lines) out += "  " + line + "\n";
  return out;
}

TEST(MetricsReference, DocTableMatchesTheRegisteredFamilies) {
  std::ifstream file(VF_METRICS_DOC);
  ASSERT_TRUE(file.good()) << "cannot read " << VF_METRICS_DOC;
  std::stringstream text;
  text << file.rdbuf();
  std::vector<std::string> errors;
  const std::map<std::string, Entry> doc = ParseReference(text.str(), errors);
  ASSERT_TRUE(errors.empty()) << Lines(errors);
  const std::vector<std::string> differences = Compare(doc, CodeFamilies());
  EXPECT_TRUE(differences.empty())
      << "docs/metrics.md and the code disagree; update the table or the code:\n"
      << Lines(differences);
}

// The comparison itself: it must see every kind of difference, both ways.
TEST(MetricsReference, ComparisonNamesEachDifferenceBothWays) {
  const std::string doc =
      "Intro.\n\n"
      "| Metric | Type | Labels | Exported by | Meaning |\n"
      "|---|---|---|---|---|\n"
      "| `a_total` | counter | `job_name`, `job_namespace` | operator | Same as the code. |\n"
      "| `b` | gauge | — | operator | Type differs. |\n"
      "| `c` | gauge | `x` | agent | Labels and exporter differ; a \\| pipe. |\n"
      "| `only_doc` | gauge | — | agent | Not in the code. |\n"
      "\nAfter the table.\n"
      "| `not_a_row` | gauge | — | agent | Outside the table. |\n";
  std::vector<std::string> errors;
  const std::map<std::string, Entry> parsed = ParseReference(doc, errors);
  ASSERT_TRUE(errors.empty()) << Lines(errors);
  ASSERT_EQ(parsed.size(), 4u);
  EXPECT_EQ(parsed.at("a_total").labels, (std::set<std::string>{"job_name", "job_namespace"}));
  EXPECT_TRUE(parsed.at("b").labels.empty());
  EXPECT_EQ(parsed.at("b").line, 6);

  const std::map<std::string, Entry> code = {
      {"a_total", {"counter", {"job_namespace", "job_name"}, "operator", 0}},
      {"b", {"counter", {}, "operator", 0}},
      {"c", {"gauge", {"x", "y"}, "operator", 0}},
      {"only_code", {"histogram", {"job_name"}, "agent", 0}},
  };
  const std::vector<std::string> differences = Compare(parsed, code);
  const std::vector<std::string> expected = {
      "b (docs/metrics.md:6): type is counter in the code, gauge in the doc",
      "c (docs/metrics.md:7): labels are {x, y} in the code, {x} in the doc",
      "c (docs/metrics.md:7): exported by the operator in the code, by 'agent' in the doc",
      "only_code: registered by the agent but missing from docs/metrics.md",
      // NOLINTNEXTLINE(bugprone-suspicious-missing-comma): one message, split over two lines.
      "only_doc (docs/metrics.md:8): listed in the doc but registered by neither OperatorMetrics "
      "nor AgentMetrics",
  };
  EXPECT_EQ(differences, expected) << Lines(differences);
}

TEST(MetricsReference, ParserReportsAMissingTableAndDuplicateRows) {
  std::vector<std::string> errors;
  ParseReference("# Nothing here\n", errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("has no table"), std::string::npos);

  errors.clear();
  ParseReference(
      "| Metric | Type | Labels | Exported by |\n|---|---|---|---|\n"
      "| `x` | gauge | — | agent |\n| `x` | gauge | — | agent |\n| short |\n",
      errors);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0], "docs/metrics.md:4: x is listed twice (first on line 3)");
  EXPECT_EQ(errors[1], "docs/metrics.md:5: a row of the metrics table has fewer than 4 cells");
}

}  // namespace
}  // namespace vf
