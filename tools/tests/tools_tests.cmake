# Tests of the tools: included from tools/CMakeLists.txt when HSS_BUILD_TESTS is on.
set(_t ${CMAKE_CURRENT_LIST_DIR})
set(_data ${_t}/data)
set(_expect ${CMAKE_COMMAND} -P ${_t}/run_expect.cmake --)

# Workload unit tests (GoogleTest), a separate executable so tests/ need not link hss_workload.
find_package(GTest REQUIRED)
include(GoogleTest)
add_executable(hss_tools_tests ${_t}/workload_test.cpp)
target_link_libraries(hss_tools_tests PRIVATE hss_workload GTest::gtest GTest::gtest_main)
hss_set_warnings(hss_tools_tests)
gtest_discover_tests(hss_tools_tests DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "unit" TIMEOUT 120
                                                          ${HSS_HOST_TEST_PROPERTIES})

# hss_expect(NAME rc REGEX cmd...): runs cmd, asserts exit code rc and output matching REGEX.
function(hss_expect name rc regex)
  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=${rc} -DEXPECT_REGEX=${regex}
                   -P ${_t}/run_expect.cmake -- ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS "cli" TIMEOUT 120)
endfunction()

set(_hss $<TARGET_FILE:hss-cli>)
set(_demo $<TARGET_FILE:hss-demo>)

# --- hss ---------------------------------------------------------------------------------
hss_expect(cli_help 0 "usage: hss <command>" ${_hss} --help)
hss_expect(cli_no_command 2 "missing command" ${_hss})
hss_expect(cli_unknown_command 2 "unknown command 'frobnicate'" ${_hss} frobnicate)
hss_expect(cli_info 0 "hsstore [0-9]+\\.[0-9]+\\.[0-9]+.*build: CUDA (on|off).*NVTX (on|off).*devices: .*pinned memory: (available|not available).*activation kinds: hidden, query, key, value, mlp_intermediate"
           ${_hss} info)
hss_expect(cli_info_extra_argument 2 "info takes no arguments" ${_hss} info --verbose)
# The host copy strategy chosen for this machine, and a config's override of it.
hss_expect(cli_info_host_copy 0
           "host copies: .*(regular|streaming).*\\((calibration|cpu rule): .*cpu: .* loops.*copy threads: [1-8] \\(auto: [0-9]+ CPUs in the affinity mask.*parts of >= [0-9]+ KiB"
           ${_hss} info)
hss_expect(cli_info_host_copy_config 0
           "host copies: .*calls >= 1 MiB.*\\(config: hidden_state_stream_threshold_bytes\\).*copy threads: 2 \\(hidden_state_copy_threads 2\\)"
           ${_hss} info --config ${_data}/host_copy.yaml)
# The disk tier and how it reads: probed on a scratch directory in the tier's nearest existing
# parent (here the build tree's folder: its hsstore/ does not exist); the scratch is removed.
set(_disk_yaml ${CMAKE_CURRENT_BINARY_DIR}/cli_info_disk.yaml)
file(WRITE ${_disk_yaml} "local_disk: ${CMAKE_CURRENT_BINARY_DIR}/cli_info_disk\nmax_local_disk_size: 2\n")
hss_expect(cli_info_disk 0
           "disk tier: [^ ]*/cli_info_disk/hsstore, budget 2.00 GiB, reads (direct \\(O_DIRECT|buffered \\(the page cache)"
           ${_hss} info --config ${_disk_yaml})
hss_expect(cli_info_no_disk 0 "disk tier: off \\(local_disk, hidden_state_disk_path unset\\)" ${_hss} info)
hss_expect(cli_config_no_subcommand 2 "config needs a subcommand" ${_hss} config)
hss_expect(cli_config_unknown_subcommand 2 "unknown config subcommand 'lint'" ${_hss} config lint)
hss_expect(cli_config_check_no_file 2 "config check needs a FILE" ${_hss} config check)
# chunk_size 4, native storage, 1 GiB pool, bfloat16 at hidden_dim 1024: 2 KiB a token-layer, so
# 524288 tokens per GiB and 131072 chunks of 4 tokens, 262144 tokens for each of the 2 layers.
hss_expect(cli_config_check_good 0
           "good.yaml: OK.*chunk_size: 4.*hidden_state_storage_dtype: native.*524288 tokens per GiB per layer.*131072 chunks of 4 tokens for one layer = 262144 tokens for each of 2 layers"
           ${_hss} config check ${_data}/good.yaml --hidden-dim 1024)
hss_expect(cli_config_check_float32 0 "rows stored as float32 \\(4 bytes per value\\).*262144 tokens per GiB"
           ${_hss} config check ${_data}/good.yaml --hidden-dim 1024 --dtype float32)
# FP8: 1020 code bytes and a 4-byte scale a token-layer (1 KiB), so 1048576 tokens per GiB.
hss_expect(cli_config_check_fp8 0
           "fp8.yaml: OK.*hidden_state_storage_dtype: fp8_e4m3.*rows stored as fp8_e4m3 \\+ a float32 scale per row.*1048576 tokens per GiB per layer.*262144 chunks of 4 tokens for one layer = 524288 tokens for each of 2 layers"
           ${_hss} config check ${_data}/fp8.yaml --hidden-dim 1020)
