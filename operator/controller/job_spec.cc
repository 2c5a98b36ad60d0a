#include "operator/controller/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <string>

#include "operator/controller/worker_pod.h"
#include "operator/policy/policy.h"

namespace vf::controller {

using nlohmann::json;

YAML::Node JsonToYaml(const json& value) {
  switch (value.type()) {
    case json::value_t::object: {
      YAML::Node map(YAML::NodeType::Map);
      for (const auto& [key, item] : value.items()) map[key] = JsonToYaml(item);
      return map;
    }
    case json::value_t::array: {
      YAML::Node list(YAML::NodeType::Sequence);
      for (const json& item : value) list.push_back(JsonToYaml(item));
      return list;
    }
    case json::value_t::string: {
      YAML::Node text(value.get<std::string>());
      text.SetTag("tag:yaml.org,2002:str");
      return text;
    }
    case json::value_t::boolean:
      return YAML::Node(value.get<bool>() ? "true" : "false");
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      // JSON's own spelling: integers as digits, floats in the shortest form that round-trips.
      return YAML::Node(value.dump());
    case json::value_t::null:
    case json::value_t::discarded:
    case json::value_t::binary:
      break;
  }
  return YAML::Node(YAML::NodeType::Null);
}

Result<JobSpec> JobSpecOf(const json& job) {
  const json& meta = job.at("metadata");
  const std::string key = meta.value("namespace", "") + "/" + meta.value("name", "");
  VF_ASSIGN_OR_RETURN(JobSpec spec, ParseJobNode(JsonToYaml(AgentManifest(job)), key));
  // The policy is the registry's to know (the CRD's enum says the same to the API server).
  VF_RETURN_IF_ERROR(
      policy::CheckPolicyName("spec.elasticity.policy", spec.elasticity.policy).WithContext(key));
  return spec;
}

}  // namespace vf::controller
