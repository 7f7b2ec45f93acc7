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

# The wheel's kernels (GAC_CUDA_NVRTC_ROOT, the nvidia/ folder of PyPI's CUDA
# packages that scripts/cuda12.sh installs): compiled by that NVRTC into a
# fatbin (agent/src/cuda/build_fatbin.py) instead of by nvcc, launched by
# name through the runtime's library API (kernel_library.cc), and that
# release's runtime linked statically. PyPI's CUDA 12 packages have no nvcc,
# and CUDA 12.9's kernels run on every driver since CUDA 12.0 (>= 525),
# CUDA 13's on drivers >= 580 only. For the Python package: no LibTorch, no NCCL.
set(GAC_CUDA_NVRTC_ROOT "" CACHE PATH
    "nvidia/ folder of PyPI's CUDA packages (scripts/cuda12.sh) whose NVRTC compiles the kernels and whose static runtime is linked in; empty: nvcc")
set(GAC_CUDA_FATBIN_CACHE "" CACHE PATH
    "A folder where the NVRTC build keeps its fatbins by their inputs' hash (the wheels of several CPythons); empty: none")
set(GAC_CUDA_NVRTC OFF)
set(GAC_HAVE_CUDA OFF)
set(GAC_HAVE_NCCL OFF)
if(GAC_CUDA_NVRTC_ROOT AND NOT GAC_WITH_CUDA STREQUAL "OFF")
  if(GAC_WITH_TORCH OR GAC_WITH_NCCL STREQUAL "ON" OR NOT GAC_CUDA_STATIC_RUNTIME)
    message(FATAL_ERROR "GAC_CUDA_NVRTC_ROOT is for the Python package: GAC_WITH_TORCH=OFF, GAC_WITH_NCCL=OFF, "
                        "GAC_CUDA_STATIC_RUNTIME=ON (pyproject.toml)")
  endif()
  set(_gac_rt ${GAC_CUDA_NVRTC_ROOT}/cuda_runtime)
  set(_gac_crt ${GAC_CUDA_NVRTC_ROOT}/cuda_nvcc/include)  # crt/, which the runtime's headers include
  foreach(f ${_gac_rt}/include/cuda_runtime_api.h ${_gac_rt}/lib/libcudart_static.a ${_gac_crt}/crt/host_defines.h
            ${GAC_CUDA_NVRTC_ROOT}/cuda_cccl/include/cuda/std/type_traits)
    if(NOT EXISTS ${f})
      message(FATAL_ERROR "GAC_CUDA_NVRTC_ROOT: ${f} is missing (scripts/cuda12.sh installs the toolchain)")
    endif()
  endforeach()
  # Loads NVRTC: a broken toolchain fails here rather than in the build.
  execute_process(COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/agent/src/cuda/build_fatbin.py
                          --nvidia ${GAC_CUDA_NVRTC_ROOT} --version
    OUTPUT_VARIABLE GAC_NVRTC_VERSION OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _gac_rc)
  if(NOT _gac_rc EQUAL 0)
    message(FATAL_ERROR "GAC_CUDA_NVRTC_ROOT: NVRTC does not load from ${GAC_CUDA_NVRTC_ROOT}/cuda_nvrtc")
  endif()
  # The name FindCUDAToolkit gives it, so that agent/ links it alike.
  add_library(CUDA::cudart_static STATIC IMPORTED)
  set_target_properties(CUDA::cudart_static PROPERTIES
    IMPORTED_LOCATION ${_gac_rt}/lib/libcudart_static.a
    INTERFACE_INCLUDE_DIRECTORIES "${_gac_rt}/include;${_gac_crt}"
    INTERFACE_LINK_LIBRARIES "Threads::Threads;${CMAKE_DL_LIBS};rt")
  set(GAC_CUDA_NVRTC ON)
  set(GAC_HAVE_CUDA ON)
