# Helpers that give every library and unit test the project's warnings and, when
# VF_SANITIZER_TESTS is on, sanitizer variants built from the same sources:
#   <lib>_asan / <test>_asan : AddressSanitizer + UndefinedBehaviorSanitizer
#   <lib>_tsan / <test>_tsan : ThreadSanitizer (only for tests marked TSAN: the concurrent parts),
#                              run with VF_TSAN_OPTIONS

set(VF_WARNING_FLAGS -Wall -Wextra -Wshadow -Wnon-virtual-dtor -Wold-style-cast -Wcast-align
    -Wunused -Woverloaded-virtual -Wnull-dereference -Wformat=2 -Wimplicit-fallthrough)
if(VF_WERROR)
  list(APPEND VF_WARNING_FLAGS -Werror)
endif()

set(VF_ASAN_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined
    -fno-omit-frame-pointer)
set(VF_TSAN_FLAGS -fsanitize=thread -fno-omit-frame-pointer)
# cpprest and Gloo are Debian's uninstrumented builds: see the suppressions file for what is
# left out and why.
set(VF_TSAN_OPTIONS
    "suppressions=${PROJECT_SOURCE_DIR}/cmake/tsan-suppressions.txt:ignore_noninstrumented_modules=1")

# The sanitizer variants are compiled with line tables only (-g1, after the build type's -g):
# a report needs function names, files and lines, not types and variables, and full debug
# information of the cpprest/Asio-heavy sources is most of a cold build's time on 2 cores.
function(_vf_apply_variant target variant)
  target_compile_options(${target} PRIVATE ${VF_WARNING_FLAGS})
  if(variant STREQUAL "asan")
    target_compile_options(${target} PRIVATE ${VF_ASAN_FLAGS} -O1 -g1)
    target_link_options(${target} PRIVATE ${VF_ASAN_FLAGS})
  elseif(variant STREQUAL "tsan")
    target_compile_options(${target} PRIVATE ${VF_TSAN_FLAGS} -O1 -g1)
    target_link_options(${target} PRIVATE ${VF_TSAN_FLAGS})
  endif()
endfunction()

# A unit test's sources compile as one translation unit (a unity build: each of them parses
# the same GoogleTest, JSON and cpprest headers and instantiates the same templates, which is
# most of a cold build's time on 2 cores), and its plain variant with line tables only, like
# the sanitizer variants: a failed test needs files and lines, not types and variables. The
# shipped binaries and their libraries keep the build type's full debug information.
# VF_UNITY_TESTS=OFF compiles each test source alone (the test sources must work both ways).
option(VF_UNITY_TESTS "Compile each unit test's sources as one translation unit" ON)
# The sources of unit test NAME as one translation unit (VF_UNITY_TESTS): a file in the build
# tree that includes each of them by its path from the repository's root, which the tests' -I
# finds. Written by hand because CMake's own UNITY_BUILD (3.25) includes them by absolute path:
# a clone at another path then misses the compiler cache for every test, where a relative path
# keeps the key the same (ccache's base_dir rewrites the -I, not a file's contents).
# scripts/tidy.sh reads the includes back to check each source with this file's flags.
function(_vf_unity_source name out)
  set(content "// ${name}'s sources as one translation unit (cmake/VfTargets.cmake)\n")
  foreach(src ${ARGN})
    get_filename_component(abs ${src} ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
    file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${abs})
    if(rel MATCHES "^\\.\\./")
      set(rel ${abs})  # outside the repository (none yet): as it is
    endif()
    string(APPEND content "#include \"${rel}\"\n")
  endforeach()
  set(file ${CMAKE_CURRENT_BINARY_DIR}/${name}_unity.cc)
  file(CONFIGURE OUTPUT ${file} CONTENT "${content}" @ONLY)  # written only when it changes
  set(${out} ${file} PARENT_SCOPE)
endfunction()

