#pragma once
// Shared by the MPI tests: the process group of this test run (one per process, made by
// mpi_main.cpp).
#include "dp/process_group.hpp"

namespace mpitest {
dp::ProcessGroup& group();
}  // namespace mpitest
