# Run by ctest after the tests (CTestCustom.cmake): what was skipped, and why, so the reasons
# reach ctest's normal output rather than hiding behind -V. Each test entry that skipped a part
# also exits 77, which ctest lists as "Not Run (Skipped)" among the results above.
if(EXISTS "${SKIP_LOG}")
  file(STRINGS "${SKIP_LOG}" lines)
  if(lines)
    list(REMOVE_DUPLICATES lines)
    list(SORT lines)
    list(LENGTH lines n)
    list(JOIN lines "\n" text)
    message("SKIPPED on this machine: ${n} test(s) or parts of them, with the reason:\n${text}")
  endif()
endif()
