# cmake -P script: builds tests/consumer against hsstore, either installed (MODE=install) or
# through add_subdirectory (MODE=subdirectory), and runs it.
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE ${WORK})
if(MODE STREQUAL "install")
  execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --component hss_dev --prefix ${WORK}/prefix
                  RESULT_VARIABLE rc OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cmake --install failed: ${rc}")
  endif()
  set(configure_args -DCMAKE_PREFIX_PATH=${WORK}/prefix)
else()
  set(configure_args -DHSS_SOURCE_DIR=${SOURCE_DIR})
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK}/build -G Ninja
                        -DCMAKE_BUILD_TYPE=Release ${configure_args}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the consumer failed:\n${out}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK}/build -j 2
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the consumer failed:\n${out}")
endif()
execute_process(COMMAND ${WORK}/build/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message(STATUS "${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the consumer failed: ${out}")
endif()
