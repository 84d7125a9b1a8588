# Adding an element type must be a compile error wherever it has to be handled: the library's
# sources compiled with one more ElemType enumerator (HSS_ELEM_TYPE_PROBE) and -Wswitch-enum as
# an error fail, naming every switch over element types (the kernels' conversions and layout, the
# host copy's widening, the DType and wire-code mapping). clang reports a switch with no default
# arm that misses an enumerator under -Wswitch (g++ under both): errors under both. Run as
#   cmake -DCXX=<compiler> -DSOURCE_DIR=<repo> -P element_types_exhaustive.cmake
set(sources src/datapath/host/host_data_path.cpp src/datapath/host/host_copy.cpp
            src/format/value_codec.cpp src/datapath/batch_tiles.cpp)
set(expected kernels/hss/kernels/convert.hpp kernels/hss/kernels/elem_visit.hpp
             kernels/hss/kernels/layout.hpp src/datapath/host/host_copy.cpp
             src/format/dtype_codes.hpp)
set(all_output "")
foreach(source IN LISTS sources)
  execute_process(
    COMMAND ${CXX} -std=c++20 -fsyntax-only -Wswitch -Wswitch-enum -Werror=switch -Werror=switch-enum
            -DHSS_ELEM_TYPE_PROBE -DHSS_WITH_CUDA=0 -DHSS_HAVE_NVTX=0
            -I${SOURCE_DIR}/include -I${SOURCE_DIR}/src -I${SOURCE_DIR}/kernels
            ${SOURCE_DIR}/${source}
    RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(result EQUAL 0)
    message(FATAL_ERROR "${source} compiled with an element type no switch handles")
  endif()
  string(APPEND all_output "${out}${err}")
endforeach()
foreach(file IN LISTS expected)
  string(REGEX MATCH "${file}:[0-9]+:[0-9]+: error: enumeration value [^ ]*kProbe[^ ]* not handled"
         found "${all_output}")
  if(NOT found)
    message(FATAL_ERROR "no switch-enum error for the probe type in ${file}:\n${all_output}")
  endif()
endforeach()
message(STATUS "element types exhaustive: the probe type fails in every expected file")
