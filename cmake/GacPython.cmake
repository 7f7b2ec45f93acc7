# Resolves GAC_WITH_PYTHON (ON, OFF or AUTO) into GAC_HAVE_PYTHON: the gac
# Python package (python/) is built when Python 3's headers and pybind11 are
# found (AUTO), or must be (ON). The interpreter is Debian's /usr/bin/python3
# unless Python3_EXECUTABLE says otherwise: its torch is the LibTorch that
# libtorch-dev ships, which the agent's module must share.
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
  if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python3_EXECUTABLE /usr/bin/python3)
  endif()
  find_package(Python3 QUIET COMPONENTS Interpreter Development.Module)
  if(Python3_FOUND)
    set(PYBIND11_FINDPYTHON ON)
    find_package(pybind11 CONFIG QUIET)
  endif()
  if(Python3_FOUND AND pybind11_FOUND)
    set(GAC_HAVE_PYTHON ON)
  elseif(GAC_WITH_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "GAC_WITH_PYTHON=ON needs Python 3 headers and pybind11 (Debian: python3-dev pybind11-dev)")
  endif()
endif()

if(GAC_HAVE_PYTHON AND GAC_WITH_TORCH)
  find_library(GAC_TORCH_PYTHON_LIBRARY torch_python HINTS ${TORCH_INSTALL_PREFIX}/lib)
  # Also torch's pybind11 ABI tags: pybind11 shares types (a ProcessGroup
  # passed to gac.Agent) only between modules whose tags match, and the tags
  # name the compiler; the modules take torch's whatever compiles them.
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import os, torch; print(os.path.realpath(os.path.join(os.path.dirname(torch.__file__), 'lib', 'libtorch_cpu.so'))); c = torch._C; print(c._PYBIND11_COMPILER_TYPE, c._PYBIND11_STDLIB, c._PYBIND11_BUILD_ABI)"
    OUTPUT_VARIABLE _gac_py_torch_out OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _gac_py_torch_rc ERROR_QUIET)
  string(REPLACE "\n" ";" _gac_py_torch_lines "${_gac_py_torch_out}")
  set(_gac_py_torch_cpu "")
  set(GAC_PYBIND11_ABI_DEFINITIONS)
  list(LENGTH _gac_py_torch_lines _gac_py_torch_n)
  if(_gac_py_torch_rc EQUAL 0 AND _gac_py_torch_n EQUAL 2)
    list(GET _gac_py_torch_lines 0 _gac_py_torch_cpu)
    list(GET _gac_py_torch_lines 1 _gac_py_tags)
    string(REPLACE " " ";" _gac_py_tags "${_gac_py_tags}")
    list(GET _gac_py_tags 0 _gac_tag_compiler)
    list(GET _gac_py_tags 1 _gac_tag_stdlib)
    list(GET _gac_py_tags 2 _gac_tag_abi)
    set(GAC_PYBIND11_ABI_DEFINITIONS PYBIND11_COMPILER_TYPE="${_gac_tag_compiler}"
        PYBIND11_STDLIB="${_gac_tag_stdlib}" PYBIND11_BUILD_ABI="${_gac_tag_abi}")
  endif()
  find_library(_gac_torch_cpu torch_cpu HINTS ${TORCH_INSTALL_PREFIX}/lib)
  get_filename_component(_gac_torch_cpu_real "${_gac_torch_cpu}" REALPATH)
  if(NOT GAC_TORCH_PYTHON_LIBRARY)
    message(WARNING "libtorch_python not found: the gac Python package is built without gac.Agent")
  elseif(NOT _gac_py_torch_rc EQUAL 0)
    message(WARNING "${Python3_EXECUTABLE} cannot import torch (Debian: python3-torch): "
                    "the gac Python package is built without gac.Agent")
  elseif(NOT _gac_py_torch_cpu STREQUAL _gac_torch_cpu_real)
    message(WARNING "${Python3_EXECUTABLE}'s torch loads ${_gac_py_torch_cpu}, CMake's LibTorch is "
                    "${_gac_torch_cpu_real}: the gac Python package is built without gac.Agent "
                    "(the module must share the interpreter's LibTorch)")
  else()
    set(GAC_HAVE_PYTHON_AGENT ON)
  endif()
endif()
