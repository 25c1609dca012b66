// Parsing of the IPC handles clients send: GPU memory handles (raw, or PyTorch's shareable form)
// and event handles. Messages give lengths, never the bytes.
#ifndef SAMPLERD_SERVICE_CORE_REGIONS_IPC_HANDLE_H_
#define SAMPLERD_SERVICE_CORE_REGIONS_IPC_HANDLE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "service/core/regions/gpu_ipc.h"

namespace samplerd::core {

// PyTorch's shareable form of a memory handle (torch.UntypedStorage._share_cuda_()): a version
// byte, a kind byte, then the payload. Kind 'c' (cudaMalloc) carries one 64-byte handle.
inline constexpr size_t kPyTorchHandleBytes = 2 + kIpcHandleBytes;
inline constexpr char kPyTorchCudaMalloc = 'c';
inline constexpr char kPyTorchExpandableSegment = 'e';

// Reads a memory handle: exactly 64 bytes (raw), or 66 bytes whose second byte is 'c' (PyTorch).
// Errors: FAILED_PRECONDITION for PyTorch's expandable-segments form (second byte 'e', any
// length other than 64), with how to avoid it; INVALID_ARGUMENT for any other length or form.
absl::StatusOr<IpcHandle> ParseIpcMemoryHandle(absl::string_view bytes);

// Reads an event handle of exactly 64 bytes; `field` names it in the INVALID_ARGUMENT message.
absl::StatusOr<IpcHandle> ParseIpcEventHandle(absl::string_view bytes, absl::string_view field);

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_REGIONS_IPC_HANDLE_H_
