#pragma once
// The CUDA runtime as the kernel emulator provides it (tests/kernel_emu/emu_runtime.hpp).
#include "emu_runtime.hpp"
