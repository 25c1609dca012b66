#include "service/core/regions/request_io.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/core/backend/guarded_copy.h"
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

// A lease on `bytes` at `ref` aligned to 4 (`what`: the 4-byte items), in host shm or in GPU
// IPC memory of the sampler's device.
absl::StatusOr<RegionLease> LeaseAligned(const RegionRegistry& regions, const RegionRef& ref,
                                         uint64_t bytes, const Sampler& sampler,
                                         const std::vector<DeviceInfo>& devices,
                                         absl::string_view field, absl::string_view what) {
  ASSIGN_OR_RETURN(RegionLease lease, Lease(regions, ref, bytes, field));
  const RegionView& view = lease.view();
  if (reinterpret_cast<uintptr_t>(view.data) % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected a slice aligned to 4 bytes (", what, "), got one at ",
                     reinterpret_cast<uintptr_t>(view.data) % 4,
                     " bytes past a multiple of 4 (offset ", ref.offset, ")"));
  }
  if (view.kind == RegionKind::kGpuIpc) {
    RETURN_IF_ERROR(CheckOnSamplerDevice(view, sampler, devices, field));
  }
  return lease;
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
  ASSIGN_OR_RETURN(bound->bitmask, LeaseAligned(regions, *mask.region, bytes, sampler, devices,
                                                "token_bitmask.region", "int32 words"));
  const RegionView& view = bound->bitmask.view();
  bound->io.bitmask = view.data;
  bound->io.bitmask_on_device = view.kind == RegionKind::kGpuIpc;
  bound->io.bitmask_in_shm = view.kind == RegionKind::kHostShm;
  return absl::OkStatus();
}

// What reading one packed list needs besides the list.
struct ListSource {
  int64_t batch = 0;
  int64_t vocab = 0;
  int64_t max_list_bytes = 0;  // Limits::max_region_list_bytes
  const Sampler* sampler = nullptr;
  const RegionRegistry* regions = nullptr;
  GpuIpc* ipc = nullptr;
  const std::vector<DeviceInfo>* devices = nullptr;
  void* ready_event = nullptr;
};

// Copies `bytes` from `from` bytes into a leased slice to `dst`.
absl::Status CopyOut(const RegionView& view, uint64_t from, uint64_t bytes, const ListSource& src,
                     absl::string_view field, void* dst) {
  if (bytes == 0) return absl::OkStatus();
  if (view.kind == RegionKind::kHostShm) {
    if (GuardedCopy(dst, view.data + from, bytes)) return absl::OkStatus();
    return ShrunkShmError(absl::StrCat("the ", field, " slice"));
  }
  if (src.ipc == nullptr) {  // a GPU IPC region is only registered with a GpuIpc
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": expected a server with GPU IPC, got none"));
  }
  absl::Status copied =
      src.ipc->CopyToHost(view.device_ordinal, src.ready_event, view.data + from, dst, bytes);
  if (!copied.ok()) return Annotate(copied, field);
  return absl::OkStatus();
}

