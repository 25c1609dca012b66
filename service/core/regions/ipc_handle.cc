#include "service/core/regions/ipc_handle.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace samplerd::core {
namespace {

IpcHandle Copy(absl::string_view bytes) {
  IpcHandle handle;
  std::copy(bytes.begin(), bytes.end(), handle.begin());
  return handle;
}

}  // namespace

absl::StatusOr<IpcHandle> ParseIpcMemoryHandle(absl::string_view bytes) {
  // A raw handle is opaque: its second byte may be anything, 'e' included.
  if (bytes.size() == kIpcHandleBytes) return Copy(bytes);
  if (bytes.size() >= 2 && bytes[1] == kPyTorchExpandableSegment) {
    return absl::FailedPreconditionError(
        "expected a cudaMalloc allocation's IPC handle, got PyTorch's expandable-segments form, "
        "which samplerd cannot open: unset PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in "
        "the engine, or copy the logits into a regular allocation (e.g. one made with the "
        "caching allocator's expandable segments off) and share that");
  }
  if (bytes.size() == kPyTorchHandleBytes) {
    if (bytes[1] == kPyTorchCudaMalloc) return Copy(bytes.substr(2));
    return absl::InvalidArgumentError(
        "expected a 64-byte IPC memory handle, or PyTorch's 66-byte form whose second byte is "
        "'c', got 66 bytes of another form");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected a 64-byte IPC memory handle (or PyTorch's 66-byte form), got ",
                   bytes.size(), " bytes"));
}

absl::StatusOr<IpcHandle> ParseIpcEventHandle(absl::string_view bytes, absl::string_view field) {
  if (bytes.size() != kIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("expected a 64-byte IPC event handle in ", field,
                                                   ", got ", bytes.size(), " bytes"));
  }
  return Copy(bytes);
}

}  // namespace samplerd::core
