# cmake -P script (ctest: build_index_lock_token): the store's index lock is a compile-time rule
# (src/store/index_lock.hpp). With the library's include paths and definitions (INCLUDES,
# DEFINES, `|`-separated), COMPILER checks the syntax of each sample of lock_token_samples/:
# - holds_the_lock.cpp compiles (the samples are set up right);
# - every other sample (no token, the index or the mutex reached directly, a forged or copied
#   token, the index changed through its read-only view, the pool's granules or its entry nodes
#   taken past the write transaction) fails, and for an access reason (a private member, a deleted or missing function),
#   not for an unrelated error.
cmake_minimum_required(VERSION 3.25)
set(samples ${CMAKE_CURRENT_LIST_DIR}/lock_token_samples)
set(args -std=c++20 -fsyntax-only)
string(REPLACE "|" ";" INCLUDES "${INCLUDES}")
string(REPLACE "|" ";" DEFINES "${DEFINES}")
foreach(dir IN LISTS INCLUDES)
  list(APPEND args -I${dir})
endforeach()
foreach(def IN LISTS DEFINES)
  list(APPEND args -D${def})
endforeach()
function(check_sample name result_var output_var)
  execute_process(COMMAND ${COMPILER} ${args} ${samples}/${name}.cpp
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  set(${result_var} ${rc} PARENT_SCOPE)
  set(${output_var} "${out}" PARENT_SCOPE)
endfunction()

check_sample(holds_the_lock rc out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "holds_the_lock.cpp must compile:\n${out}")
endif()
set(refused 0)
foreach(name no_token index_without_lock forged_token raw_mutex copied_token
             index_changed_directly pool_granted_directly entry_pool_reached)
  check_sample(${name} rc out)
  if(rc EQUAL 0)
    message(FATAL_ERROR "${name}.cpp compiled: the index lock's rule does not hold")
  endif()
  if(NOT out MATCHES "private|protected|deleted|no matching|too few arguments|candidate expects|discards qualifiers|passing .const|not marked const")
    message(FATAL_ERROR "${name}.cpp failed for another reason than the lock's rule:\n${out}")
  endif()
  math(EXPR refused "${refused} + 1")
endforeach()
message(STATUS "the index lock's rule held: 1 sample compiled, ${refused} refused")
