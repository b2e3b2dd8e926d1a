# The CUDA backend's own kernels (core/src/cuda/*.cu), compiled for the CPU and run by the kernel
# emulator (emu_runtime.hpp) in test_kernels, so every build runs them, with or without CUDA. Each
# source and the headers it includes are rewritten by translate.cmake into the build tree.
set(DP_EMU_GEN ${CMAKE_CURRENT_BINARY_DIR}/kernel_emu_gen)
file(GLOB DP_EMU_CUDA_FILES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/core/src/cuda/*.cu
     ${PROJECT_SOURCE_DIR}/core/src/cuda/*.cuh)
list(APPEND DP_EMU_CUDA_FILES ${PROJECT_SOURCE_DIR}/core/src/cuda/cuda_check.hpp)
set(DP_EMU_SOURCES)
foreach(in ${DP_EMU_CUDA_FILES})
  get_filename_component(name ${in} NAME)
  if(name MATCHES "\\.cu$")
    set(out ${DP_EMU_GEN}/cuda/${name}.cpp)
    list(APPEND DP_EMU_SOURCES ${out})
  else()
    set(out ${DP_EMU_GEN}/cuda/${name})
    list(APPEND DP_EMU_HEADERS ${out})
  endif()
  add_custom_command(OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DIN=${in} -DOUT=${out} -P ${CMAKE_CURRENT_SOURCE_DIR}/kernel_emu/translate.cmake
    DEPENDS ${in} ${CMAKE_CURRENT_SOURCE_DIR}/kernel_emu/translate.cmake
    COMMENT "kernel emulator: ${name}" VERBATIM)
endforeach()
add_custom_target(dp_emu_headers DEPENDS ${DP_EMU_HEADERS})
target_sources(test_kernels PRIVATE ${DP_EMU_SOURCES})
add_dependencies(test_kernels dp_emu_headers)
# The emulator's cuda_runtime.h before anything else; the rewritten "cuda/..." headers.
target_include_directories(test_kernels BEFORE PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/kernel_emu/shim
                           ${CMAKE_CURRENT_SOURCE_DIR}/kernel_emu ${DP_EMU_GEN})
# The scheduler's fibers switch with Boost.Context's fcontext (emu_runtime.cpp says why):
# libboost-context-dev (scripts/install-deps).
find_package(Boost 1.74 REQUIRED COMPONENTS context)
target_link_libraries(test_kernels PRIVATE Boost::context)
# Under the sanitizer build the kernels are dprun's code like any other: instrumented, so an
# out-of-bounds read is caught as well as a write (emu_buffers.hpp poisons its guard zones), and
# the scheduler tells AddressSanitizer about its stack switches.
if(DPRUN_SANITIZE)
  string(REPLACE "," ";" dp_emu_sanitizers "${DPRUN_SANITIZE}")
  set(dp_emu_flags -fsanitize=${DPRUN_SANITIZE} -fno-sanitize-recover=undefined)
  set_source_files_properties(${DP_EMU_SOURCES} TARGET_DIRECTORY test_kernels
    PROPERTIES COMPILE_OPTIONS "${dp_emu_flags}")
  set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/kernel_emu/emu_runtime.cpp
    TARGET_DIRECTORY test_kernels PROPERTIES COMPILE_OPTIONS "${dp_emu_flags}")
  if("address" IN_LIST dp_emu_sanitizers)
    target_compile_definitions(test_kernels PRIVATE DP_EMU_ASAN=1)
  endif()
endif()
