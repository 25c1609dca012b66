#include "service/core/regions/request_io.h"

#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/core/model/status_macros.h"
#include "service/core/regions/ipc_handle.h"

namespace samplerd::core {
namespace {

absl::Status Annotate(const absl::Status& status, absl::string_view field) {
  return absl::Status(status.code(), absl::StrCat(field, ": ", status.message()));
}

// "0000:3b:00.0" for the device with `ordinal`, as GetServerInfo lists it.
std::string DescribeOrdinal(int ordinal, const std::vector<DeviceInfo>& devices) {
  for (const DeviceInfo& d : devices) {
    if (d.ordinal == ordinal && !d.pci_bus_id.empty()) return d.pci_bus_id;
  }
  return absl::StrCat("with server ordinal ", ordinal);
}

// A GPU IPC region must be on the device the backend samples on.
absl::Status CheckOnSamplerDevice(const RegionView& view, const Sampler& sampler,
                                  const std::vector<DeviceInfo>& devices, absl::string_view field) {
  if (sampler.kind() != BackendKind::kGpu) {
    return absl::FailedPreconditionError(absl::StrCat(
        "expected ", field, " in host memory (this server samples on the CPU), got GPU memory"));
  }
  if (view.device_ordinal != sampler.device().ordinal) {
    return absl::FailedPreconditionError(
        absl::StrCat("expected ", field, " on device ", sampler.device().pci_bus_id,
                     " (the device this server samples on), got a region on device ",
                     DescribeOrdinal(view.device_ordinal, devices)));
  }
  return absl::OkStatus();
}

absl::StatusOr<RegionLease> Lease(const RegionRegistry& regions, const RegionRef& ref,
                                  uint64_t bytes, absl::string_view field) {
  absl::StatusOr<RegionLease> lease = regions.Acquire(ref.region, ref.offset, bytes);
  if (!lease.ok()) return Annotate(lease.status(), field);
  return lease;
}

absl::Status BindEvents(const SampleRequest& request, const Sampler& sampler, IpcEventCache* events,
                        BoundIo* bound) {
  const DeviceInfo& device = sampler.device();
  if (sampler.kind() != BackendKind::kGpu || events == nullptr || !device.ipc_events) {
    return absl::FailedPreconditionError(
        "expected a server with IPC events (GetServerInfo: devices[].ipc_events) for "
        "ready_event or done_event, got one without (a CPU backend, or a GPU runtime without "
        "IPC events)");
  }
  if (!request.ready_event.empty()) {
    if (!bound->io.logits_on_device) {
      return absl::InvalidArgumentError(
          "expected ready_event only with logits in a GPU IPC region, got it with host logits");
    }
    ASSIGN_OR_RETURN(const IpcHandle handle,
                     ParseIpcEventHandle(request.ready_event, "ready_event"));
    ASSIGN_OR_RETURN(bound->io.ready_event, events->Get(device.ordinal, handle));
  }
  if (!request.done_event.empty()) {
    if (!bound->io.output_on_device) {
      return absl::InvalidArgumentError(
          "expected done_event only with an output region in GPU IPC memory, got a host output");
    }
    ASSIGN_OR_RETURN(const IpcHandle handle, ParseIpcEventHandle(request.done_event, "done_event"));
    ASSIGN_OR_RETURN(bound->io.done_event, events->Get(device.ordinal, handle));
  }
  return absl::OkStatus();
}

// The allowed-token bitmask: inline words, or a region slice of B * bitmask_words * 4 bytes,
// aligned to 4, in host shm or GPU IPC memory of the sampler's device.
absl::Status BindBitmask(const SampleRequest& request, const ValidatedBatch& batch,
                         const Sampler& sampler, const RegionRegistry& regions,
                         const std::vector<DeviceInfo>& devices, BoundIo* bound) {
  const TokenBitmaskSpec& mask = *request.token_bitmask;
  if (!mask.region.has_value()) {
    bound->io.bitmask = mask.inline_words.data();
    return absl::OkStatus();
  }
  const uint64_t bytes = static_cast<uint64_t>(batch.batch * batch.bitmask_words) * 4;
  ASSIGN_OR_RETURN(bound->bitmask, Lease(regions, *mask.region, bytes, "token_bitmask.region"));
  const RegionView& view = bound->bitmask.view();
  if (reinterpret_cast<uintptr_t>(view.data) % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token_bitmask.region: expected a slice aligned to 4 bytes (int32 words), got one at ",
        reinterpret_cast<uintptr_t>(view.data) % 4, " bytes past a multiple of 4 (offset ",
        mask.region->offset, ")"));
  }
  if (view.kind == RegionKind::kGpuIpc) {
    RETURN_IF_ERROR(CheckOnSamplerDevice(view, sampler, devices, "token_bitmask.region"));
    bound->io.bitmask_on_device = true;
  }
  bound->io.bitmask = view.data;
  bound->io.bitmask_in_shm = view.kind == RegionKind::kHostShm;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BoundIo> BindSampleIo(const SampleRequest& request, const ValidatedBatch& batch,
                                     const Sampler& sampler, const RegionRegistry& regions,
                                     IpcEventCache* events,
                                     const std::vector<DeviceInfo>& devices) {
  BoundIo bound;
  if (request.logits_region.has_value()) {
    const uint64_t bytes =
        static_cast<uint64_t>(InlineBytes(batch.dtype, batch.batch, batch.vocab, batch.row_stride));
    ASSIGN_OR_RETURN(bound.logits, Lease(regions, *request.logits_region, bytes, "logits.region"));
    const RegionView& view = bound.logits.view();
    if (view.kind == RegionKind::kGpuIpc) {
      RETURN_IF_ERROR(CheckOnSamplerDevice(view, sampler, devices, "logits.region"));
      bound.io.logits_on_device = true;
    }
    bound.io.logits = view.data;
    bound.io.logits_in_shm = view.kind == RegionKind::kHostShm;
  } else {
    bound.io.logits = request.inline_data.data();
  }

  if (request.output.has_value()) {
    const uint64_t bytes = static_cast<uint64_t>(batch.batch) * sizeof(int32_t);
    ASSIGN_OR_RETURN(bound.output, Lease(regions, *request.output, bytes, "output"));
    const RegionView& view = bound.output.view();
    const bool on_device = view.kind == RegionKind::kGpuIpc;
    if (on_device != bound.io.logits_on_device) {
      return absl::FailedPreconditionError(absl::StrCat(
          "expected the output region in the same memory as the logits (host shm with inline "
          "or host shm logits, GPU IPC with GPU IPC logits), got a ",
          on_device ? "GPU IPC" : "host shm", " output with ",
          bound.io.logits_on_device ? "GPU IPC" : "host", " logits"));
    }
    if (on_device) RETURN_IF_ERROR(CheckOnSamplerDevice(view, sampler, devices, "output"));
    if (!view.writable) {
      return absl::FailedPreconditionError(
          "expected a writable output region, got a shm object samplerd could only open "
          "read-only (give samplerd's user write permission on it)");
    }
    bound.io.output = view.data;
    bound.io.output_on_device = on_device;
  }

  if (request.token_bitmask.has_value()) {
    RETURN_IF_ERROR(BindBitmask(request, batch, sampler, regions, devices, &bound));
  }

  if (!request.ready_event.empty() || !request.done_event.empty()) {
    RETURN_IF_ERROR(BindEvents(request, sampler, events, &bound));
  }
  return bound;
}

}  // namespace samplerd::core
