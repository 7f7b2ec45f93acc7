# Resolves GAC_WITH_PYTHON (ON, OFF or AUTO) into GAC_HAVE_PYTHON: the gac
# Python package (python/) is built when Python 3's headers and pybind11 are
# found (AUTO), or must be (ON). The interpreter is GAC_PYTHON (the
# checkout's .venv, cmake/GacTorch.cmake) unless Python3_EXECUTABLE says
# otherwise; pybind11 is the one installed in it (the version torch's own
# headers carry), found through `python -m pybind11 --cmakedir`.
#
# Also finds libtorch_python (GAC_TORCH_PYTHON_LIBRARY) for the agent's
# module when the agent is built, and checks that the interpreter's torch
# loads the same libtorch_cpu as the one CMake links.
set(GAC_HAVE_PYTHON OFF)
set(GAC_HAVE_PYTHON_AGENT OFF)
# Where the package is staged (modules and Python files): build/python/gac.
set(GAC_PYTHON_STAGE ${PROJECT_BINARY_DIR}/python)
# The interpreter is not built with sanitizers: a module that is cannot be
# imported into it, so AUTO leaves the package out of sanitizer builds.
set(_gac_python_wanted ON)
if(GAC_WITH_PYTHON STREQUAL "OFF")
  set(_gac_python_wanted OFF)
elseif(GAC_WITH_PYTHON STREQUAL "AUTO" AND (GAC_SANITIZE OR "${CMAKE_CXX_FLAGS}" MATCHES "-fsanitize="))
  message(STATUS "GAC_WITH_PYTHON=AUTO: no Python package in a sanitizer build")
  set(_gac_python_wanted OFF)
endif()
if(_gac_python_wanted)
  find_package(Python3 QUIET COMPONENTS Interpreter Development.Module)
  if(Python3_FOUND)
    set(PYBIND11_FINDPYTHON ON)
    if(NOT pybind11_DIR)
      execute_process(COMMAND ${Python3_EXECUTABLE} -m pybind11 --cmakedir
        OUTPUT_VARIABLE _gac_pybind11_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(_gac_pybind11_dir)
        set(pybind11_DIR ${_gac_pybind11_dir})
      endif()
    endif()
    find_package(pybind11 CONFIG QUIET)
  endif()
  if(Python3_FOUND AND pybind11_FOUND)
    set(GAC_HAVE_PYTHON ON)
  elseif(GAC_WITH_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "GAC_WITH_PYTHON=ON needs Python 3 headers (Debian: python3-dev) and pybind11 in ${Python3_EXECUTABLE}'s environment (scripts/setup.sh)")
  endif()
endif()

if(GAC_HAVE_PYTHON AND GAC_WITH_TORCH)
  find_library(GAC_TORCH_PYTHON_LIBRARY torch_python HINTS ${TORCH_INSTALL_PREFIX}/lib)
  # The modules share pybind11's type registry with torch (a ProcessGroup
  # passed to gac.Agent) only when they are compiled with the pybind11 torch
  # was: its headers come first on the include path of whatever links
  # torch; the version found above must be the same.
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import os, torch; print(os.path.realpath(os.path.join(os.path.dirname(torch.__file__), 'lib', 'libtorch_cpu.so')))"
    OUTPUT_VARIABLE _gac_py_torch_cpu OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _gac_py_torch_rc ERROR_QUIET)
  set(_gac_torch_pybind11 "")
  foreach(_gac_dir IN LISTS TORCH_INCLUDE_DIRS)
    if(EXISTS ${_gac_dir}/pybind11/detail/common.h)
      file(STRINGS ${_gac_dir}/pybind11/detail/common.h _gac_lines
           REGEX "define PYBIND11_VERSION_(MAJOR|MINOR|PATCH) ")
      string(REGEX REPLACE "[^;]*MAJOR ([0-9]+);[^;]*MINOR ([0-9]+);[^;]*PATCH ([0-9a-z.]+).*" "\\1.\\2.\\3"
             _gac_torch_pybind11 "${_gac_lines}")
      break()
    endif()
  endforeach()
  find_library(_gac_torch_cpu torch_cpu HINTS ${TORCH_INSTALL_PREFIX}/lib)
  get_filename_component(_gac_torch_cpu_real "${_gac_torch_cpu}" REALPATH)
  if(NOT GAC_TORCH_PYTHON_LIBRARY)
    message(WARNING "libtorch_python not found: the gac Python package is built without gac.Agent")
  elseif(NOT _gac_py_torch_rc EQUAL 0)
    message(WARNING "${Python3_EXECUTABLE} cannot import torch (scripts/setup.sh installs it in .venv): "
                    "the gac Python package is built without gac.Agent")
  elseif(_gac_torch_pybind11 AND NOT _gac_torch_pybind11 VERSION_EQUAL pybind11_VERSION)
    message(WARNING "torch's headers carry pybind11 ${_gac_torch_pybind11}, ${Python3_EXECUTABLE}'s "
                    "pybind11 is ${pybind11_VERSION}: the gac Python package is built without gac.Agent "
                    "(install pybind11==${_gac_torch_pybind11})")
  elseif(NOT _gac_py_torch_cpu STREQUAL _gac_torch_cpu_real)
    message(WARNING "${Python3_EXECUTABLE}'s torch loads ${_gac_py_torch_cpu}, CMake's LibTorch is "
                    "${_gac_torch_cpu_real}: the gac Python package is built without gac.Agent "
                    "(the module must share the interpreter's LibTorch)")
  else()
    set(GAC_HAVE_PYTHON_AGENT ON)
  endif()
endif()
