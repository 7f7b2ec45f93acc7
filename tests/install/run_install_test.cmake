# cmake -P script: install, check that the consumer includes every installed
# header, configure the consumer, build it, run it.
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

# Every installed header must be one the consumer includes: a public header
# that no project outside the tree has compiled is a header nobody checked.
file(GLOB_RECURSE headers RELATIVE ${prefix}/include ${prefix}/include/gac/*.h ${prefix}/include/grpc/*.h)
file(READ ${GAC_CONSUMER_SOURCE}/main.cc consumer)
set(missing)
foreach(h IN LISTS headers)
  string(FIND "${consumer}" "#include \"${h}\"" at)
  if(at EQUAL -1)
    list(APPEND missing ${h})
  endif()
endforeach()
list(LENGTH headers count)
if(missing)
  message(FATAL_ERROR "installed headers the consumer does not include: ${missing}")
endif()
if(count LESS 10)
  message(FATAL_ERROR "only ${count} headers installed under ${prefix}/include")
endif()
message(STATUS "the consumer includes all ${count} installed headers")

# gacd's library installs only what its users need (server.h, config.h,
# store.h); its internals stay in server/src.
file(GLOB server_headers RELATIVE ${prefix}/include ${prefix}/include/gac/server/*)
list(LENGTH server_headers server_count)
if(server_count GREATER 3)
  message(FATAL_ERROR "${server_count} headers installed under include/gac/server (at most 3): ${server_headers}")
endif()

# gacctl next to gacd, with its bash completion where bash-completion looks.
if(GAC_WITH_GRPC)
  foreach(f bin/gacctl share/bash-completion/completions/gacctl)
    if(NOT EXISTS ${prefix}/${f})
      message(FATAL_ERROR "not installed: ${prefix}/${f}")
    endif()
  endforeach()
  run(${prefix}/bin/gacctl --help)
endif()

run(${CMAKE_COMMAND} -S ${GAC_CONSUMER_SOURCE} -B ${GAC_SCRATCH}/build -G ${GAC_GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release -DCONSUMER_WITH_AGENT=${GAC_WITH_TORCH}
    -DCONSUMER_WITH_GRPC=${GAC_WITH_GRPC} -DCONSUMER_WITH_SERVER=${GAC_WITH_SERVER})
run(${CMAKE_COMMAND} --build ${GAC_SCRATCH}/build)
run(${GAC_SCRATCH}/build/gac_consumer ${GAC_SCRATCH})
