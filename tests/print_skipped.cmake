# Run by ctest after the tests (CTestCustom.cmake): what was skipped, and why, so the reasons
# reach ctest's normal output rather than hiding behind -V.
if(EXISTS "${SKIP_LOG}")
  file(READ "${SKIP_LOG}" skipped)
  if(NOT skipped STREQUAL "")
    string(STRIP "${skipped}" skipped)
    message("Not run on this machine (tests or parts of them):\n${skipped}")
  endif()
endif()
