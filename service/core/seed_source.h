// Server-chosen seeds for rows that come without one.
#ifndef SAMPLERD_SERVICE_CORE_SEED_SOURCE_H_
#define SAMPLERD_SERVICE_CORE_SEED_SOURCE_H_

#include <atomic>
#include <cstdint>

namespace samplerd::core {

// Hands out distinct, well-mixed 64-bit seeds (splitmix64 over an atomic counter that starts
// at a random point). Thread-safe and lock-free.
class SeedSource {
 public:
  // `start` fixes the sequence (tests); the server passes a random value.
  explicit SeedSource(uint64_t start) : state_(start) {}

  uint64_t Next() {
    uint64_t z =
        state_.fetch_add(0x9E3779B97F4A7C15ull, std::memory_order_relaxed) + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  std::atomic<uint64_t> state_;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_SEED_SOURCE_H_
