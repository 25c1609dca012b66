# Resolves SAMPLERD_GPU (auto|cuda|hip|off) into SAMPLERD_GPU_BACKEND (cuda|hip|off).
# `auto` picks CUDA when nvcc is found (on PATH or in /usr/local/cuda/bin), else HIP when hipcc
# is found, else off. An explicit cuda or hip without its compiler is a configure error.
#
# Included from the top-level CMakeLists.txt, so that the CUDA language is enabled for every
# directory: executables elsewhere in the tree that link samplerd_kernels_gpu then get the
# static CUDA runtime on their link line. kernels/gpu/CMakeLists.txt builds the kernels.
set(_gpu "${SAMPLERD_GPU}")
if(NOT _gpu MATCHES "^(auto|cuda|hip|off)$")
  message(FATAL_ERROR "SAMPLERD_GPU: expected auto|cuda|hip|off, got '${_gpu}'")
endif()
if(_gpu STREQUAL "cuda" OR _gpu STREQUAL "auto")
  find_program(SAMPLERD_NVCC nvcc HINTS /usr/local/cuda/bin)
endif()
if(_gpu STREQUAL "hip" OR _gpu STREQUAL "auto")
  find_program(SAMPLERD_HIPCC hipcc)
endif()
if(_gpu STREQUAL "auto")
  if(SAMPLERD_NVCC)
    set(_gpu cuda)
  elseif(SAMPLERD_HIPCC)
    set(_gpu hip)
  else()
    set(_gpu off)
  endif()
endif()

if(_gpu STREQUAL "cuda")
  if(NOT SAMPLERD_NVCC)
    message(FATAL_ERROR "SAMPLERD_GPU=cuda: expected nvcc on PATH or in /usr/local/cuda/bin, "
                        "got none")
  endif()
  if(NOT CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_COMPILER "${SAMPLERD_NVCC}")
  endif()
  # sm_90 (H100/H200) first; sm_80 (A100) also gets PTX that newer GPUs can JIT.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "90;80")
  endif()
  # Static cudart: the binary runs (on the CPU backend) where no CUDA is installed. Do not also
  # link CUDA::cudart: that would mix two runtimes.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
  enable_language(CUDA)
elseif(_gpu STREQUAL "hip")
  if(NOT SAMPLERD_HIPCC)
    message(FATAL_ERROR "SAMPLERD_GPU=hip: expected hipcc on PATH (apt-get install hipcc "
                        "libamdhip64-dev), got none")
  endif()
  # Debian's libamdhip64-dev; final binaries link it through samplerd_kernels_gpu.
  find_library(SAMPLERD_AMDHIP64 amdhip64 HINTS /opt/rocm/lib)
  if(NOT SAMPLERD_AMDHIP64)
    message(FATAL_ERROR "SAMPLERD_GPU=hip: expected libamdhip64 (apt-get install "
                        "libamdhip64-dev), got none")
  endif()
endif()
set(SAMPLERD_GPU_BACKEND "${_gpu}")
