// Matching a request's `device` field against the device a backend samples on.
//
// Devices are named by PCI bus id or UUID, never by ordinal (ordinals differ between containers
// and visibility settings; docs/DESIGN.md "Device matching").
#ifndef SAMPLERD_SERVICE_CORE_BACKEND_DEVICE_MATCH_H_
#define SAMPLERD_SERVICE_CORE_BACKEND_DEVICE_MATCH_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "service/core/backend/sampler.h"

namespace samplerd::core {

// Returns OK when `requested` is empty (any device) or names `device`:
// - a GPU by its PCI bus id, compared as numbers ("0000:00:06.0" == "00000000:00:06.0", the form
//   nvidia-smi prints), or by its UUID, with or without the "GPU-" prefix; case-insensitive;
// - the CPU backend's device (uuid "cpu") by "cpu".
// Otherwise FAILED_PRECONDITION "expected device <ours>, got <requested>" (the requested name
// is shortened when it is long).
absl::Status MatchDevice(absl::string_view requested, const DeviceInfo& device);

// The index in `devices` of the device `spec` names, as MatchDevice matches (PCI bus id or UUID);
// an empty spec names the first. INVALID_ARGUMENT "expected --gpu to name one of ..., got ..."
// (listing the devices) when none or more than one matches, or `devices` is empty.
absl::StatusOr<size_t> SelectDevice(absl::string_view spec, const std::vector<DeviceInfo>& devices);

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_BACKEND_DEVICE_MATCH_H_
