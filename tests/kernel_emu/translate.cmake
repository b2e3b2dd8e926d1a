# Rewrites one CUDA source of core/src/cuda for the kernel emulator (emu_runtime.hpp):
#   k<<<grid, block, smem, stream>>>(args)
#     -> ::dp_emu::Launch(grid, block, smem, stream).named("k").with([](auto... a) { k(a...); })(args)
#   namespace dp::cuda / dp::cuda::           ->  dp::cuda_emu
# and fails when a launch is left that the rewrite did not recognise.
# (-DKEEP_NAMESPACE=ON: not the namespace, for the emulated GPU's libdpcore, emu_device.cmake).
#   cmake -DIN=file.cu -DOUT=file.cpp [-DKEEP_NAMESPACE=ON] -P translate.cmake
file(READ "${IN}" text)
# A kernel name, optionally with template arguments that hold no '<', '>' or ';'; the launch
# configuration holds no '>' (grid_for(n), dim3(a, b), ...).
string(REGEX REPLACE
  "([A-Za-z_][A-Za-z0-9_]*(<[^<>;]*>)?)[ \t\r\n]*<<<([^>]*)>>>[ \t\r\n]*\\("
  "::dp_emu::Launch(\\3).named(DP_EMU_NAME(\\1)).with([](auto... a) { \\1(a...); })("
  text "${text}")
if(text MATCHES "<<<|>>>")
  message(FATAL_ERROR "${IN}: a kernel launch the emulator's rewrite does not recognise")
endif()
if(NOT KEEP_NAMESPACE)
  string(REGEX REPLACE "dp::cuda([^_A-Za-z0-9])" "dp::cuda_emu\\1" text "${text}")
  string(REGEX MATCH "dp::cuda[^_]" left "${text}")
  if(left)
    message(FATAL_ERROR "${IN}: a dp::cuda the emulator's rewrite does not recognise")
  endif()
endif()
file(WRITE "${OUT}.tmp" "// Generated from ${IN} by tests/kernel_emu/translate.cmake: do not edit.\n${text}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
