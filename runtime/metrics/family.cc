#include "runtime/metrics/family.h"

#include <cstdio>
#include <cstdlib>
#include <set>
#include <type_traits>
#include <utility>

namespace vf::metrics {

Result<std::vector<std::string>> FamilyBase::LabelValues(const Labels& labels) const {
  const std::vector<std::string>& names = descriptor_.label_names;
  std::vector<std::string> values;
  values.reserve(names.size());
  std::string missing;
  for (const std::string& name : names) {
    auto it = labels.find(name);
    if (it == labels.end()) {
      missing += (missing.empty() ? "" : ", ") + name;
    } else {
      values.push_back(it->second);
    }
  }
  std::string unknown;
  if (labels.size() != values.size()) {
    const std::set<std::string> known(names.begin(), names.end());
    for (const auto& [name, value] : labels) {
      if (known.count(name) == 0) unknown += (unknown.empty() ? "" : ", ") + name;
    }
  }
  if (missing.empty() && unknown.empty()) return values;
  std::string message = "metric family " + descriptor_.name + ":";
  if (!missing.empty()) message += " missing label(s) " + missing;
  if (!unknown.empty())
    message += (missing.empty() ? "" : ";") + std::string(" unknown label(s) ") + unknown;
  return InvalidArgument(std::move(message));
}

bool FamilyBase::Matches(const std::vector<std::string>& values, const Labels& subset) const {
  const std::vector<std::string>& names = descriptor_.label_names;
  for (const auto& [name, value] : subset) {
    bool found = false;
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == name) {
        if (values[i] != value) return false;
        found = true;
        break;
      }
    }
    if (!found) return false;
  }
  return true;
}

template <typename T>
T& Family<T>::Add(const Labels& labels) {
  return *AddShared(labels);
}

template <typename T>
std::shared_ptr<T> Family<T>::AddShared(const Labels& labels) {
  Result<std::shared_ptr<T>> child = TryAdd(labels);
  if (!child.ok()) {
    // A label set that does not fit its family is a programming error, like an index out of
    // range; going on would export series nobody asked for.
    std::fprintf(stderr, "vf::metrics: %s\n", child.status().message().c_str());
    std::abort();
  }
  return std::move(child).value();
}

template <typename T>
Result<std::shared_ptr<T>> Family<T>::TryAdd(const Labels& labels) {
  VF_ASSIGN_OR_RETURN(std::vector<std::string> values, LabelValues(labels));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = children_.find(values);
  if (it == children_.end()) {
    std::shared_ptr<T> child;
    if constexpr (std::is_same_v<T, Histogram>) {
      child = std::make_shared<Histogram>(descriptor().bounds);
    } else {
      child = std::make_shared<T>();
    }
    it = children_.emplace(std::move(values), std::move(child)).first;
  }
  return it->second;
}

template <typename T>
bool Family<T>::Remove(const Labels& labels) {
  Result<std::vector<std::string>> values = LabelValues(labels);
  if (!values.ok()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return children_.erase(*values) > 0;
}

template <typename T>
size_t Family<T>::RemoveMatching(const Labels& subset) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t removed = 0;
  for (auto it = children_.begin(); it != children_.end();) {
    if (Matches(it->first, subset)) {
      it = children_.erase(it);
      ++removed;
    } else {
      ++it;
    }
  }
  return removed;
}

template <typename T>
FamilySnapshot Family<T>::Collect() const {
  FamilySnapshot snapshot;
  snapshot.family = descriptor();
  std::lock_guard<std::mutex> lock(mu_);
  snapshot.children.reserve(children_.size());
  for (const auto& [values, child] : children_) {
    ChildSnapshot c;
    c.label_values = values;
    if constexpr (std::is_same_v<T, Histogram>) {
      c.histogram = child->Collect();
    } else {
      c.value = child->Value();
    }
    snapshot.children.push_back(std::move(c));
  }
  return snapshot;
}

template <typename T>
size_t Family<T>::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return children_.size();
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

}  // namespace vf::metrics
