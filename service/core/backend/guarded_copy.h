// Copies out of (or into) memory another process may shrink under us: host shm regions.
//
// A client can ftruncate its shm object below a registered region at any time; touching a page
// past the object's new end raises SIGBUS, which would kill the server. GuardedCopy turns that
// into a return value: a process-wide SIGBUS handler (installed on first use) jumps back to the
// copy that faulted, on the thread that faulted. A SIGBUS anywhere else is passed on to the
// disposition that was there before (by default: the process dies with a core dump).
#ifndef SAMPLERD_SERVICE_CORE_BACKEND_GUARDED_COPY_H_
#define SAMPLERD_SERVICE_CORE_BACKEND_GUARDED_COPY_H_

#include <cstddef>
#include <functional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace samplerd::core {

// memcpy(dst, src, bytes); false when it hit a bus error (dst then holds a partial copy).
// Thread-safe; costs a sigsetjmp that saves no signal mask (a few ns) on top of the copy.
bool GuardedCopy(void* dst, const void* src, size_t bytes);

// Runs fn(); false when it hit a bus error, in which case fn was abandoned where it faulted (no
// destructors ran past that point: fn must not hold locks or own resources while it touches
// guarded memory). Thread-safe; nests (an inner GuardedRun or task guard restores the outer one).
bool GuardedRun(const std::function<void()>& fn);

// FAILED_PRECONDITION saying that the host shm object behind `what` ("the logits region", "the
// output region") no longer covers it, and what to do.
absl::Status ShrunkShmError(absl::string_view what);

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_BACKEND_GUARDED_COPY_H_