function(_vf_test_build_options target variant)
  if(VF_UNITY_TESTS)
    # GCC's -Wnull-dereference follows paths through what it inlined, and the more one
    # translation unit holds, the more it inlines: in a unity test it flags nlohmann::json's own
    # internals (json.hpp's is_string() under value()), a false positive. The project's sources
    # (the libraries) keep the warning.
    target_compile_options(${target} PRIVATE -Wno-null-dereference)
  endif()
  if(variant STREQUAL "")
    target_compile_options(${target} PRIVATE -g1)
  endif()
endfunction()

# vf_library(NAME SOURCES ... [PUBLIC_DEPS ...] [VF_DEPS ...] [VARIANTS asan tsan])
#   VF_DEPS are other vf_library names; variants link the matching variant of each.
function(vf_library name)
  cmake_parse_arguments(A "" "" "SOURCES;PUBLIC_DEPS;VF_DEPS;VARIANTS" ${ARGN})
  set(variants "")
  if(VF_SANITIZER_TESTS)
    set(variants ${A_VARIANTS})
  endif()
  foreach(variant "" ${variants})
    if(variant STREQUAL "")
      set(t ${name})
    else()
      set(t ${name}_${variant})
    endif()
    add_library(${t} STATIC ${A_SOURCES})
    target_include_directories(${t} PUBLIC ${PROJECT_SOURCE_DIR})
    target_link_libraries(${t} PUBLIC ${A_PUBLIC_DEPS})
    foreach(dep ${A_VF_DEPS})
      if(variant STREQUAL "")
        target_link_libraries(${t} PUBLIC ${dep})
      else()
        target_link_libraries(${t} PUBLIC ${dep}_${variant})
      endif()
    endforeach()
    _vf_apply_variant(${t} "${variant}")
  endforeach()
endfunction()

# The object that checks an _asan test's leaks when its cases end rather than at exit (see
# the source for why), built once for all of them.
function(_vf_leak_check_asan)
  if(NOT TARGET vf_leak_check_asan)
    add_library(vf_leak_check_asan OBJECT ${PROJECT_SOURCE_DIR}/cmake/leak_check_asan.cc)
    target_link_libraries(vf_leak_check_asan PRIVATE GTest::gtest)
    _vf_apply_variant(vf_leak_check_asan asan)
  endif()
endfunction()

# vf_test(NAME SOURCES ... [VF_DEPS ...] [DEPS ...] [VARIANTS asan tsan] [LABELS ...]
#         [RESOURCE_LOCK NAME])
#   Registers each GoogleTest case with ctest; variants get their own executables and labels.
#   RESOURCE_LOCK: cases that need one thing to themselves (gpu: the whole GPU) run one at a time.
function(vf_test name)
  cmake_parse_arguments(A "" "RESOURCE_LOCK" "SOURCES;VF_DEPS;DEPS;VARIANTS;LABELS" ${ARGN})
  if(NOT VF_BUILD_TESTS)
    return()
  endif()
  set(lock "")
  if(A_RESOURCE_LOCK)
    set(lock RESOURCE_LOCK ${A_RESOURCE_LOCK})
  endif()
  set(variants "")
  if(VF_SANITIZER_TESTS)
    set(variants ${A_VARIANTS})
  endif()
  set(sources ${A_SOURCES})
  if(VF_UNITY_TESTS)
    _vf_unity_source(${name} sources ${A_SOURCES})
  endif()
  foreach(variant "" ${variants})
    if(variant STREQUAL "")
      set(t ${name})
      set(deps ${A_VF_DEPS})
      set(labels unit ${A_LABELS})
    else()
      set(t ${name}_${variant})
      set(deps "")
      foreach(dep ${A_VF_DEPS})
        list(APPEND deps ${dep}_${variant})
      endforeach()
      # One label only: gtest_discover_tests flattens its properties into name-value pairs, so
      # a second label would be read as a property name and the properties after it (the TSan
      # options among them) lost. `ctest -L LABEL` runs a test's plain build.
      set(labels ${variant})
    endif()
    add_executable(${t} ${sources})
    target_link_libraries(${t} PRIVATE ${deps} ${A_DEPS} GTest::gtest GTest::gtest_main)
    if(variant STREQUAL "asan")
      _vf_leak_check_asan()
      target_link_libraries(${t} PRIVATE vf_leak_check_asan)
    endif()
    _vf_apply_variant(${t} "${variant}")
    _vf_test_build_options(${t} "${variant}")
    set(env "")
    if(variant STREQUAL "tsan")
      set(env ENVIRONMENT "TSAN_OPTIONS=${VF_TSAN_OPTIONS}")
    endif()
    gtest_discover_tests(${t} TEST_PREFIX "${t}." DISCOVERY_MODE PRE_TEST
                         PROPERTIES LABELS "${labels}" TIMEOUT 300 ${lock} ${env})
  endforeach()