elseif(NOT GAC_WITH_CUDA STREQUAL "OFF")
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
if(GAC_HAVE_CUDA AND NOT GAC_CUDA_NVRTC AND NOT GAC_WITH_NCCL STREQUAL "OFF")
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
  if(CMAKE_CUDA_ARCHITECTURES)
    set(_gac_default_cuda_archs "${CMAKE_CUDA_ARCHITECTURES}")
  else()
    set(_gac_default_cuda_archs "80;90")
  endif()
  set(GAC_CUDA_ARCHITECTURES "${_gac_default_cuda_archs}" CACHE STRING
      "CUDA architectures of the agent's kernels (default 80;90, or CMAKE_CUDA_ARCHITECTURES)")
  if(GAC_CUDA_NVRTC)
    set(GAC_HAVE_CUDA_KERNELS ON)
    set(GAC_CUDA_KERNEL_COMPILER "NVRTC ${GAC_NVRTC_VERSION}")
    set(_gac_kernel_version ${GAC_NVRTC_VERSION})
  else()
    if(NOT CMAKE_CUDA_COMPILER AND CUDAToolkit_NVCC_EXECUTABLE)
      set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
    endif()
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "${GAC_CUDA_ARCHITECTURES}")
    endif()
    set(CMAKE_CUDA_RUNTIME_LIBRARY None)
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      enable_language(CUDA)
      set(GAC_HAVE_CUDA_KERNELS ON)
      set(GAC_CUDA_KERNEL_COMPILER "nvcc ${CMAKE_CUDA_COMPILER_VERSION}")
      set(_gac_kernel_version ${CMAKE_CUDA_COMPILER_VERSION})
    else()
      message(WARNING "CUDA toolkit without nvcc: gac::agent_cuda (the CUDA passes) is not built")
    endif()
  endif()
endif()

# What the kernels are, for gac/agent/cuda_info.h: GAC_CUDA_KERNEL_TOOLKIT,
# their compiler's CUDA release as CUDA numbers it (12090 for 12.9), and
# GAC_CUDA_ARCHITECTURES in CMake's syntax ("80" a cubin and PTX, "80-real"
# the cubin only, "80-virtual" the PTX only) as the images they carry:
# GAC_CUDA_CUBIN_ARCHS and GAC_CUDA_PTX_ARCHS ("80;90"), and
# GAC_CUDA_ARCH_NAMES ("sm_80;compute_90"; other entries, such as "native",
# as given).
set(GAC_CUDA_CUBIN_ARCHS "")
set(GAC_CUDA_PTX_ARCHS "")
set(GAC_CUDA_ARCH_NAMES "")
if(GAC_HAVE_CUDA_KERNELS)
  string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _gac_match "${_gac_kernel_version}")
  math(EXPR GAC_CUDA_KERNEL_TOOLKIT "${CMAKE_MATCH_1} * 1000 + ${CMAKE_MATCH_2} * 10")
  foreach(arch IN LISTS GAC_CUDA_ARCHITECTURES)
    if(arch MATCHES "^([0-9]+[a-z]?)(-real|-virtual)?$")
      if(NOT CMAKE_MATCH_2 STREQUAL "-virtual")
        list(APPEND GAC_CUDA_CUBIN_ARCHS ${CMAKE_MATCH_1})
        list(APPEND GAC_CUDA_ARCH_NAMES sm_${CMAKE_MATCH_1})
      endif()
      if(NOT CMAKE_MATCH_2 STREQUAL "-real")
        list(APPEND GAC_CUDA_PTX_ARCHS ${CMAKE_MATCH_1})
        list(APPEND GAC_CUDA_ARCH_NAMES compute_${CMAKE_MATCH_1})
      endif()
    elseif(GAC_CUDA_NVRTC)
      message(FATAL_ERROR "GAC_CUDA_ARCHITECTURES: NVRTC takes numbers (80, 80-real, 80-virtual), got '${arch}'")
    else()
      list(APPEND GAC_CUDA_ARCH_NAMES ${arch})
    endif()
  endforeach()
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
