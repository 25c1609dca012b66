// GpuIpc over the GPU runtime (kernels/gpu/runtime.h): what the region registry uses to open
// IPC memory and event handles when the build has a GPU backend (SAMPLERD_HAVE_GPU).
#ifndef SAMPLERD_SERVICE_CORE_REGIONS_GPU_IPC_RUNTIME_H_
#define SAMPLERD_SERVICE_CORE_REGIONS_GPU_IPC_RUNTIME_H_

#include <memory>

#include "service/core/regions/gpu_ipc.h"

namespace samplerd::core {

// Every call makes device `ordinal` current on the calling thread first. Never fails to
// construct: without a driver or device each call fails with FAILED_PRECONDITION.
//
// OpenMemory opens the handle (peer access enabled lazily), then asks the runtime for the
// allocation's real range and returns its base and size (the part from the opened pointer on,
// should the runtime ever map an interior pointer). Errors: INVALID_ARGUMENT when the runtime
// rejects the handle (stale or freed allocation, a handle from this very process, not a handle
// at all); FAILED_PRECONDITION for states of the runtime or device (no driver, peer access,
// out of memory) and when the range cannot be queried (the mapping is closed again). Messages
// name the runtime's error, never the handle.
//
// CloseMemory first waits for all work on the device (DeviceSynchronize), so that no kernel
// launched on an earlier request (a "done"-event request returns before its kernels ran) still
// reads the mapping; it is called off the request path. Runtime errors are ignored.
//
// OpenEvent / CloseEvent: IPC events, same error mapping. Destroying an event that pending work
// still waits on or records is safe (the runtime defers the release).
//
// Thread-safe: the runtime calls are; the object holds no mutable state.
std::unique_ptr<GpuIpc> MakeRuntimeGpuIpc();

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_REGIONS_GPU_IPC_RUNTIME_H_
