// A real array-bounds warning at -O2 on g++ 12 (tests/build_checks/warning_flags_test.cmake):
// a warning, never an error, where GCC misfires on it through libstdc++ (cmake/HssWarnings.cmake).
int table[4];
int read_past() { return table[6]; }
