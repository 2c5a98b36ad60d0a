#include "operator/controller/expectations.h"

#include <functional>
#include <string>
#include <vector>

namespace vf::controller {

void Expectations::ExpectCreation(const std::string& name, Clock::time_point now) {
  created_[name] = now;
}

int Expectations::Observe(const std::function<bool(const std::string&)>& in_cache,
                          Clock::time_point now) {
  int pending = 0;
  for (auto it = created_.begin(); it != created_.end();) {
    if (in_cache(it->first) || now - it->second > timeout_) {
      it = created_.erase(it);
    } else {
      ++pending;
      ++it;
    }
  }
  return pending;
}

std::vector<std::string> Expectations::Pending() const {
  std::vector<std::string> names;
  names.reserve(created_.size());
  for (const auto& [name, when] : created_) names.push_back(name);
  return names;
}

}  // namespace vf::controller
