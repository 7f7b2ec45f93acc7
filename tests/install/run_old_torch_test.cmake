# cmake -P script: configuring gac against a LibTorch older than the C++
# build supports stops, and the message names the supported range and what
# was found (GAC_TEST_OLD_TORCH_VERSION, passed to the stand-in config).
file(REMOVE_RECURSE ${GAC_SCRATCH})
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${GAC_SOURCE_DIR} -B ${GAC_SCRATCH} -G ${GAC_GENERATOR}
    -DTorch_DIR=${GAC_OLD_TORCH_DIR} -DGAC_TEST_OLD_TORCH_VERSION=${GAC_VERSION}
    -DGAC_WITH_GRPC=OFF -DGAC_WITH_SERVER=OFF -DGAC_WITH_CUDA=OFF -DGAC_WITH_PYTHON=OFF
    -DGAC_BUILD_TESTS=OFF -DGAC_BUILD_BENCHMARKS=OFF -DGAC_BUILD_EXAMPLES=OFF
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE_RECURSE ${GAC_SCRATCH})
string(REGEX REPLACE "[ \n]+" " " err "${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "configuring against LibTorch ${GAC_VERSION} succeeded")
endif()
foreach(want "gac's C++ build needs LibTorch 2.7 or newer" "found ${GAC_VERSION} at ${GAC_OLD_TORCH_DIR}")
  string(FIND "${err}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the configure error does not say \"${want}\":\n${err}")
  endif()
endforeach()
message(STATUS "LibTorch ${GAC_VERSION} refused: ${err}")
