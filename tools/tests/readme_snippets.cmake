# Every ```cpp block of README.md must compile and link against hss::hss.
#
# At configure time each block becomes ${CMAKE_CURRENT_BINARY_DIR}/readme/snippet_<n>.cpp and an
# executable target outside `all` (a README typo must not break everyone's build). The ctest test
# `readme_snippets` (label docs) builds those targets. Rules for a block:
#   * it has a main(): compiled as is;
#   * it defines functions or types at file scope (a line at column 0 like "int f(...) {" or
#     starting with namespace, struct, class, template, enum): compiled with an empty main();
#   * otherwise it is a fragment: #include lines stay at the top, the rest goes into main(), and
#     hss/hss.hpp is included first.
# No README or no cpp block is a failing test with a message, not a configure error.

set(_readme "${PROJECT_SOURCE_DIR}/README.md")
set(_out_dir "${CMAKE_CURRENT_BINARY_DIR}/readme")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_readme}")
file(REMOVE_RECURSE "${_out_dir}")
file(MAKE_DIRECTORY "${_out_dir}")

set(_blocks)
if(EXISTS "${_readme}")
  file(READ "${_readme}" _text)
  # A CMake list would split on ';' and join lines across an unbalanced '[': hide all three.
  string(REPLACE ";" "@HSS_SEMI@" _text "${_text}")
  string(REPLACE "[" "@HSS_LB@" _text "${_text}")
  string(REPLACE "]" "@HSS_RB@" _text "${_text}")
  string(REPLACE "\n" ";" _lines "${_text}")
  set(_in FALSE)
  set(_count 0)
  foreach(_line IN LISTS _lines)
    if(NOT _in AND _line MATCHES "^[ \t]*```(cpp|c\\+\\+|cxx)[ \t]*$")
      set(_in TRUE)
      set(_body "")
    elseif(_in AND _line MATCHES "^[ \t]*```[ \t]*$")
      set(_in FALSE)
      math(EXPR _count "${_count} + 1")
      set(_block_${_count} "${_body}")
    elseif(_in)
      string(APPEND _body "${_line}\n")
    endif()
  endforeach()
endif()

set(_targets)
if(EXISTS "${_readme}" AND _count GREATER 0)
  foreach(_n RANGE 1 ${_count})
    set(_body "${_block_${_n}}")
    if(_body MATCHES "(^|\n)[^\n]*[ \t]main[ \t]*\\(")
      set(_source "${_body}")
    elseif(_body MATCHES "(^|\n)(namespace|struct|class|template|enum)[ \t]"
           OR _body MATCHES "(^|\n)[A-Za-z_][A-Za-z0-9_:<>,]*[ \t&*]+[A-Za-z_][A-Za-z0-9_:]*\\([^\n=]*\\)[ \t]*(const[ \t]*)?{")
      set(_source "${_body}\nint main() { return 0; }\n")
    else()
      set(_includes "#include \"hss/hss.hpp\"\n")
      set(_statements "")
      string(REPLACE "\n" ";" _block_lines "${_body}")
      foreach(_l IN LISTS _block_lines)
        if(_l MATCHES "^[ \t]*#include")
          string(APPEND _includes "${_l}\n")
        else()
          string(APPEND _statements "  ${_l}\n")
        endif()
      endforeach()
      set(_source "${_includes}\nint main() {\n${_statements}  return 0;\n}\n")
    endif()
    string(REPLACE "@HSS_SEMI@" ";" _source "${_source}")
    string(REPLACE "@HSS_LB@" "[" _source "${_source}")
    string(REPLACE "@HSS_RB@" "]" _source "${_source}")
    set(_file "${_out_dir}/snippet_${_n}.cpp")
    file(WRITE "${_file}" "// Generated from README.md, ```cpp block ${_n}. Do not edit.\n${_source}")
    add_executable(hss_readme_snippet_${_n} EXCLUDE_FROM_ALL "${_file}")
    target_link_libraries(hss_readme_snippet_${_n} PRIVATE hss::hss)
    # Warnings on (the README should be exemplary) but not errors: a fragment's unused variable
    # is fine in prose.
    target_compile_options(hss_readme_snippet_${_n} PRIVATE -Wall -Wextra)
    list(APPEND _targets hss_readme_snippet_${_n})
  endforeach()
  add_custom_target(hss_readme_snippets DEPENDS ${_targets})
  add_test(NAME readme_snippets
           COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target hss_readme_snippets)
  message(STATUS "README.md: ${_count} C++ blocks under test (readme_snippets)")
else()
  if(EXISTS "${_readme}")
    set(_why "README.md has no ```cpp block")
  else()
    set(_why "README.md does not exist")
  endif()
  add_test(NAME readme_snippets
           COMMAND ${CMAKE_COMMAND} -DMESSAGE=${_why} -P ${CMAKE_CURRENT_LIST_DIR}/fail.cmake)
endif()
set_tests_properties(readme_snippets PROPERTIES LABELS docs TIMEOUT 600)
