# src/ and kernels/ (the hss library): every switch over an enum names every enumerator, so adding
# an element type (or any enumerator) is a compile error wherever it must be handled.
function(hss_set_library_warnings target)
  hss_set_warnings(${target})
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wswitch-enum -Werror=switch-enum>
                                           $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wswitch-enum,-Werror=switch-enum>)
endfunction()

function(hss_set_warnings target)
  set(flags -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor)
  if(HSS_WARNINGS_AS_ERRORS)
    list(APPEND flags -Werror)
  endif()
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${flags}>)
endfunction()
