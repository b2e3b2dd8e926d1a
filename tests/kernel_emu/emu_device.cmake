# The emulated GPU: a second libdpcore (build/emulated-gpu/lib/libdpcore.so) whose CUDA backend is
# the real one, dpcore's own objects of cuda_backend.cpp, cuda_conv.cpp, cuda_dnn.cpp and
# cuda_comm.cpp as compiled for the GPU, with its kernels run by the kernel emulator and the CUDA
# runtime, cuDNN, cuBLAS and NCCL replaced by the fakes in device/ (on host memory; cuDNN's
# convolutions and batch norm computed by the cpu backend; dpcore's loader of cuBLAS,
# cublas_lazy.cpp, is left out for the fake cuBLAS's functions). test_cuda and test_core run against
# it through LD_LIBRARY_PATH (ctest `emulated_gpu_*`), so the whole CUDA backend's host code, its
# kernels and its use of the libraries run in CI, which has no GPU.
set(DP_EMU_DEVICE_GEN ${CMAKE_CURRENT_BINARY_DIR}/emulated_gpu_gen)
file(GLOB dp_emu_device_cu CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/core/src/cuda/*.cu)
set(dp_emu_device_kernels)
foreach(in ${dp_emu_device_cu})
  get_filename_component(name ${in} NAME)
  set(out ${DP_EMU_DEVICE_GEN}/${name}.cpp)
  list(APPEND dp_emu_device_kernels ${out})
  add_custom_command(OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DIN=${in} -DOUT=${out} -DKEEP_NAMESPACE=ON
            -P ${CMAKE_CURRENT_SOURCE_DIR}/kernel_emu/translate.cmake
    DEPENDS ${in} ${CMAKE_CURRENT_SOURCE_DIR}/kernel_emu/translate.cmake
    COMMENT "emulated GPU: ${name}" VERBATIM)
endforeach()
file(GLOB dp_emu_device_fakes CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/kernel_emu/device/*.cpp)
set(dp_emu_runtime ${CMAKE_CURRENT_SOURCE_DIR}/kernel_emu/emu_runtime.cpp)
add_library(dpcore_emulated_gpu SHARED
            "$<FILTER:$<TARGET_OBJECTS:dpcore>,EXCLUDE,(\\.cu\\.o|cublas_lazy\\.cpp\\.o)$>"
            ${dp_emu_device_kernels} ${dp_emu_device_fakes} ${dp_emu_runtime})
set_target_properties(dpcore_emulated_gpu PROPERTIES
  OUTPUT_NAME dpcore LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/emulated-gpu/lib)
target_include_directories(dpcore_emulated_gpu PRIVATE ${PROJECT_SOURCE_DIR}/core/include
                           ${PROJECT_SOURCE_DIR}/core/src ${CMAKE_CURRENT_SOURCE_DIR}/kernel_emu)
# The kernels see the emulator's cuda_runtime.h; the fakes the real CUDA headers.
set_source_files_properties(${dp_emu_device_kernels} ${dp_emu_runtime}
  TARGET_DIRECTORY dpcore_emulated_gpu
  PROPERTIES INCLUDE_DIRECTORIES "${CMAKE_CURRENT_SOURCE_DIR}/kernel_emu/shim")
set_source_files_properties(${dp_emu_device_fakes} TARGET_DIRECTORY dpcore_emulated_gpu
  PROPERTIES INCLUDE_DIRECTORIES "${CUDAToolkit_INCLUDE_DIRS};${CUDNN_INCLUDE_DIR}")
target_compile_definitions(dpcore_emulated_gpu PRIVATE DPRUN_WITH_CUDA=1
                           DPRUN_VERSION_STRING="${PROJECT_VERSION}")
target_link_libraries(dpcore_emulated_gpu PRIVATE Threads::Threads ZLIB::ZLIB dprun_dnnl
                      OpenMP::OpenMP_CXX Boost::context)
if(DPRUN_WITH_MPI)
  target_link_libraries(dpcore_emulated_gpu PRIVATE MPI::MPI_C)
endif()
dprun_warnings(dpcore_emulated_gpu)
# Every symbol resolved at link time: a dpcore object compiled against the real CUDA headers and a
# kernel compiled against the emulator's could otherwise disagree on a signature (a cudaError_t
# parameter mangles differently) and fail only when the call is made.
target_link_options(dpcore_emulated_gpu PRIVATE -Wl,--no-undefined)

# test_cuda's groups (as cuda_* above) and test_core (its layer tests' CUDA passes must run:
# DPRUN_REQUIRE_CUDA) against the emulated GPU. Left out, each for its reason (README, "What runs
# where"): [algorithms] (the fakes compute every cuDNN algorithm alike: it would prove nothing);
# for time, the two [train] tests that take over 5 minutes here: the trainer with graphs (eight
# ResNet-18 epochs, 747 s) and the two fresh runs of one trial (414 s), on the 2-core AMD EPYC
# build machine (bench/results/emulator-fcontext-2026-12-07-amd-epyc.txt).
set(dp_emu_env "LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/emulated-gpu/lib;DPRUN_EMULATED_GPUS=2;DPRUN_SKIP_LOG=${DPRUN_SKIP_LOG}")
set(dp_emu_train_spec
    "[train]~\"cuda trainer with graphs computes*\"~\"cuda: two fresh runs*\"")
foreach(group "ops|[cuda]~[train]~[comm]~[algorithms]" "comm|[comm]" "train|${dp_emu_train_spec}")
  string(REPLACE "|" ";" parts "${group}")
  list(GET parts 0 name)
  list(GET parts 1 spec)
  add_test(NAME emulated_gpu_${name} COMMAND test_cuda -w NoTests "${spec}")
  set_tests_properties(emulated_gpu_${name} PROPERTIES TIMEOUT 1800 ENVIRONMENT "${dp_emu_env}"
                       LABELS emulated_gpu)
endforeach()
# What a residual network's bf16 step launches, by the launch census (a hidden test case).
add_test(NAME emulated_gpu_census COMMAND test_cuda -w NoTests "[.census]")
set_tests_properties(emulated_gpu_census PROPERTIES TIMEOUT 300 LABELS emulated_gpu
                     ENVIRONMENT "${dp_emu_env}")
# DPRUN_CUDA_POISON_SCRATCH=1: the backend fills each convolution pass's scratch with NaN first;
# the fake cuDNN aborts a pass whose workspace does not hold that fill when it starts (and leaves
# zeros behind), so a pass the backend forgot to fill fails here. The conv op tests, bf16 and
# fp32, planned workspaces and a captured step.
add_test(NAME emulated_gpu_ops_poisoned
         COMMAND test_cuda -w NoTests
                 "cuda conv forward*,cuda bf16 conv forward*,cuda bf16 passes planned*,cuda graph of a step*")
set_tests_properties(emulated_gpu_ops_poisoned PROPERTIES TIMEOUT 600 LABELS emulated_gpu
                     ENVIRONMENT "${dp_emu_env};DPRUN_CUDA_POISON_SCRATCH=1")
# The runner with CUDA trials (tests/runner/test_emulated_gpu_runner.cpp, hidden from
# test_runner's own run): what a trial process resolves on a GPU machine (graphs and layout
# "auto"), recorded, and captured steps equal to eager ones through the runner. Two emulated GPUs:
# one replica, and two with a GPU each (and a run with one emulated GPU, which two replicas
# share).
if(TARGET test_runner)
  add_test(NAME emulated_gpu_runner COMMAND test_runner -w NoTests "[.emulated_gpu]")
  set_tests_properties(emulated_gpu_runner PROPERTIES TIMEOUT 600 LABELS emulated_gpu
    ENVIRONMENT "LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/emulated-gpu/lib;DPRUN_EMULATED_GPUS=2;DPRUN_SKIP_LOG=${DPRUN_SKIP_LOG}")
  add_dependencies(test_runner dpcore_emulated_gpu)
endif()
# The longest tests start first (ctest runs higher costs first), so they overlap the short ones
# rather than end the run alone: train took 181 s (before [stream] and the NHWC step, 122 s
# between them, came back) and core 78 s in a full release ctest on the 2-core build machine.
set_tests_properties(emulated_gpu_train PROPERTIES COST 300)
add_dependencies(test_cuda dpcore_emulated_gpu)
if(TARGET test_core)
  add_test(NAME emulated_gpu_core COMMAND test_core -w NoTests)
  set_tests_properties(emulated_gpu_core PROPERTIES TIMEOUT 1800 LABELS emulated_gpu COST 100
                       ENVIRONMENT "${dp_emu_env};DPRUN_REQUIRE_CUDA=1")
  add_dependencies(test_core dpcore_emulated_gpu)
endif()
