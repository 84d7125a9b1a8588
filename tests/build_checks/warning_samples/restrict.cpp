// A real restrict warning at -O2 on g++ 12 (tests/build_checks/warning_flags_test.cmake):
// a warning, never an error, where GCC misfires on it through libstdc++ (cmake/HssWarnings.cmake).
#include <cstdio>
void echo(char* buffer) { std::sprintf(buffer, "%s!", buffer); }
