#include "service/core/backend/guarded_copy.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace samplerd::core {
namespace {

// The copy in progress on this thread, if any (static TLS of the executable: safe to read in a
// signal handler). Volatile, and fenced below: to the compiler, memcpy cannot observe it, and
// the store before the copy would otherwise be dropped as dead.
thread_local sigjmp_buf* volatile t_copy = nullptr;
struct sigaction g_previous;

void OnSigbus(int /*signal*/, siginfo_t* /*info*/, void* /*context*/) {
  if (t_copy != nullptr) siglongjmp(*t_copy, 1);
  // Not a guarded copy: give SIGBUS back to whoever had it. Returning re-runs the faulting
  // instruction, which faults again under that disposition.
  sigaction(SIGBUS, &g_previous, nullptr);
}

void InstallHandler() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_sigaction = OnSigbus;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  sigaction(SIGBUS, &action, &g_previous);
}

// After a jump out of OnSigbus: SIGBUS is still blocked, as the kernel blocks it while its
// handler runs, and a fault while it is blocked would kill the process. The jump points save no
// signal mask (sigsetjmp(jump, 0)): saving it costs a system call, ~150 ns on every guarded call
// (each of the host plane's sampler tasks), where unblocking here costs one only after a fault.
void UnblockSigbus() {
  sigset_t bus;
  sigemptyset(&bus);
  sigaddset(&bus, SIGBUS);
  pthread_sigmask(SIG_UNBLOCK, &bus, nullptr);
}

// Installs the handler once per process (GuardedCopy and GuardedRun share it).
void EnsureHandler() {
  static std::once_flag installed;
  std::call_once(installed, InstallHandler);
}

}  // namespace

bool GuardedCopy(void* dst, const void* src, size_t bytes) {
  EnsureHandler();
  sigjmp_buf jump;
  if (sigsetjmp(jump, 0) != 0) {
    t_copy = nullptr;
    UnblockSigbus();
    return false;
  }
  t_copy = &jump;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, bytes);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_copy = nullptr;
  return true;
}

bool GuardedRun(const std::function<void()>& fn) {
  EnsureHandler();
  sigjmp_buf* const outer = t_copy;
  sigjmp_buf jump;
  if (sigsetjmp(jump, 0) != 0) {
    t_copy = outer;
    UnblockSigbus();
    return false;
  }
  t_copy = &jump;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  fn();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_copy = outer;
  return true;
}

absl::Status ShrunkShmError(absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(
      "expected the host shm object behind ", what,
      " to cover the region, got a bus error accessing it: the object was truncated after "
      "RegisterRegion; unregister the region and register the object again"));
}

}  // namespace samplerd::core
