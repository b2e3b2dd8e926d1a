// dprun: see cli.hpp. Everything lives in the dprun_runner library so the tests can link it.
#include "cli/cli.hpp"

int main(int argc, char** argv) { return dprun::main_cli(argc, argv); }
