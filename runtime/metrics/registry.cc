#include "runtime/metrics/registry.h"

#include <set>
#include <utility>

#include "runtime/metrics/text_format.h"

namespace vf::metrics {
namespace {

bool IsLetterOrUnderscore(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

bool IsValidMetricName(std::string_view name) {
  if (name.empty()) return false;
  if (!IsLetterOrUnderscore(name[0]) && name[0] != ':') return false;
  for (const char c : name.substr(1)) {
    if (!IsLetterOrUnderscore(c) && !IsDigit(c) && c != ':') return false;
  }
  return true;
}

bool IsValidLabelName(std::string_view name) {
  if (name.empty() || !IsLetterOrUnderscore(name[0])) return false;
  if (name.substr(0, 2) == "__") return false;
  for (const char c : name.substr(1)) {
    if (!IsLetterOrUnderscore(c) && !IsDigit(c)) return false;
  }
  return true;
}

std::vector<std::string> Registry::SeriesNames(const FamilyDescriptor& descriptor) {
  std::vector<std::string> names = {descriptor.name};
  if (descriptor.type == MetricType::kHistogram) {
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      names.push_back(descriptor.name + suffix);
  }
  return names;
}

Status Registry::Check(const FamilyDescriptor& descriptor) const {
  if (!IsValidMetricName(descriptor.name)) {
    return InvalidArgument("'" + descriptor.name +
                           "' is not a valid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)");
  }
  std::set<std::string> seen;
  for (const std::string& label : descriptor.label_names) {
    if (!IsValidLabelName(label)) {
      return InvalidArgument("'" + label +
                             "' is not a valid label name ([a-zA-Z_][a-zA-Z0-9_]*, no leading "
                             "\"__\")");
    }
    if (!seen.insert(label).second) return InvalidArgument("label '" + label + "' given twice");
    if (descriptor.type == MetricType::kHistogram && label == "le") {
      return InvalidArgument("a histogram cannot have a label named 'le': its buckets use it");
    }
  }
  if (descriptor.type == MetricType::kHistogram) {
    VF_RETURN_IF_ERROR(Histogram::ValidateBounds(descriptor.bounds));
  }
  for (const std::string& series : SeriesNames(descriptor)) {
    if (series_names_.count(series) > 0) {
      return InvalidArgument(series == descriptor.name
                                 ? "a metric named '" + series + "' is already registered"
                                 : "series '" + series + "' of this histogram is already taken");
    }
  }
  return Status::Ok();
}

template <typename T>
Result<Family<T>*> Registry::Add(FamilyDescriptor descriptor) {
  descriptor.type = T::kType;
  std::lock_guard<std::mutex> lock(mu_);
  const Status valid = Check(descriptor);
  if (!valid.ok()) return valid.WithContext("registering metric family '" + descriptor.name + "'");
  for (std::string& series : SeriesNames(descriptor)) series_names_.insert(std::move(series));
  // Family's constructor is private to the registry, hence no make_unique.
  auto* family = new Family<T>(descriptor);
  families_.emplace(descriptor.name, std::unique_ptr<FamilyBase>(family));
  return family;
}

Result<Family<Counter>*> Registry::AddCounter(std::string name, std::string help,
                                              std::vector<std::string> label_names) {
  return Add<Counter>(
      {std::move(name), std::move(help), MetricType::kCounter, std::move(label_names), {}});
}

Result<Family<Gauge>*> Registry::AddGauge(std::string name, std::string help,
                                          std::vector<std::string> label_names) {
  return Add<Gauge>(
      {std::move(name), std::move(help), MetricType::kGauge, std::move(label_names), {}});
}

Result<Family<Histogram>*> Registry::AddHistogram(std::string name, std::string help,
                                                  std::vector<std::string> label_names,
                                                  std::vector<double> bounds) {
  return Add<Histogram>({std::move(name), std::move(help), MetricType::kHistogram,
                         std::move(label_names), std::move(bounds)});
}

std::vector<FamilySnapshot> Registry::Collect() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<FamilySnapshot> snapshots;
  snapshots.reserve(families_.size());
  for (const auto& [name, family] : families_) snapshots.push_back(family->Collect());
  return snapshots;
}

std::vector<FamilyDescriptor> Registry::Describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<FamilyDescriptor> descriptors;
  descriptors.reserve(families_.size());
  for (const auto& [name, family] : families_) descriptors.push_back(family->descriptor());
  return descriptors;
}

std::string Registry::Serialize() const { return SerializeText(Collect()); }

}  // namespace vf::metrics
