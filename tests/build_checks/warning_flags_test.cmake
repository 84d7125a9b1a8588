# cmake -P script (ctest: build_warning_flags): the project's warning flags (cmake/HssWarnings.cmake,
# passed in FLAGS) compile each sample of warning_samples/ with COMPILER at -O2, as a library source
# is compiled. With -Werror on (WERROR=ON):
# - an ordinary warning (unused_variable.cpp) fails the compile: -Werror is really on;
# - on g++ 12 and 13 (MISFIRING=ON), each sample of a diagnostic GCC misfires on through
#   libstdc++ compiles, and its warning is still printed: a false positive cannot break a build,
#   and a real one stays visible.
cmake_minimum_required(VERSION 3.25)
set(samples ${CMAKE_CURRENT_LIST_DIR}/warning_samples)
function(compile_sample name result_var output_var)
  execute_process(COMMAND ${COMPILER} -std=c++20 -O2 ${FLAGS} -c ${samples}/${name}.cpp -o ${WORK}/${name}.o
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  set(${result_var} ${rc} PARENT_SCOPE)
  set(${output_var} "${out}" PARENT_SCOPE)
endfunction()
file(MAKE_DIRECTORY ${WORK})
separate_arguments(FLAGS UNIX_COMMAND "${FLAGS}")

compile_sample(unused_variable rc out)
if(WERROR AND rc EQUAL 0)
  message(FATAL_ERROR "-Werror is not on: an unused variable compiled with ${FLAGS}")
endif()
if(NOT WERROR AND NOT rc EQUAL 0)
  message(FATAL_ERROR "without -Werror an unused variable failed the compile:\n${out}")
endif()
set(checked 1)
if(MISFIRING)
  foreach(name array_bounds restrict maybe_uninitialized stringop_overread)
    string(REPLACE "_" "-" warning ${name})
    compile_sample(${name} rc out)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "a -W${warning} warning failed the compile (it must stay a warning):\n${out}")
    endif()
    if(NOT out MATCHES "-W${warning}")
      message(FATAL_ERROR "the -W${warning} sample printed no -W${warning} warning:\n${out}")
    endif()
    math(EXPR checked "${checked} + 1")
  endforeach()
endif()
message(STATUS "${checked} warning samples behaved as cmake/HssWarnings.cmake says")
