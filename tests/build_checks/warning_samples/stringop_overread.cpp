// A real stringop-overread warning at -O2 on g++ 12 (tests/build_checks/warning_flags_test.cmake):
// a warning, never an error, where GCC misfires on it through libstdc++ (cmake/HssWarnings.cmake).
#include <cstring>
const char four[4] = {1, 2, 3, 4};
unsigned long length() { return std::strlen(four); }
