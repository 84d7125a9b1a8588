# Finds llama.cpp's libllama and ggml with their headers, and makes the imported targets
# llama::llama (links llama::ggml) and llama::ggml.
#
# Where: LLAMA_CPP_ROOT (cache variable or environment), else the prefix scripts/llama_cpp_prefix
# makes (/var/cache/hsstore/llama-cpp, or HSS_LLAMA_CPP_PREFIX). Two layouts are understood:
#   <root>/llama_cpp/{include,lib}   llama-cpp-python's package (the script's prefix links it there)
#   <root>/{include,lib}             a llama.cpp `cmake --install` prefix (a CUDA build, say)
# Sets LlamaCpp_FOUND, LlamaCpp_INCLUDE_DIR, LlamaCpp_LIBRARY_DIR, and LlamaCpp_WHY_NOT (a
# sentence) when it is not found.
set(_llama_default_root "/var/cache/hsstore/llama-cpp")
if(DEFINED ENV{HSS_LLAMA_CPP_PREFIX})
  set(_llama_default_root "$ENV{HSS_LLAMA_CPP_PREFIX}")
endif()
if(NOT LLAMA_CPP_ROOT AND DEFINED ENV{LLAMA_CPP_ROOT})
  set(LLAMA_CPP_ROOT "$ENV{LLAMA_CPP_ROOT}")
endif()
if(NOT LLAMA_CPP_ROOT)
  set(LLAMA_CPP_ROOT "${_llama_default_root}")
endif()
set(LLAMA_CPP_ROOT "${LLAMA_CPP_ROOT}" CACHE PATH "llama.cpp prefix (scripts/llama_cpp_prefix)")
# Another root than last configure: search again (find_* keep what they found in the cache).
if(NOT "${LLAMA_CPP_ROOT}" STREQUAL "${_LlamaCpp_SEARCHED_ROOT}")
  unset(LlamaCpp_INCLUDE_DIR CACHE)
  unset(LlamaCpp_LLAMA_LIBRARY CACHE)
  unset(LlamaCpp_GGML_LIBRARY CACHE)
  unset(LlamaCpp_GGML_BASE_LIBRARY CACHE)
  set(_LlamaCpp_SEARCHED_ROOT "${LLAMA_CPP_ROOT}" CACHE INTERNAL "")
endif()

find_path(LlamaCpp_INCLUDE_DIR llama.h
  PATHS "${LLAMA_CPP_ROOT}/llama_cpp/include" "${LLAMA_CPP_ROOT}/include" NO_DEFAULT_PATH)
find_library(LlamaCpp_LLAMA_LIBRARY llama
  PATHS "${LLAMA_CPP_ROOT}/llama_cpp/lib" "${LLAMA_CPP_ROOT}/lib" "${LLAMA_CPP_ROOT}/lib64"
  NO_DEFAULT_PATH)
find_library(LlamaCpp_GGML_LIBRARY ggml
  PATHS "${LLAMA_CPP_ROOT}/llama_cpp/lib" "${LLAMA_CPP_ROOT}/lib" "${LLAMA_CPP_ROOT}/lib64"
  NO_DEFAULT_PATH)
find_library(LlamaCpp_GGML_BASE_LIBRARY ggml-base
  PATHS "${LLAMA_CPP_ROOT}/llama_cpp/lib" "${LLAMA_CPP_ROOT}/lib" "${LLAMA_CPP_ROOT}/lib64"
  NO_DEFAULT_PATH)

set(LlamaCpp_FOUND FALSE)
if(NOT LlamaCpp_INCLUDE_DIR OR NOT EXISTS "${LlamaCpp_INCLUDE_DIR}/ggml-backend.h")
  set(LlamaCpp_WHY_NOT "no llama.h and ggml-backend.h under LLAMA_CPP_ROOT=${LLAMA_CPP_ROOT}")
elseif(NOT LlamaCpp_LLAMA_LIBRARY OR NOT LlamaCpp_GGML_LIBRARY OR NOT LlamaCpp_GGML_BASE_LIBRARY)
  set(LlamaCpp_WHY_NOT "no libllama, libggml and libggml-base under LLAMA_CPP_ROOT=${LLAMA_CPP_ROOT}")
else()
  set(LlamaCpp_FOUND TRUE)
  get_filename_component(LlamaCpp_LIBRARY_DIR "${LlamaCpp_LLAMA_LIBRARY}" DIRECTORY)
  if(NOT TARGET llama::ggml)
    add_library(llama::ggml_base SHARED IMPORTED)
    set_target_properties(llama::ggml_base PROPERTIES IMPORTED_LOCATION "${LlamaCpp_GGML_BASE_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${LlamaCpp_INCLUDE_DIR}")
    add_library(llama::ggml SHARED IMPORTED)
    set_target_properties(llama::ggml PROPERTIES IMPORTED_LOCATION "${LlamaCpp_GGML_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${LlamaCpp_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES llama::ggml_base)
    add_library(llama::llama SHARED IMPORTED)
    set_target_properties(llama::llama PROPERTIES IMPORTED_LOCATION "${LlamaCpp_LLAMA_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${LlamaCpp_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES llama::ggml)
  endif()
endif()
