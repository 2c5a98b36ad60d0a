#include "operator/kube/resource.h"

namespace vf::kube {

std::string Resource::ApiVersion() const {
  if (group.empty()) return std::string(version);
  return std::string(group) + "/" + std::string(version);
}

std::string Resource::Name() const {
  if (group.empty()) return std::string(resource);
  return std::string(resource) + "." + std::string(group);
}

std::string UrlEncode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    const bool unreserved = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                            (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved) {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 0xF];
    }
  }
  return out;
}

std::string ResourcePath(const Resource& resource, std::string_view ns, std::string_view name,
                         std::string_view subresource) {
  std::string path =
      resource.group.empty() ? "/api/" : "/apis/" + std::string(resource.group) + "/";
  path += resource.version;
  if (resource.namespaced && !ns.empty()) path += "/namespaces/" + UrlEncode(ns);
  path += "/";
  path += resource.resource;
  if (!name.empty()) {
    path += "/" + UrlEncode(name);
    if (!subresource.empty()) path += "/" + std::string(subresource);
  }
  return path;
}

std::string Describe(const Resource& resource, std::string_view ns, std::string_view name) {
  std::string text = resource.Name();
  const bool has_ns = resource.namespaced && !ns.empty();
  if (!name.empty()) {
    text += " ";
    if (has_ns) text += std::string(ns) + "/";
    text += name;
  } else if (resource.namespaced) {
    text += has_ns ? " in " + std::string(ns) : " in all namespaces";
  }
  return text;
}

}  // namespace vf::kube