endfunction()

# vf_fuzz(NAME SOURCES ... VF_DEPS ... [DEPS ...])
#   A libFuzzer target: SOURCES define LLVMFuzzerTestOneInput; its seed corpus is the folder
#   fuzz_corpus/NAME beside them. libFuzzer needs clang, so scripts/build.sh configures a second
#   tree with VF_FUZZ=ON and clang in $VF_FUZZ_DIR (build/fuzz). There, NAME is the fuzzer,
#   instrumented with ASan and UBSan. In the main tree (gcc), NAME_replay runs the seed corpus
#   through the same function under ASan (test fuzz.NAME.corpus, label unit), and the test
#   fuzz.NAME (label fuzz) runs the clang fuzzer for VF_FUZZ_SECONDS from that corpus; an input
#   that crashes it is kept under fuzz-artifacts/ in the build folder.
set(VF_FUZZ_DIR "${PROJECT_BINARY_DIR}/fuzz" CACHE PATH "The clang tree with the fuzzers")
set(VF_FUZZ_SECONDS 20 CACHE STRING "How long the suite runs each fuzzer")
function(vf_fuzz name)
  cmake_parse_arguments(A "" "" "SOURCES;VF_DEPS;DEPS" ${ARGN})
  set(corpus ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_corpus/${name})
  if(VF_FUZZ)
    add_executable(${name} ${A_SOURCES})
    target_link_libraries(${name} PRIVATE ${A_VF_DEPS} ${A_DEPS})
    target_link_options(${name} PRIVATE -fsanitize=fuzzer)
    add_dependencies(vf_fuzzers ${name})
    return()
  endif()
  if(NOT VF_BUILD_TESTS OR NOT VF_SANITIZER_TESTS)
    return()
  endif()
  set(deps "")
  foreach(dep ${A_VF_DEPS})
    list(APPEND deps ${dep}_asan)
  endforeach()
  add_executable(${name}_replay ${A_SOURCES} ${PROJECT_SOURCE_DIR}/runtime/fuzz_replay.cc)
  target_link_libraries(${name}_replay PRIVATE ${deps} ${A_DEPS})
  _vf_apply_variant(${name}_replay asan)
  add_test(NAME fuzz.${name}.corpus COMMAND ${name}_replay ${corpus})
  set_tests_properties(fuzz.${name}.corpus PROPERTIES LABELS "unit;asan" TIMEOUT 300)
  set(work ${PROJECT_BINARY_DIR}/fuzz-work/${name})
  set(artifacts ${PROJECT_BINARY_DIR}/fuzz-artifacts)
  add_test(NAME fuzz.${name}
           COMMAND sh -c "mkdir -p '${work}' '${artifacts}' && exec \"$0\" \"$@\""
                   ${VF_FUZZ_DIR}/bin/${name} -max_total_time=${VF_FUZZ_SECONDS} -timeout=10
                   -rss_limit_mb=2048 -print_final_stats=1
                   -artifact_prefix=${artifacts}/${name}- ${work} ${corpus})
  set_tests_properties(fuzz.${name} PROPERTIES LABELS fuzz TIMEOUT 300)
endfunction()
