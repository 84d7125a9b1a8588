// A real maybe-uninitialized warning at -O2 on g++ 12 (tests/build_checks/warning_flags_test.cmake):
// a warning, never an error, where GCC misfires on it through libstdc++ (cmake/HssWarnings.cmake).
int pick(int n) {
  int value;
  if (n > 3) value = n * 2;
  return n > 1 ? value : 0;
}
