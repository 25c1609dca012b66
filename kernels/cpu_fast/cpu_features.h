// Which vector code paths FastCpuSampler may take on this CPU. The AVX2 paths are compiled with
// GCC's target attribute (the build itself targets baseline x86-64) and chosen at run time; they
// compute bit for bit what the scalar paths compute (integer ops, and fp32 / double ops in the
// same order, with no FMA contraction: "avx2" alone does not enable FMA). Internal to
// kernels/cpu_fast.
#ifndef SAMPLERD_KERNELS_CPU_FAST_CPU_FEATURES_H_
#define SAMPLERD_KERNELS_CPU_FAST_CPU_FEATURES_H_

#include <atomic>

#if defined(__x86_64__) && defined(__GNUC__)
#define SAMPLERD_CPU_FAST_X86 1
#define SAMPLERD_AVX2 __attribute__((target("avx2")))
// AVX2 with FMA, for code that fuses its multiply-adds explicitly (intrinsics) and nowhere else.
#define SAMPLERD_AVX2_FMA __attribute__((target("avx2,fma"), optimize("fp-contract=off")))
// AVX-512 F enables FMA, and GCC contracts a * b + c into one even in ISO mode: fp-contract=off
// keeps these paths rounding as the scalar ones do (the tests compare them bit for bit).
#define SAMPLERD_AVX512 \
  __attribute__((target("avx2,avx512f,avx512dq"), optimize("fp-contract=off")))
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wuninitialized reports
// wherever they are inlined (a known false positive): silenced for the AVX-512 code.
#define SAMPLERD_AVX512_WARNINGS_OFF                                                   \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define SAMPLERD_AVX512_WARNINGS_ON _Pragma("GCC diagnostic pop")
#else
#define SAMPLERD_CPU_FAST_X86 0
#endif

namespace samplerd::kernels::cpu_fast_internal {

// Tests clear it to drive the scalar paths on an AVX2 / AVX-512 machine.
inline std::atomic<bool>& Avx2Allowed() {
  static std::atomic<bool> allowed{true};
  return allowed;
}

// True when the AVX2 paths run: the CPU has AVX2 and Avx2Allowed().
inline bool UseAvx2() {
#if SAMPLERD_CPU_FAST_X86
  static const bool supported = __builtin_cpu_supports("avx2");
  return supported && Avx2Allowed().load(std::memory_order_relaxed);
#else
  return false;
#endif
}

// True when the AVX2 paths run and the CPU has FMA (SAMPLERD_AVX2_FMA code: the chunked draw's
// float masses; without FMA they take the scalar path).
inline bool UseAvx2Fma() {
#if SAMPLERD_CPU_FAST_X86
  static const bool supported = __builtin_cpu_supports("fma");
  return supported && UseAvx2();
#else
  return false;
#endif
}

// Tests clear it to drive the AVX2 paths on an AVX-512 machine.
inline std::atomic<bool>& Avx512Allowed() {
  static std::atomic<bool> allowed{true};
  return allowed;
}

// True when the AVX-512 (F + DQ) paths run: the CPU has them, Avx2Allowed() and
// Avx512Allowed().
inline bool UseAvx512() {
#if SAMPLERD_CPU_FAST_X86
  static const bool supported = __builtin_cpu_supports("avx2") &&
                                __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("avx512dq");
  return supported && Avx2Allowed().load(std::memory_order_relaxed) &&
         Avx512Allowed().load(std::memory_order_relaxed);
#else
  return false;
#endif
}

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_CPU_FEATURES_H_
