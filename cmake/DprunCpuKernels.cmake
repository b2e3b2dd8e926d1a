# The CPU backend's kernel libraries (see dp::CpuKernels).
#
# oneDNN (Debian: libdnnl-dev 2.6): convolutions and SGEMM whose instruction set it picks at run
# time from the CPU's cpuid features, so the CPU backend is fast on any x86-64 CPU, including
# models newer than any table (OpenBLAS 0.3.21 falls to its generic kernels on CPUs its model
# table does not know). Found through the library and header rather than its CMake package,
# whose config requires OpenCL (its GPU runtime), which the CPU backend does not use.
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
find_library(DNNL_LIBRARY NAMES dnnl)
if(NOT DNNL_INCLUDE_DIR OR NOT DNNL_LIBRARY)
  message(FATAL_ERROR "oneDNN not found (oneapi/dnnl/dnnl.hpp, libdnnl): install libdnnl-dev "
                      "(scripts/install-deps)")
endif()
file(STRINGS ${DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_config.h DNNL_THREADING
     REGEX "^#define DNNL_CPU_THREADING_RUNTIME ")
if(NOT DNNL_THREADING MATCHES "DNNL_RUNTIME_OMP")
  # The backend sets each primitive's thread count through OpenMP (see core/src/cpu/onednn.hpp).
  message(FATAL_ERROR "oneDNN at ${DNNL_LIBRARY} is not built with the OpenMP runtime "
                      "(${DNNL_THREADING}); install Debian's libdnnl-dev")
endif()
add_library(dprun_dnnl INTERFACE)
target_include_directories(dprun_dnnl SYSTEM INTERFACE ${DNNL_INCLUDE_DIR})
target_link_libraries(dprun_dnnl INTERFACE ${DNNL_LIBRARY})

# OpenBLAS (the blas kernels): its headers at build time, the library loaded with dlopen at run
# time (core/src/cpu/openblas.hpp says why), by its soname, and from where it was found here
# when the loader's search path does not have it.
pkg_check_modules(OPENBLAS REQUIRED openblas)
find_library(DPRUN_OPENBLAS_LIBRARY NAMES openblas HINTS ${OPENBLAS_LIBRARY_DIRS} REQUIRED)
execute_process(COMMAND ${CMAKE_OBJDUMP} -p ${DPRUN_OPENBLAS_LIBRARY} OUTPUT_VARIABLE _objdump
                RESULT_VARIABLE _objdump_rc)
string(REGEX MATCH "SONAME +([^\n ]+)" _soname "${_objdump}")
if(NOT _objdump_rc EQUAL 0 OR NOT CMAKE_MATCH_1)
  message(FATAL_ERROR "cannot read the soname of ${DPRUN_OPENBLAS_LIBRARY} with ${CMAKE_OBJDUMP}")
endif()
set(DPRUN_OPENBLAS_SONAME ${CMAKE_MATCH_1})
get_filename_component(_openblas_dir ${DPRUN_OPENBLAS_LIBRARY} DIRECTORY)
add_library(dprun_openblas_headers INTERFACE)
target_include_directories(dprun_openblas_headers SYSTEM INTERFACE ${OPENBLAS_INCLUDE_DIRS})
target_compile_definitions(dprun_openblas_headers INTERFACE
  DPRUN_OPENBLAS_SONAME="${DPRUN_OPENBLAS_SONAME}"
  DPRUN_OPENBLAS_PATH="${_openblas_dir}/${DPRUN_OPENBLAS_SONAME}")
target_link_libraries(dprun_openblas_headers INTERFACE ${CMAKE_DL_LIBS})
message(STATUS "dprun: oneDNN ${DNNL_LIBRARY}; OpenBLAS ${DPRUN_OPENBLAS_SONAME} (loaded at run time)")
