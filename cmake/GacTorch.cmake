# Points CMake at the one torch of the project: the Python environment that
# scripts/setup.sh creates in the checkout (.venv: torch from PyPI with its
# CUDA runtime and NCCL wheels, and the CUDA compiler of the same CUDA
# release). Runs before anything is found, and sets only hints:
#   GAC_PYTHON            the interpreter (Python3_EXECUTABLE unless given)
#   GAC_TORCH_ROOT        torch's root: gac_find_torch() puts it and its
#                         CMake config ahead of CMAKE_PREFIX_PATH while it
#                         finds LibTorch (a Debian libtorch-dev must not be
#                         found), and only then (torch/include carries
#                         copies of Protobuf's and pybind11's headers)
#   CUDAToolkit_ROOT      site-packages/nvidia/cu13 (nvcc, headers, libcudart)
#   CUDA_TOOLKIT_ROOT_DIR the same, for the FindCUDA that Caffe2Config runs
#   CMAKE_CUDA_COMPILER   its nvcc
#   GAC_NCCL_ROOT         site-packages/nvidia/nccl
#   TORCH_CUDA_ARCH_LIST  gac's architectures (Caffe2Config otherwise guesses
#                         a list that CUDA 13's nvcc refuses without a GPU)
# and defines gac_find_torch(), which finds LibTorch and checks its version.
#
# Any of them given on the command line wins; with no .venv the system's
# python3 is asked where its torch is.

set(GAC_TORCH_MIN_VERSION 2.7)
set(GAC_TORCH_TESTED_VERSION 2.15)

