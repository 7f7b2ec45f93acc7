# cmake -P script: install, configure the consumer, build it, run it.
file(REMOVE_RECURSE ${GAC_SCRATCH})
set(prefix ${GAC_SCRATCH}/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

run(${CMAKE_COMMAND} --install ${GAC_BUILD_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${GAC_CONSUMER_SOURCE} -B ${GAC_SCRATCH}/build -G ${GAC_GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release -DCONSUMER_WITH_AGENT=${GAC_WITH_TORCH} -DCONSUMER_WITH_SERVER=${GAC_WITH_SERVER})
run(${CMAKE_COMMAND} --build ${GAC_SCRATCH}/build)
run(${GAC_SCRATCH}/build/gac_consumer)
