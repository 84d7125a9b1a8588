# A test that fails with a message: cmake -DMESSAGE=<text> -P fail.cmake
message(FATAL_ERROR "${MESSAGE}")
