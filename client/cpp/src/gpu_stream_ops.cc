// GpuStreamOps: dlopen + dlsym of the CUDA driver API or the HIP runtime, with the few types
// and constants it needs declared here (their values are the documented ABI of cuda.h and
// hip_runtime_api.h), so that no GPU header is needed to build the client.
#include "gpu_stream_ops.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace samplerd::internal {
namespace {

// cuda.h
using CuResult = int;
using CuDevicePtr = unsigned long long;  // NOLINT(runtime/int): CUdeviceptr on 64-bit hosts
constexpr unsigned kCuStreamWaitValueEq = 0x1;
constexpr unsigned kCuStreamWriteValueDefault = 0x0;
constexpr unsigned kCuMemHostRegisterPortable = 0x01;
constexpr unsigned kCuMemHostRegisterDeviceMap = 0x02;
using CuInit = CuResult (*)(unsigned);
using CuWriteValue32 = CuResult (*)(void*, CuDevicePtr, uint32_t, unsigned);
using CuWaitValue32 = CuResult (*)(void*, CuDevicePtr, uint32_t, unsigned);
using CuHostRegister = CuResult (*)(void*, size_t, unsigned);
using CuHostUnregister = CuResult (*)(void*);
using CuHostDevicePointer = CuResult (*)(CuDevicePtr*, void*, unsigned);
using CuCtxGetCurrent = CuResult (*)(void**);
using CuGetErrorString = CuResult (*)(CuResult, const char**);

// hip_runtime_api.h
using HipError = int;
constexpr unsigned kHipStreamWaitValueEq = 0x1;
constexpr unsigned kHipHostRegisterPortable = 0x1;
constexpr unsigned kHipHostRegisterMapped = 0x2;
using HipWriteValue32 = HipError (*)(void*, void*, uint32_t, unsigned);
using HipWaitValue32 = HipError (*)(void*, void*, uint32_t, unsigned, uint32_t);
using HipHostRegister = HipError (*)(void*, size_t, unsigned);
using HipHostUnregister = HipError (*)(void*);
using HipHostDevicePointer = HipError (*)(void**, void*, unsigned);
using HipStreamCreate = HipError (*)(void**, unsigned);
using HipStreamSynchronize = HipError (*)(void*);
using HipStreamDestroy = HipError (*)(void*);
using HipGetErrorString = const char* (*)(HipError);

constexpr char kCudaLibrary[] = "libcuda.so.1";
constexpr char kHipLibrary[] = "libamdhip64.so";

template <typename F>
F As(void* symbol) {
  return reinterpret_cast<F>(symbol);
}

// Opens `name`, preferring a copy the process has loaded already. Null when absent.
void* OpenLibrary(const char* name, bool only_if_loaded) {
  void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (handle != nullptr || only_if_loaded) return handle;
  return dlopen(name, RTLD_NOW | RTLD_LOCAL);
}

}  // namespace

std::string GpuStreamOps::Resolve(GpuVendor vendor, GpuStreamOps* ops) {
  if (vendor == GpuVendor::kAuto) {
    // A library the engine already loaded decides; else whichever is installed, CUDA first.
    if (OpenLibrary(kCudaLibrary, true) != nullptr) return Resolve(GpuVendor::kCuda, ops);
    if (OpenLibrary(kHipLibrary, true) != nullptr) return Resolve(GpuVendor::kHip, ops);
    if (Resolve(GpuVendor::kCuda, ops).empty()) return "";
    std::string hip_error = Resolve(GpuVendor::kHip, ops);
    if (hip_error.empty()) return "";
    return "expected a GPU runtime (" + std::string(kCudaLibrary) + " or " + kHipLibrary +
           "), got neither: " + hip_error;
  }
  const bool cuda = vendor == GpuVendor::kCuda;
  const char* library_name = cuda ? kCudaLibrary : kHipLibrary;
  void* library = OpenLibrary(library_name, false);
  if (library == nullptr) {
    const char* reason = dlerror();
    return std::string("expected ") + library_name + " to load, got " +
           (reason != nullptr ? reason : "an unknown dlopen error");
  }
  struct Entry {
    void** slot;
    const char* cuda_name;
    const char* hip_name;
  };
  const Entry entries[] = {
      {&ops->write_value_, "cuStreamWriteValue32_v2", "hipStreamWriteValue32"},
      {&ops->wait_value_, "cuStreamWaitValue32_v2", "hipStreamWaitValue32"},
      {&ops->host_register_, "cuMemHostRegister_v2", "hipHostRegister"},
      {&ops->host_unregister_, "cuMemHostUnregister", "hipHostUnregister"},
      {&ops->host_device_pointer_, "cuMemHostGetDevicePointer_v2", "hipHostGetDevicePointer"},
      {&ops->get_context_, "cuCtxGetCurrent", "hipGetDevice"},
      {&ops->error_string_, "cuGetErrorString", "hipGetErrorString"},
  };
  for (const Entry& entry : entries) {
    const char* symbol = cuda ? entry.cuda_name : entry.hip_name;
    *entry.slot = dlsym(library, symbol);
    if (*entry.slot == nullptr) {
      dlclose(library);
      return std::string("expected ") + library_name + " to export " + symbol +
             ", got no such symbol (driver too old?)";
    }
  }
  if (cuda) {
    // Harmless when the engine's runtime initialised the driver already.
    void* init = dlsym(library, "cuInit");
    if (init == nullptr || As<CuInit>(init)(0) != 0) {
      dlclose(library);
      return "expected cuInit(0) to succeed, got an error (no usable NVIDIA GPU?)";
    }
  }
  ops->library_ = library;
  ops->vendor_ = vendor;
  return "";
}

