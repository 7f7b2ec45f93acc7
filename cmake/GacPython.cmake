# Resolves GAC_WITH_PYTHON (ON, OFF or AUTO) into GAC_HAVE_PYTHON: the gac
# Python package (python/) is built when Python 3's headers and pybind11 are
# found (AUTO), or must be (ON). The interpreter is GAC_PYTHON (the
# checkout's .venv, cmake/GacTorch.cmake) unless Python3_EXECUTABLE says
# otherwise; pybind11 is the one installed in it, found through
# `python -m pybind11 --cmakedir`.

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

# The agent's module links the torch-free core only (it reads tensors
# through torch's Python API): it is built with the package.
set(GAC_HAVE_PYTHON_AGENT ${GAC_HAVE_PYTHON})
