# The project's warning flags, in one place (docs/reliability.md, "Warnings and compilers").
#
# Every warning is an error in the project's own build (HSS_WARNINGS_AS_ERRORS, on only when
# hsstore is the top-level project: a consumer's add_subdirectory or find_package build never
# inherits -Werror; the flags are PRIVATE, so the exported target carries none of them).
#
# But not the middle-end diagnostics that GCC 12 and 13 raise from inside libstdc++'s inlined
# code: -Warray-bounds, -Wstringop-overflow, -Wstringop-overread, -Wrestrict and
# -Wmaybe-uninitialized depend on inlining and value-range propagation, and they misfire on
# std::string, std::vector and std::optional there (GCC bugs 105329, 105545, 105651, 106199,
# 107138; one broke `make test`'s model tree: config_yaml.cpp at -O2 with the precompiled
# header, `substr(...) + "..."`). On those compilers they stay warnings, printed, never errors:
# a false positive in a header we do not own must not stop a user's build, and the project's
# trees still build warning-free (each build prints none; a new one is visible). clang 14 keeps
# its own -Warray-bounds and -Wuninitialized as errors, and ASan + UBSan check bounds at run time.
set(HSS_GCC_MISFIRING_WARNINGS array-bounds stringop-overflow stringop-overread restrict
                               maybe-uninitialized)

# The C++ warning flags of the project's targets, for this compiler: into `out`.
function(hss_warning_flags out)
  set(flags -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor)
  if(HSS_WARNINGS_AS_ERRORS)
    list(APPEND flags -Werror)
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12
       AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 14)
      foreach(warning IN LISTS HSS_GCC_MISFIRING_WARNINGS)
        list(APPEND flags -Wno-error=${warning})
      endforeach()
    endif()
  endif()
  set(${out} ${flags} PARENT_SCOPE)
endfunction()

# src/ and kernels/ (the hss library): every switch over an enum names every enumerator, so adding
# an element type (or any enumerator) is a compile error wherever it must be handled.
# (An error only in the project's own build, like every warning.)
function(hss_set_library_warnings target)
  hss_set_warnings(${target})
  if(HSS_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wswitch-enum -Werror=switch-enum>
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wswitch-enum,-Werror=switch-enum>)
  else()
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wswitch-enum>
                                             $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wswitch-enum>)
  endif()
endfunction()

function(hss_set_warnings target)
  hss_warning_flags(flags)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${flags}>)
endfunction()
