# Warnings as errors for our own code (not for third-party headers, which come in as SYSTEM).
function(dprun_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-unused-parameter>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Werror,-Wno-unused-parameter --Werror all-warnings>)
endfunction()

# Use ccache when it is installed (several build trees of one checkout share its cache).
find_program(DPRUN_CCACHE ccache)
if(DPRUN_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${DPRUN_CCACHE} CACHE STRING "")
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${DPRUN_CCACHE} CACHE STRING "")
endif()