if(EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  set(_gac_default_python ${PROJECT_SOURCE_DIR}/.venv/bin/python)
else()
  find_program(_gac_default_python NAMES python3)
endif()
set(GAC_PYTHON "${_gac_default_python}" CACHE FILEPATH
    "The Python whose torch the C++ build uses and the Python package is built for (default: the checkout's .venv)")
if(NOT DEFINED Python3_EXECUTABLE)
  set(Python3_EXECUTABLE ${GAC_PYTHON})
endif()

# The environment's site-packages, and torch's root when torch is installed there.
set(GAC_SITE_PACKAGES "")
set(GAC_TORCH_ROOT "")
if(GAC_PYTHON)
  execute_process(
    COMMAND ${GAC_PYTHON} -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    OUTPUT_VARIABLE GAC_SITE_PACKAGES OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(GAC_WITH_TORCH AND EXISTS ${GAC_SITE_PACKAGES}/torch/share/cmake/Torch/TorchConfig.cmake)
    set(GAC_TORCH_ROOT ${GAC_SITE_PACKAGES}/torch)
  endif()
endif()

# The toolkit root also when gac's CUDA parts are off: a CUDA LibTorch's
# config looks for the CUDA runtime whatever its user builds.
if(GAC_SITE_PACKAGES)
  if(NOT CUDAToolkit_ROOT AND EXISTS ${GAC_SITE_PACKAGES}/nvidia/cu13/bin/nvcc)
    set(CUDAToolkit_ROOT ${GAC_SITE_PACKAGES}/nvidia/cu13)
  endif()
  if(NOT DEFINED GAC_NCCL_ROOT AND EXISTS ${GAC_SITE_PACKAGES}/nvidia/nccl/include/nccl.h)
    set(GAC_NCCL_ROOT ${GAC_SITE_PACKAGES}/nvidia/nccl)
  endif()
endif()
if(CUDAToolkit_ROOT AND NOT CUDA_TOOLKIT_ROOT_DIR)
  set(CUDA_TOOLKIT_ROOT_DIR ${CUDAToolkit_ROOT})
endif()
# nvcc is not on the PATH: a CUDA LibTorch's config enables the CUDA language
# itself when gac's CUDA parts are off (GAC_WITH_CUDA=OFF).
if(NOT CMAKE_CUDA_COMPILER AND CUDAToolkit_ROOT AND EXISTS ${CUDAToolkit_ROOT}/bin/nvcc)
  set(CMAKE_CUDA_COMPILER ${CUDAToolkit_ROOT}/bin/nvcc)
endif()

# The NVIDIA wheels ship only versioned libraries (libcudart.so.13,
# libnccl.so.2), which find_library does not look for: gac_versioned_libs(ON)
# lets it while the CUDA toolkit, NCCL and LibTorch are found, OFF restores.
macro(gac_versioned_libs on)
  if(${on})
    set(_gac_saved_suffixes "${CMAKE_FIND_LIBRARY_SUFFIXES}")
    list(APPEND CMAKE_FIND_LIBRARY_SUFFIXES .so.13 .so.12 .so.2)
  else()
    set(CMAKE_FIND_LIBRARY_SUFFIXES "${_gac_saved_suffixes}")
  endif()
endmacro()

function(gac_torch_range_error found where)
  message(FATAL_ERROR
    "gac's C++ build needs LibTorch ${GAC_TORCH_MIN_VERSION} or newer (tested up to "
    "${GAC_TORCH_TESTED_VERSION}, with the C++11 ABI of PyPI's wheels since 2.7); found ${found} "
    "at ${where}. Run scripts/setup.sh (the checkout's .venv), or point GAC_PYTHON or Torch_DIR "
    "at a newer torch.")
endfunction()

# Finds LibTorch (after Protobuf: Caffe2Config fakes protobuf::libprotobuf
# when it is not yet defined) and checks that the C++ build supports it.
macro(gac_find_torch)
  if(GAC_HAVE_CUDA)
    string(REGEX REPLACE "([0-9])([0-9])" "\\1.\\2" _gac_torch_archs "${GAC_CUDA_ARCHITECTURES}")
    if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
      set(TORCH_CUDA_ARCH_LIST "${_gac_torch_archs}")
    endif()
  endif()
  # Caffe2Config turns CMAKE_CUDA_ARCHITECTURES off, with a warning, when it
  # is set: it is put back afterwards (gac's targets set their own).
  set(_gac_cuda_archs "${CMAKE_CUDA_ARCHITECTURES}")
  unset(CMAKE_CUDA_ARCHITECTURES)
  set(_gac_saved_prefix_path "${CMAKE_PREFIX_PATH}")
  if(GAC_TORCH_ROOT AND NOT Torch_DIR)
    # The root first: TorchConfig looks for libc10 and libtorch with PATHS,
    # which come after CMAKE_PREFIX_PATH/lib and the system's folders.
    list(PREPEND CMAKE_PREFIX_PATH ${GAC_TORCH_ROOT} ${GAC_TORCH_ROOT}/share/cmake)
  endif()
  gac_versioned_libs(ON)
  find_package(Torch REQUIRED)
  gac_versioned_libs(OFF)
  set(CMAKE_PREFIX_PATH "${_gac_saved_prefix_path}")
  set(CMAKE_CUDA_ARCHITECTURES "${_gac_cuda_archs}")
  if(NOT Torch_VERSION OR Torch_VERSION VERSION_LESS GAC_TORCH_MIN_VERSION)
    gac_torch_range_error("${Torch_VERSION}" "${TORCH_INSTALL_PREFIX}")
  endif()
  if(Torch_VERSION VERSION_GREATER_EQUAL "${GAC_TORCH_TESTED_VERSION}.99")
    message(WARNING "LibTorch ${Torch_VERSION} is newer than the newest gac was tested with "
                    "(${GAC_TORCH_TESTED_VERSION})")
  endif()
  # MKL's imported target carries link directories under an empty MKL_ROOT
  # (/lib/intel64, ...) that would land in every RPATH.
  if(TARGET caffe2::mkl)
    set_property(TARGET caffe2::mkl PROPERTY INTERFACE_LINK_DIRECTORIES "")
  endif()
  # Installed programs find torch's libraries (and, through their own RPATH,
  # NVIDIA's) where they were built against: the environment's lib folders.
  set(_gac_rpath ${TORCH_INSTALL_PREFIX}/lib)
  if(GAC_HAVE_CUDA)
    list(APPEND _gac_rpath ${CUDAToolkit_LIBRARY_DIR})
  endif()
  if(GAC_HAVE_NCCL)
    get_filename_component(_gac_nccl_dir ${GAC_NCCL_LIBRARY} DIRECTORY)
    list(APPEND _gac_rpath ${_gac_nccl_dir})
  endif()
  list(APPEND CMAKE_INSTALL_RPATH ${_gac_rpath})
  list(REMOVE_DUPLICATES CMAKE_INSTALL_RPATH)
endmacro()
