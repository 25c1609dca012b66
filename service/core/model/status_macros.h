// RETURN_IF_ERROR / ASSIGN_OR_RETURN for absl::Status: Debian's Abseil 20220623 has none.
#ifndef SAMPLERD_SERVICE_CORE_MODEL_STATUS_MACROS_H_
#define SAMPLERD_SERVICE_CORE_MODEL_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SAMPLERD_CONCAT_INNER_(a, b) a##b
#define SAMPLERD_CONCAT_(a, b) SAMPLERD_CONCAT_INNER_(a, b)

// Returns `expr`'s status from the enclosing function when it is not OK.
#define RETURN_IF_ERROR(expr)              \
  do {                                     \
    const ::absl::Status _status = (expr); \
    if (!_status.ok()) return _status;     \
  } while (false)

// `lhs = *expr` when `expr` (an absl::StatusOr) is OK, else returns its status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(SAMPLERD_CONCAT_(_status_or_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(*tmp)

#endif  // SAMPLERD_SERVICE_CORE_MODEL_STATUS_MACROS_H_
