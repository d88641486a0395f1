# rp_add_test(NAME name SOURCES ... [LIBS ...] [LABELS ...] [SERIAL])
# The one way to add a GoogleTest binary: links GTest::gtest_main, registers every test case
# with CTest through gtest_discover_tests, and labels them (default label: unit). SERIAL: its
# cases run alone (RUN_SERIAL), for the few that compare wall-clock times measured in one run.
function(rp_add_test)
  cmake_parse_arguments(ARG "SERIAL" "NAME" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT ARG_NAME OR NOT ARG_SOURCES)
    message(FATAL_ERROR "rp_add_test needs NAME and SOURCES")
  endif()
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR})  # tests may read every room
  rp_set_warnings(${ARG_NAME})
  set(serial FALSE)
  if(ARG_SERIAL)
    set(serial TRUE)
  endif()
  gtest_discover_tests(${ARG_NAME}
    DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT 300 RUN_SERIAL ${serial}
               # GTEST_SKIP (e.g. GPU tests without a GPU) shows as "Skipped" in ctest, not "Passed".
               SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
endfunction()
