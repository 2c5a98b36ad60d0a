// Fuzz target: the coordinator's request bodies. Every body a client can send (register,
// report, ack, leave, failure; the agent reads plans the same way) goes through ParseObject and
// the field readers; any bytes must give a message or a one-line error, never a crash, an
// uncaught exception or unbounded recursion.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "agent/protocol/json.h"

namespace {

// The readers of each request and reply shape, as the server and client use them.
void ReadEveryShape(const nlohmann::json& object) {
  namespace p = vf::protocol;
  (void)p::StringField(object, "worker");
  (void)p::StringField(object, "fingerprint");
  (void)p::StringField(object, "build");
  (void)p::StringField(object, "message");
  (void)p::IntField(object, "epoch");
  (void)p::IntField(object, "step");
  (void)p::BoolField(object, "ready");
  (void)p::NumberField(object, "loss");
  vf::Result<vf::Plan> plan = p::PlanFromJson(object);
  if (plan.ok()) {
    // A plan that was read writes back to JSON that reads to the same plan.
    vf::Result<vf::Plan> again = p::PlanFromJson(p::PlanToJson(*plan));
    if (!again.ok()) __builtin_trap();
  }
  vf::Result<vf::Report> report = p::ReportFromJson(object);
  if (report.ok()) {
    if (!p::ReportFromJson(p::ReportToJson(*report)).ok()) __builtin_trap();
  }
  (void)p::Dump(object);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  vf::Result<nlohmann::json> object = vf::protocol::ParseObject(body);
  if (object.ok()) ReadEveryShape(*object);
  return 0;
}