// Reads the packed list at `ref`: B + 1 uint32 row offsets, then N = row_offsets[B] entries of
// `entry_bytes` (all columns together; `layout` spells the size for messages). `bytes` gets the
// whole slice, `lease` its lease.
absl::Status ReadPacked(const RegionRef& ref, uint64_t entry_bytes, absl::string_view layout,
                        const ListSource& src, absl::string_view field, RegionLease* lease,
                        std::vector<uint8_t>* bytes) {
  const uint64_t head = static_cast<uint64_t>(src.batch + 1) * 4;
  absl::StatusOr<RegionLease> head_lease =
      LeaseAligned(*src.regions, ref, head, *src.sampler, *src.devices, field, "uint32 offsets");
  if (!head_lease.ok()) {
    if (!absl::IsOutOfRange(head_lease.status())) return head_lease.status();
    return absl::OutOfRangeError(
        absl::StrCat(head_lease.status().message(),
                     " (row_offsets: (B + 1) * 4 bytes for B = ", src.batch, ")"));
  }
  uint32_t n = 0;
  RETURN_IF_ERROR(CopyOut(head_lease->view(), head - 4, 4, src, field, &n));
  const uint64_t max_n = static_cast<uint64_t>(src.batch) * static_cast<uint64_t>(src.vocab);
  if (n > max_n) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected N = row_offsets[B] <= B * V = ", max_n,
                     " (no row holds a token twice), got ", n));
  }
  const uint64_t total = head + n * entry_bytes;
  if (total > static_cast<uint64_t>(src.max_list_bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, ": expected a list of at most ", src.max_list_bytes,
        " bytes (--max_message_bytes, as an inline list), got ", total, " bytes (B = ", src.batch,
        ", N = row_offsets[B] = ", n, ": ", layout, " bytes)"));
  }
  absl::StatusOr<RegionLease> full =
      LeaseAligned(*src.regions, ref, total, *src.sampler, *src.devices, field, "uint32 offsets");
  if (!full.ok()) {
    if (!absl::IsOutOfRange(full.status())) return full.status();
    return absl::OutOfRangeError(absl::StrCat(full.status().message(), " (B = ", src.batch,
                                              ", N = row_offsets[B] = ", n, ": ", layout,
                                              " bytes)"));
  }
  bytes->resize(total);
  RETURN_IF_ERROR(CopyOut(full->view(), 0, total, src, field, bytes->data()));
  *lease = *std::move(full);
  return absl::OkStatus();
}

// Sets *out to `count` little-endian values of T from `bytes` at *at, advancing *at.
template <typename T>
void Unpack(const std::vector<uint8_t>& bytes, size_t count, size_t* at, std::vector<T>* out) {
  out->resize(count);
  if (count > 0) std::memcpy(out->data(), bytes.data() + *at, count * sizeof(T));
  *at += count * sizeof(T);
}

absl::Status ReadBias(const ListSource& src, LogitBiasSpec* bias, BoundIo* bound) {
  std::vector<uint8_t> bytes;
  RETURN_IF_ERROR(ReadPacked(*bias->region, 8, "(B + 1 + 2N) * 4", src, "logit_bias.region",
                             &bound->logit_bias, &bytes));
  const size_t n = (bytes.size() - (src.batch + 1) * 4) / 8;
  size_t at = 0;
  Unpack(bytes, src.batch + 1, &at, &bias->row_offsets);
  Unpack(bytes, n, &at, &bias->token_ids);
  Unpack(bytes, n, &at, &bias->biases);
  bias->region_read = true;
  return absl::OkStatus();
}

absl::Status ReadHistory(const ListSource& src, TokenHistorySpec* history, BoundIo* bound) {
  std::vector<uint8_t> bytes;
  RETURN_IF_ERROR(ReadPacked(*history->region, 9, "(B + 1 + 2N) * 4 + N", src,
                             "token_history.region", &bound->token_history, &bytes));
  const size_t n = (bytes.size() - (src.batch + 1) * 4) / 9;
  size_t at = 0;
  Unpack(bytes, src.batch + 1, &at, &history->row_offsets);
  Unpack(bytes, n, &at, &history->token_ids);
  Unpack(bytes, n, &at, &history->output_counts);
  Unpack(bytes, n, &at, &history->in_prompt);
  history->region_read = true;
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

absl::Status ReadProcessorLists(int64_t batch, int64_t vocab, int64_t max_list_bytes,
                                const Sampler& sampler, const RegionRegistry& regions, GpuIpc* ipc,
                                const std::vector<DeviceInfo>& devices, SampleRequest* request,
                                BoundIo* bound) {
  const ListSource src{batch,    vocab, max_list_bytes, &sampler,
                       &regions, ipc,   &devices,       bound->io.ready_event};
  if (request->logit_bias.has_value() && request->logit_bias->region.has_value() &&
      !request->logit_bias->region_read) {
    RETURN_IF_ERROR(ReadBias(src, &*request->logit_bias, bound));
  }
  if (request->token_history.has_value() && request->token_history->region.has_value() &&
      !request->token_history->region_read) {
    RETURN_IF_ERROR(ReadHistory(src, &*request->token_history, bound));
  }
  return absl::OkStatus();
}

}  // namespace samplerd::core
