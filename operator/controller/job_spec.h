// The typed job of a VirtualFlowJob custom resource: its spec parsed once, by the parser that
// `vf run` and the agents use (runtime/job/spec.h), straight from the API server's JSON. The
// controller reads no spec field by hand, so every default stays where spec.h states it.
#pragma once

#include <nlohmann/json.hpp>

#include "runtime/job/spec.h"
#include "runtime/status.h"

namespace YAML {
class Node;
}  // namespace YAML

namespace vf::controller {

// The JSON value as the YAML tree a file with the same content loads to: objects become maps,
// arrays sequences, numbers and booleans plain scalars, null a null node, and strings scalars
// tagged !!str, so that "8" stays text (as a quoted scalar in a file does).
YAML::Node JsonToYaml(const nlohmann::json& value);

// The job's spec, or the parser's one-line error naming the field, prefixed with the job's key
// ("team/mnist: spec.globalBatchSize (250) must be divisible by ...").
Result<JobSpec> JobSpecOf(const nlohmann::json& job);

}  // namespace vf::controller
