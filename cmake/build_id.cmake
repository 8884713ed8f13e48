# Writes OUT, a header defining FLASHBACK_BUILD_COMMIT: the short commit of the source tree SRC,
# with "-dirty" when tracked files differ from it, or "unknown" outside a git checkout. Run at
# every build (the flashback_build_id target); the file is rewritten only when the text changes,
# so an unchanged tree recompiles nothing. Result files name the library they measured by it.
set(commit "unknown")
if(GIT AND EXISTS "${SRC}/.git")
  execute_process(COMMAND "${GIT}" -C "${SRC}" rev-parse --short HEAD
                  OUTPUT_VARIABLE head RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(rc EQUAL 0 AND head)
    set(commit "${head}")
    execute_process(COMMAND "${GIT}" -C "${SRC}" status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE changes RESULT_VARIABLE rc2 ERROR_QUIET)
    if(rc2 EQUAL 0 AND NOT changes STREQUAL "")
      set(commit "${commit}-dirty")
    endif()
  endif()
endif()
set(text "#pragma once\n#define FLASHBACK_BUILD_COMMIT \"${commit}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
else()
  set(old "")
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
