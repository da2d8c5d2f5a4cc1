# Run by the kiln_cargo target: builds the library with cargo and records the native
# libraries its staticlib needs, for KilnConfig.cmake (KilnNativeLibs.cmake) and kiln.pc
# (native-libs.txt). cargo replays the note when nothing changed, so this is cheap.
execute_process(
  COMMAND "${CARGO}" rustc --release --lib --manifest-path "${SOURCE_DIR}/Cargo.toml"
          --target-dir "${TARGET_DIR}" --features "${FEATURES}" -- --print native-static-libs
  RESULT_VARIABLE rc
  ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cargo failed:\n${err}")
endif()
string(REGEX MATCH "native-static-libs: ([^\n]*)" _ "${err}")
set(flags "${CMAKE_MATCH_1}")
if(flags STREQUAL "")
  message(FATAL_ERROR "cargo did not print native-static-libs:\n${err}")
endif()
separate_arguments(flag_list UNIX_COMMAND "${flags}")
set(names "")
foreach(f IN LISTS flag_list)
  string(REGEX REPLACE "^-l" "" n "${f}")
  list(APPEND names "${n}")
endforeach()
file(WRITE "${OUT_DIR}/KilnNativeLibs.cmake"
  "# What Rust's staticlib needs from the system (cargo --print native-static-libs).\nset(KILN_NATIVE_STATIC_LIBS ${names})\n")
file(WRITE "${OUT_DIR}/native-libs.txt" "${flags}")
