// For tests: a registry's exposition, and how what it exports differs from what was registered
// (DescribedRegistry::Describe), so that a test of a metrics class checks the series it really
// writes against the families docs/metrics.md is checked against.
#pragma once

#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "agent/metrics/described_registry.h"

namespace vf::metrics {

// What GET /metrics answers for `registry`.
inline std::string Exposition(const prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

// The children a family exports now (0 for a family with none: it is not exported at all).
inline size_t ExportedChildren(const prometheus::Registry& registry, const std::string& name) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name == name) return family.metric.size();
  }
  return 0;
}

// Every way the families `registry` exports differ from `declared`, one a line: a family
// exported but not declared, or with another type or help; a series whose label names (a
// histogram's "le" aside) are not the declared ones; a histogram series with other buckets.
// A declared family with no child yet is not exported, and is no difference.
inline std::vector<std::string> ExportMismatches(const prometheus::Registry& registry,
                                                 const std::vector<FamilyInfo>& declared) {
  std::map<std::string, const FamilyInfo*> by_name;
  for (const FamilyInfo& info : declared) by_name[info.name] = &info;
  std::vector<std::string> problems;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    auto it = by_name.find(family.name);
    if (it == by_name.end()) {
      problems.push_back(family.name + ": exported but not declared");
      continue;
    }
    const FamilyInfo& info = *it->second;
    if (family.type != info.type) {
      problems.push_back(family.name + ": exported as " + std::string(TypeName(family.type)) +
                         ", declared as " + std::string(TypeName(info.type)));
    }
    if (family.help != info.help) {
      problems.push_back(family.name + ": help '" + family.help + "', declared '" + info.help +
                         "'");
    }
    const std::set<std::string> want(info.label_names.begin(), info.label_names.end());
    for (const prometheus::ClientMetric& series : family.metric) {
      std::set<std::string> got;
      for (const prometheus::ClientMetric::Label& label : series.label) got.insert(label.name);
      if (got != want) {
        std::string names;
        for (const std::string& name : got) names += (names.empty() ? "" : ",") + name;
        problems.push_back(family.name + ": a series labelled {" + names +
                           "}, not with the declared label names");
      }
      if (family.type == prometheus::MetricType::Histogram) {
        std::vector<double> bounds;
        for (const prometheus::ClientMetric::Bucket& bucket : series.histogram.bucket) {
          bounds.push_back(bucket.upper_bound);
        }
        if (!bounds.empty()) bounds.pop_back();  // +Inf
        if (bounds != info.buckets) {
          problems.push_back(family.name + ": a series with other buckets than declared");
        }
      }
    }
  }
  return problems;
}

}  // namespace vf::metrics