hss_expect(cli_info_fp8 0 "storage dtype: fp8_e4m3 \\(lossy: 8-bit codes and a float32 scale per row"
           ${_hss} info --config ${_data}/fp8.yaml)
hss_expect(cli_config_check_missing_file 1 "config error: .*does not exist"
           ${_hss} config check ${_data}/no_such_file.yaml)
hss_expect(cli_config_check_bad_yaml 1 "config error: .*malformed YAML" ${_hss} config check
           ${_data}/bad_yaml.yaml)
hss_expect(cli_config_check_bad_value 1 "config error: .*chunk_size.*-3" ${_hss} config check
           ${_data}/bad_value.yaml)
hss_expect(cli_config_check_bad_hidden_dim 2 "--hidden-dim expects an integer, got 'wide'"
           ${_hss} config check ${_data}/good.yaml --hidden-dim wide)
hss_expect(cli_config_check_bad_dtype 2 "--dtype must be" ${_hss} config check
           ${_data}/good.yaml --dtype int8)
# Keys are a pure function of (tokens, chunk size, metadata): pinned so that a change of the key
# scheme, which would split caches across versions, shows up here.
hss_expect(cli_keys_file 0
           "^0 4 vllm@m@1@0@[0-9a-f]+@bfloat16\n4 8 vllm@m@1@0@[0-9a-f]+@bfloat16\n.*10 tokens, 2 chunks of 4"
           ${_hss} keys --tokens ${_data}/tokens.txt --chunk-size 4 --model m)
hss_expect(cli_keys_unfull 0 "8 10 vllm@@1@0@[0-9a-f]+@bfloat16.*3 chunks of 4" ${_hss} keys
           --tokens ${_data}/tokens.txt --config ${_data}/good.yaml --save-unfull-chunk)
hss_expect(cli_keys_worker 0 "^0 4 vllm@m@4@3@[0-9a-f]+@fp8\n" ${_hss} keys --tokens
           ${_data}/tokens.txt --chunk-size 4 --model m --world-size 4 --worker-id 3
           --kv-dtype fp8)
add_test(NAME cli_keys_stdin
         COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=0 -DSTDIN_FILE=${_data}/tokens.txt
                 "-DEXPECT_REGEX=^0 4 vllm@@1@0@[0-9a-f]+@bfloat16\n4 8 "
                 -P ${_t}/run_expect.cmake -- ${_hss} keys --tokens - --chunk-size 4)
set_tests_properties(cli_keys_stdin PROPERTIES LABELS "cli")
hss_expect(cli_keys_no_tokens 2 "keys needs --tokens" ${_hss} keys --chunk-size 4)
hss_expect(cli_keys_missing_file 1 "token file .*no_such_tokens.txt. does not exist" ${_hss} keys --tokens
           ${_data}/no_such_tokens.txt)
hss_expect(cli_keys_bad_token 1 "bad token 'four' at position 3" ${_hss} keys --tokens
           ${_data}/bad_tokens.txt)
hss_expect(cli_keys_negative_token 1 "bad token '-4' at position 3" ${_hss} keys --tokens
           ${_data}/negative_tokens.txt)
hss_expect(cli_keys_bad_chunk_size 2 "--chunk-size = 0 is outside" ${_hss} keys --tokens
           ${_data}/tokens.txt --chunk-size 0)
hss_expect(cli_keys_bad_config 1 "config error: .*malformed YAML" ${_hss} keys --tokens
           ${_data}/tokens.txt --config ${_data}/bad_yaml.yaml)
hss_expect(cli_keys_unknown_option 2 "unknown argument '--colour'" ${_hss} keys --colour)

# --- hss-demo --------------------------------------------------------------------------------
add_test(NAME demo_small_workload
         COMMAND ${CMAKE_COMMAND} -DDEMO=${_demo}
                 -DJSON=${CMAKE_CURRENT_BINARY_DIR}/demo_small.json -P ${_t}/check_demo_json.cmake)
set_tests_properties(demo_small_workload PROPERTIES LABELS "demo" TIMEOUT 300)
# A flipped bit in one restored row must fail the run and name request, layer and row.
hss_expect(demo_corrupt_restore_fails 1
           "MISMATCH request [0-9]+ talker layer -1 row [0-9]+ col 0: got 0x[0-9a-f]+, expected 0x[0-9a-f]+.*FAILED: 1 restored rows differ"
           ${_demo} --requests 24 --hidden-dim 256 --quiet --host --corrupt-restore)
hss_expect(demo_help 0 "usage: hss-demo.*--corrupt-restore" ${_demo} --help)
hss_expect(demo_unknown_flag 2 "unknown argument '--turbo'" ${_demo} --turbo)
hss_expect(demo_bad_layers 2 "--layers expects an integer, got 'x'" ${_demo} --layers -1,x)
hss_expect(demo_print_config 0
           "chunk_size: 256.*enable_hidden_state_cache: true.*hidden_state_layers: \\[-1, 4\\].*hidden_state_storage_dtype: native"
           ${_demo} --print-config --requests 8 --layers -1,4)
