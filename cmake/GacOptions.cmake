# Resolves the AUTO options into GAC_HAVE_CUDA / GAC_HAVE_NCCL, enables the
# CUDA language for the agent's kernels (GAC_HAVE_CUDA_KERNELS) and defines
# gac_set_warnings(), shared by every target of the project.

function(gac_set_warnings target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    # C++ sources only: nvcc takes host-compiler warnings through -Xcompiler.
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra;-Wpedantic;-Wno-unused-parameter>")
  endif()
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    # The locking rules stated with gac/base/thread_annotations.h are errors when broken.
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety;-Werror=thread-safety>")
  endif()
endfunction()

set(GAC_HAVE_CUDA OFF)
set(GAC_HAVE_NCCL OFF)
if(NOT GAC_WITH_CUDA STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  gac_versioned_libs(ON)
  find_package(CUDAToolkit QUIET)
  gac_versioned_libs(OFF)
  if(CUDAToolkit_FOUND)
    set(GAC_HAVE_CUDA ON)
  elseif(GAC_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "GAC_WITH_CUDA=ON but no CUDA toolkit was found (run scripts/setup.sh, or set CUDAToolkit_ROOT)")
  endif()
endif()
if(GAC_HAVE_CUDA AND NOT GAC_WITH_NCCL STREQUAL "OFF")
  gac_versioned_libs(ON)
  find_path(GAC_NCCL_INCLUDE_DIR nccl.h HINTS ${GAC_NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_ROOT
            PATH_SUFFIXES include)
  find_library(GAC_NCCL_LIBRARY nccl HINTS ${GAC_NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_ROOT
               PATH_SUFFIXES lib lib64)
  gac_versioned_libs(OFF)
  if(GAC_NCCL_INCLUDE_DIR AND GAC_NCCL_LIBRARY)
    set(GAC_HAVE_NCCL ON)
  elseif(GAC_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "GAC_WITH_NCCL=ON but nccl.h / libnccl were not found (set NCCL_ROOT)")
  endif()
elseif(GAC_WITH_NCCL STREQUAL "ON")
  message(FATAL_ERROR "GAC_WITH_NCCL=ON needs CUDA (GAC_WITH_CUDA)")
endif()

# The kernels of gac::agent_cuda need nvcc (the CUDA parts above need only the
# runtime and NCCL). They are compiled for GAC_CUDA_ARCHITECTURES: A100 and
# H100/H200 by default (CUDA 13 has no architectures before 75), or
# CMAKE_CUDA_ARCHITECTURES when the user sets it. The target property is set
# explicitly because a CUDA LibTorch's CMake config resets
# CMAKE_CUDA_ARCHITECTURES. Every target links the shared CUDA runtime, the
# one LibTorch loads, explicitly (CUDA::cudart): CMake's own choice, by name
# (-lcudart), finds nothing in the NVIDIA wheels, which ship only
# libcudart.so.13.
set(GAC_HAVE_CUDA_KERNELS OFF)
if(GAC_HAVE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND CUDAToolkit_NVCC_EXECUTABLE)
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
  endif()
  if(CMAKE_CUDA_ARCHITECTURES)
    set(_gac_default_cuda_archs "${CMAKE_CUDA_ARCHITECTURES}")
  else()
    set(_gac_default_cuda_archs "80;90")
  endif()
  set(GAC_CUDA_ARCHITECTURES "${_gac_default_cuda_archs}" CACHE STRING
      "CUDA architectures of the agent's kernels (default 80;90, or CMAKE_CUDA_ARCHITECTURES)")
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "${GAC_CUDA_ARCHITECTURES}")
  endif()
  set(CMAKE_CUDA_RUNTIME_LIBRARY None)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    set(GAC_HAVE_CUDA_KERNELS ON)
  else()
    message(WARNING "CUDA toolkit without nvcc: gac::agent_cuda (the CUDA passes) is not built")
  endif()
endif()

# Sanitizers and fuzzing, for the checking builds of scripts/sanitize.sh.
# GAC_SANITIZE is a -fsanitize= list ("address,undefined" or "thread") applied
# to every C++ target of the project, with -fno-sanitize-recover=all so that
# the first report fails the test. Libraries found outside the project
# (LibTorch, gRPC, Protobuf, SQLite, prometheus-cpp) stay uninstrumented.
# GAC_BUILD_FUZZERS builds the libFuzzer targets of tests/fuzz (clang only):
# every target then carries libFuzzer's coverage instrumentation, so one
# sanitized tree serves both the tests and the fuzzers.
set(GAC_SANITIZE "" CACHE STRING "Sanitizers for every target: address,undefined | thread | \"\" (none)")
option(GAC_BUILD_FUZZERS "Build the libFuzzer targets of tests/fuzz (clang)" OFF)
if(GAC_SANITIZE)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${GAC_SANITIZE};-fno-sanitize-recover=all;-fno-omit-frame-pointer>")
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    # The instrumentation keeps the kernels' "omp simd" loops from vectorising;
    # clang says so for each (-Wpass-failed), which is expected here.
    add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-Wno-pass-failed>")
  endif()
  add_link_options("-fsanitize=${GAC_SANITIZE}")
endif()
if(GAC_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "GAC_BUILD_FUZZERS needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>")
endif()
