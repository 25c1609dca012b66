// Matching a request's `device` field against the device a backend samples on.
//
// Devices are named by PCI bus id or UUID, never by ordinal (ordinals differ between containers
// and visibility settings; shared/DESIGN.md "Device matching").
#ifndef SAMPLERD_SERVICE_CORE_DEVICE_MATCH_H_
#define SAMPLERD_SERVICE_CORE_DEVICE_MATCH_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "service/core/sampler.h"

namespace samplerd::core {

// Returns OK when `requested` is empty (any device) or names `device`:
// - a GPU by its PCI bus id, compared as numbers ("0000:00:06.0" == "00000000:00:06.0", the form
//   nvidia-smi prints), or by its UUID, with or without the "GPU-" prefix; case-insensitive;
// - the CPU backend's device (uuid "cpu") by "cpu".
// Otherwise FAILED_PRECONDITION "expected device <ours>, got <requested>" (the requested name
// is shortened when it is long).
absl::Status MatchDevice(absl::string_view requested, const DeviceInfo& device);

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_DEVICE_MATCH_H_
