# Warnings as errors for our own code (not for third-party headers, which come in as SYSTEM).
function(dprun_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-unused-parameter>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Werror,-Wno-unused-parameter --Werror all-warnings>)
endfunction()
