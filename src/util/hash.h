#pragma once
// Fast non-cryptographic 64-bit hashing for content identity and corruption checks (the KV spool's
// block checksums and prefix chains, the model fingerprint). Four independent multiply-rotate lanes
// over 8-byte words keep several multiplies in flight, so a checksum runs at memory speed (~10 GB/s
// on one Zen 4 core) instead of the ~1 GB/s of a byte-at-a-time hash; the final mixing spreads every
// input bit over the result. Not for adversarial input: nothing here defends against crafted
// collisions, and nothing needs to (the spool directory is the server's own).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace promptly {

namespace hash_detail {
inline constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ULL, kP2 = 0xC2B2AE3D27D4EB4FULL, kP3 = 0x165667B19E3779F9ULL,
                               kP4 = 0x85EBCA77C2B2AE63ULL, kP5 = 0x27D4EB2F165667C5ULL;
inline std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline std::uint64_t round(std::uint64_t acc, std::uint64_t word) { return rotl(acc + word * kP2, 31) * kP1; }
inline std::uint64_t read64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
}  // namespace hash_detail

// Mixes a 64-bit value into a well-spread one (a bijection: distinct inputs stay distinct).
inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 33;
  x *= hash_detail::kP2;
  x ^= x >> 29;
  x *= hash_detail::kP3;
  x ^= x >> 32;
  return x;
}

inline std::uint64_t hash_bytes(const void* data, std::size_t n, std::uint64_t seed = 0) {
  using namespace hash_detail;
  const auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + n;
  std::uint64_t h;
  if (n >= 32) {
    std::uint64_t a = seed + kP1 + kP2, b = seed + kP2, c = seed, d = seed - kP1;
    for (; p + 32 <= end; p += 32) {
      a = round(a, read64(p));
      b = round(b, read64(p + 8));
      c = round(c, read64(p + 16));
      d = round(d, read64(p + 24));
    }
    h = rotl(a, 1) + rotl(b, 7) + rotl(c, 12) + rotl(d, 18);
    for (std::uint64_t lane : {a, b, c, d}) h = (h ^ round(0, lane)) * kP1 + kP4;
  } else {
    h = seed + kP5;
  }
  h += static_cast<std::uint64_t>(n);
  for (; p + 8 <= end; p += 8) h = rotl(h ^ round(0, read64(p)), 27) * kP1 + kP4;
  for (; p < end; ++p) h = rotl(h ^ (*p * kP5), 11) * kP1;
  return mix64(h);
}

inline std::uint64_t hash_string(std::string_view s, std::uint64_t seed = 0) { return hash_bytes(s.data(), s.size(), seed); }

// Combines a running hash with one more value (order matters).
inline std::uint64_t hash_combine(std::uint64_t h, std::uint64_t v) { return mix64(h ^ (v + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2))); }

}  // namespace promptly
