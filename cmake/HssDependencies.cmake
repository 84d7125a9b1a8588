# Every dependency comes from the system (scripts/bootstrap installs them); nothing is vendored
# or downloaded at build time.
find_package(Threads REQUIRED)
find_package(yaml-cpp CONFIG REQUIRED)
if(NOT TARGET yaml-cpp::yaml-cpp)
  add_library(yaml-cpp::yaml-cpp INTERFACE IMPORTED)
  target_link_libraries(yaml-cpp::yaml-cpp INTERFACE yaml-cpp)
endif()

find_package(PkgConfig REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)

if(HSS_WITH_CUDA)
  find_package(CUDAToolkit REQUIRED)
endif()

# NVTX v3 is header-only and ships with the CUDA toolkit; without it hss/nvtx falls back to a
# shim that still feeds the test trace hook.
set(HSS_HAVE_NVTX OFF)
set(_hss_nvtx_hint)
if(CUDAToolkit_INCLUDE_DIRS)
  list(APPEND _hss_nvtx_hint ${CUDAToolkit_INCLUDE_DIRS})
endif()
find_path(HSS_NVTX_INCLUDE_DIR nvtx3/nvToolsExt.h HINTS ${_hss_nvtx_hint} /usr/local/cuda/include)
if(HSS_NVTX_INCLUDE_DIR)
  set(HSS_HAVE_NVTX ON)
endif()

# hiredis is optional: with it the shared Redis/Valkey tier (hidden_state_remote_url) is built;
# without it the tier is compiled out and configuring a remote URL is a ConfigError.
option(HSS_ENABLE_REMOTE "Build the Redis/Valkey remote tier when hiredis is found" ON)
set(HSS_HAVE_REMOTE OFF)
if(HSS_ENABLE_REMOTE)
  pkg_check_modules(HIREDIS IMPORTED_TARGET hiredis)
  if(HIREDIS_FOUND)
    set(HSS_HAVE_REMOTE ON)
  endif()
endif()

# OpenSSL's libcrypto is optional: with it the keyed MAC of remote values (hidden_state_mac_key,
# HMAC-SHA256) is built; without it a configured key is a ConfigError, never unauthenticated values.
option(HSS_ENABLE_MAC "Build the keyed MAC of remote values when OpenSSL is found" ON)
set(HSS_HAVE_MAC OFF)
if(HSS_ENABLE_MAC)
  pkg_check_modules(LIBCRYPTO IMPORTED_TARGET libcrypto>=3.0)
  if(LIBCRYPTO_FOUND)
    set(HSS_HAVE_MAC ON)
  endif()
endif()
