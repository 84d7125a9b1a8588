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
  # Without the library's precompiled header: every source on its own includes (the trees of
  # .ci/run use the header; this build is where a missing #include fails).
  set(configure_args -DHSS_SOURCE_DIR=${SOURCE_DIR} -DHSS_LIB_PCH=OFF)
endif()
if(CONSUMER_CUDA)
  list(APPEND configure_args -DHSS_CONSUMER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
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
# One CUDA runtime on the consumer's link line: hsstore's libcudart.so, never CMake's static one
# beside it (two runtimes in one process keep two sets of contexts, streams and errors).
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK}/build -- -t commands consumer
                RESULT_VARIABLE rc OUTPUT_VARIABLE commands ERROR_VARIABLE commands)
# The project's -Werror stays in its own build: no compile line of the consumer's build (its own
# sources, and hsstore's when it is a subdirectory) carries -Werror (cmake/HssWarnings.cmake).
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK}/build -- -t commands
                RESULT_VARIABLE rc OUTPUT_VARIABLE all_commands ERROR_VARIABLE all_commands)
string(REGEX MATCHALL "[^\n]* -c [^\n]*" compile_lines "${all_commands}")
if(NOT compile_lines)
  message(FATAL_ERROR "no compile command in the consumer's build:\n${all_commands}")
endif()
foreach(line IN LISTS compile_lines)
  if(line MATCHES "-Werror")
    message(FATAL_ERROR "the consumer's build inherited hsstore's -Werror:\n${line}")
  endif()
endforeach()
string(REGEX MATCH "[^\n]*-o consumer [^\n]*" link_line "${commands}")
if(NOT link_line)
  message(FATAL_ERROR "no link command for the consumer in:\n${commands}")
endif()
if(link_line MATCHES "cudart_static")
  message(FATAL_ERROR "the consumer links a second (static) CUDA runtime:\n${link_line}")
endif()
if(CONSUMER_CUDA AND NOT link_line MATCHES "libcudart\\.so|-lcudart")
  message(FATAL_ERROR "the consumer links no shared CUDA runtime:\n${link_line}")
endif()
execute_process(COMMAND ${WORK}/build/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message(STATUS "${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the consumer failed: ${out}")
endif()