hss_expect(demo_config_file_used 0 "mismatched rows +0 .*config: [^\n]*good.yaml" ${_demo}
           --config ${_data}/good.yaml --requests 4 --hidden-dim 16 --layers -1,8 --max-prompt 512
           --quiet)
hss_expect(demo_config_hs_disabled 1 "enable_hidden_state_cache: false" ${_demo} --config
           ${_data}/hs_disabled.yaml --quiet)
hss_expect(demo_config_bad_yaml 1 "config error: .*malformed YAML" ${_demo} --config
           ${_data}/bad_yaml.yaml)
hss_expect(demo_config_from_env 0 "config: LMCACHE_CONFIG_FILE=.*good.yaml" ${_demo}
           --requests 2 --hidden-dim 16 --layers -1,8 --max-prompt 512 --quiet)
set_tests_properties(demo_config_from_env PROPERTIES ENVIRONMENT
                     "LMCACHE_CONFIG_FILE=${_data}/good.yaml")
foreach(_name demo_corrupt_restore_fails demo_help demo_unknown_flag demo_bad_layers
        demo_print_config demo_config_file_used demo_config_hs_disabled demo_config_bad_yaml
        demo_config_from_env)
  set_tests_properties(${_name} PROPERTIES LABELS "demo")
endforeach()

# --- README ----------------------------------------------------------------------------------
include(${_t}/readme_snippets.cmake)

# --- hostile input files (issue 14, bug 6 and 7): clean errors, never a hang or a crash --------
hss_expect(cli_config_check_empty_layers 0 "hidden_state_layers: \\[\\].*unused: hidden_state_layers is empty"
           ${_hss} config check ${_data}/empty_layers.yaml)
hss_expect(cli_config_check_huge_chunk 1 "config error: .*chunk_size.*4611686018427387904"
           ${_hss} config check ${_data}/huge_chunk.yaml)
hss_expect(cli_config_check_dev_zero 1 "config error: .*/dev/zero.*character device"
           ${_hss} config check /dev/zero)
hss_expect(cli_config_check_proc_mem 1 "config error: .*/proc/self/mem.*pseudo filesystem"
           ${_hss} config check /proc/self/mem)
hss_expect(cli_config_check_directory 1 "config error: .*is a directory" ${_hss} config check
           ${_data})
hss_expect(cli_keys_directory 1 "token file .* is a directory" ${_hss} keys --tokens ${_data})
hss_expect(cli_keys_dev_zero 1 "token file '/dev/zero' is a character device" ${_hss} keys
           --tokens /dev/zero)
hss_expect(cli_keys_config_dev_zero 1 "config error: .*/dev/zero" ${_hss} keys --tokens
           ${_data}/tokens.txt --config /dev/zero)
hss_expect(demo_config_dev_zero 1 "config error: .*/dev/zero" ${_demo} --config /dev/zero)
# A FIFO without a writer: the tools must refuse it, not wait for ever (timeout 20 s = failure).
set(_fifo ${CMAKE_CURRENT_BINARY_DIR}/hostile.fifo)
hss_expect(cli_config_check_fifo 1 "is a FIFO" sh -c
           "rm -f '${_fifo}.1' && mkfifo '${_fifo}.1' && timeout 20 '${_hss}' config check '${_fifo}.1'; rc=$?; rm -f '${_fifo}.1'; exit $rc")
hss_expect(cli_keys_fifo 1 "is a FIFO" sh -c
           "rm -f '${_fifo}.2' && mkfifo '${_fifo}.2' && timeout 20 '${_hss}' keys --tokens '${_fifo}.2'; rc=$?; rm -f '${_fifo}.2'; exit $rc")
hss_expect(demo_config_fifo 1 "is a FIFO" sh -c
           "rm -f '${_fifo}.3' && mkfifo '${_fifo}.3' && timeout 20 '${_demo}' --config '${_fifo}.3'; rc=$?; rm -f '${_fifo}.3'; exit $rc")

# --- hss-demo --remote: two processes sharing a redis-server that scripts/demo-remote starts --
find_program(HSS_REDIS_SERVER redis-server)
find_program(HSS_REDIS_CLI redis-cli)
if(HSS_HAVE_REMOTE AND HSS_REDIS_SERVER AND HSS_REDIS_CLI)
  hss_expect(demo_remote 0
             "thinker .*writes sent.*talker .*restored [0-9]+ of [0-9]+ stored rows.*[1-9][0-9]* hits.* 0 corrupt.* 0 mismatched rows.*OK, every restored row bit-identical"
             ${PROJECT_SOURCE_DIR}/scripts/demo-remote ${_demo} --requests 8 --max-prompt 2048)
endif()

hss_host_test_environment()  # in a model tree: no model device (CMakeLists.txt)
