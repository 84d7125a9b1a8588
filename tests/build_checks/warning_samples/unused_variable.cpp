// An ordinary warning (-Wunused-variable): an error wherever HSS_WARNINGS_AS_ERRORS is on.
int count() {
  int unused = 3;
  return 1;
}
