// Helpers shared by the device backends' tests. Header-only; tests only.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace vf::testing_util {

// `n` floats drawn uniformly from [lo, hi) with `seed`.
inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Equal bit patterns (NaNs and signed zeros included), not merely equal values.
inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace vf::testing_util