const GpuStreamOps* GpuStreamOps::Get(GpuVendor vendor, std::string* error) {
  static std::mutex mutex;
  static GpuStreamOps* resolved = nullptr;  // never freed: the process may use it until exit
  std::lock_guard<std::mutex> lock(mutex);
  if (resolved == nullptr) {
    auto* ops = new GpuStreamOps();
    std::string reason = Resolve(vendor, ops);
    if (!reason.empty()) {
      delete ops;
      if (error != nullptr) *error = reason;
      return nullptr;
    }
    resolved = ops;
  }
  if (vendor != GpuVendor::kAuto && vendor != resolved->vendor_) {
    if (error != nullptr) {
      *error = std::string("expected one GPU runtime per process, got a request for ") +
               (vendor == GpuVendor::kCuda ? "CUDA" : "HIP") + " after " + resolved->name();
    }
    return nullptr;
  }
  return resolved;
}

namespace {

std::string CudaError(void* error_string, const char* call, CuResult code) {
  const char* text = nullptr;
  if (As<CuGetErrorString>(error_string)(code, &text) != 0 || text == nullptr) text = "unknown";
  return std::string("expected ") + call + " to succeed, got CUDA error " + std::to_string(code) +
         " (" + text + ")";
}

std::string HipErrorText(void* error_string, const char* call, HipError code) {
  const char* text = As<HipGetErrorString>(error_string)(code);
  return std::string("expected ") + call + " to succeed, got HIP error " + std::to_string(code) +
         " (" + (text != nullptr ? text : "unknown") + ")";
}

}  // namespace

#define SAMPLERD_CHECK_GPU(call_name, expression)                                                 \
  do {                                                                                            \
    const int samplerd_code = (expression);                                                       \
    if (samplerd_code != 0) {                                                                     \
      return vendor_ == GpuVendor::kCuda ? CudaError(error_string_, call_name, samplerd_code)     \
                                         : HipErrorText(error_string_, call_name, samplerd_code); \
    }                                                                                             \
  } while (false)

std::string GpuStreamOps::WriteValue32(void* stream, uint64_t address, uint32_t value) const {
  if (vendor_ == GpuVendor::kCuda) {
    SAMPLERD_CHECK_GPU(
        "cuStreamWriteValue32",
        As<CuWriteValue32>(write_value_)(stream, address, value, kCuStreamWriteValueDefault));
  } else {
    SAMPLERD_CHECK_GPU(
        "hipStreamWriteValue32",
        As<HipWriteValue32>(write_value_)(stream, reinterpret_cast<void*>(address), value, 0));
  }
  return "";
}

std::string GpuStreamOps::WaitValue32Eq(void* stream, uint64_t address, uint32_t value) const {
  if (vendor_ == GpuVendor::kCuda) {
    SAMPLERD_CHECK_GPU("cuStreamWaitValue32", As<CuWaitValue32>(wait_value_)(stream, address, value,
                                                                             kCuStreamWaitValueEq));
  } else {
    SAMPLERD_CHECK_GPU("hipStreamWaitValue32",
                       As<HipWaitValue32>(wait_value_)(stream, reinterpret_cast<void*>(address),
                                                       value, kHipStreamWaitValueEq, 0xffffffffu));
  }
  return "";
}

std::string GpuStreamOps::RegisterHost(void* ptr, size_t bytes, uint64_t* device_address) const {
  if (vendor_ == GpuVendor::kCuda) {
    void* context = nullptr;
    if (As<CuCtxGetCurrent>(get_context_)(&context) != 0 || context == nullptr) {
      return "expected a current CUDA context on the calling thread (initialise the engine's "
             "device first, e.g. cudaSetDevice + cudaFree(0)), got none";
    }
    SAMPLERD_CHECK_GPU("cuMemHostRegister",
                       As<CuHostRegister>(host_register_)(
                           ptr, bytes, kCuMemHostRegisterPortable | kCuMemHostRegisterDeviceMap));
    CuDevicePtr device = 0;
    const CuResult code = As<CuHostDevicePointer>(host_device_pointer_)(&device, ptr, 0);
    if (code != 0) {
      As<CuHostUnregister>(host_unregister_)(ptr);
      return CudaError(error_string_, "cuMemHostGetDevicePointer", code);
    }
    *device_address = device;
  } else {
    SAMPLERD_CHECK_GPU("hipHostRegister",
                       As<HipHostRegister>(host_register_)(
                           ptr, bytes, kHipHostRegisterPortable | kHipHostRegisterMapped));
    void* device = nullptr;
    const HipError code = As<HipHostDevicePointer>(host_device_pointer_)(&device, ptr, 0);
    if (code != 0) {
      As<HipHostUnregister>(host_unregister_)(ptr);
      return HipErrorText(error_string_, "hipHostGetDevicePointer", code);
    }
    *device_address = reinterpret_cast<uint64_t>(device);
  }
  return "";
}

void GpuStreamOps::UnregisterHost(void* ptr) const {
  if (vendor_ == GpuVendor::kCuda) {
    As<CuHostUnregister>(host_unregister_)(ptr);
  } else {
    As<HipHostUnregister>(host_unregister_)(ptr);
  }
}

#undef SAMPLERD_CHECK_GPU

}  // namespace samplerd::internal
