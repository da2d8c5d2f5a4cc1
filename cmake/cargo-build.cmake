# Run by the kiln_cargo target: builds the library with a plain `cargo build`, the very
# build that cargo itself and the rest of `make test` share (extra rustc arguments would
# make it another build, of the same file names), and records the native libraries its
# staticlib needs, for KilnConfig.cmake (KilnNativeLibs.cmake) and kiln.pc
# (native-libs.txt): those the build scripts of the library and its dependencies link
# (cargo's JSON messages; `static=` ones are bundled into the archive), then the standard
# library's, as rustc prints them for an empty staticlib of the same toolchain.
execute_process(
  COMMAND "${CARGO}" build --release --lib --manifest-path "${SOURCE_DIR}/Cargo.toml"
          --target-dir "${TARGET_DIR}" --features "${FEATURES}"
          --message-format=json-render-diagnostics
  RESULT_VARIABLE rc
  OUTPUT_VARIABLE messages)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cargo build failed (its errors are above)")
endif()
set(flags "")
string(REGEX MATCHALL "\"linked_libs\":\\[[^]]*\\]" lib_lists "${messages}")
foreach(list_json IN LISTS lib_lists)
  string(REGEX MATCHALL "\"[^\"]+\"" entries "${list_json}")
  foreach(entry IN LISTS entries)
    string(REPLACE "\"" "" entry "${entry}")
    if(entry STREQUAL "linked_libs" OR entry MATCHES "^static")
      continue()
    endif()
    string(REGEX REPLACE "^[a-z-]+(:[^=]*)?=" "" name "${entry}")
    string(APPEND flags " -l${name}")
  endforeach()
endforeach()
get_filename_component(cargo_dir "${CARGO}" DIRECTORY)
find_program(RUSTC rustc HINTS "${cargo_dir}" REQUIRED)
file(WRITE "${OUT_DIR}/native-libs-probe.rs" "")
execute_process(
  COMMAND "${RUSTC}" --crate-type staticlib --crate-name kiln_native_libs_probe
          --print native-static-libs -o "${OUT_DIR}/libkiln_native_libs_probe.a"
          "${OUT_DIR}/native-libs-probe.rs"
  RESULT_VARIABLE rc
  ERROR_VARIABLE err)
string(REGEX MATCH "native-static-libs: ([^\n]*)" _ "${err}")
if(NOT rc EQUAL 0 OR CMAKE_MATCH_1 STREQUAL "")
  message(FATAL_ERROR "rustc did not print native-static-libs:\n${err}")
endif()
string(STRIP "${flags} ${CMAKE_MATCH_1}" flags)
separate_arguments(flag_list UNIX_COMMAND "${flags}")
set(names "")
foreach(f IN LISTS flag_list)
  string(REGEX REPLACE "^-l" "" n "${f}")
  list(APPEND names "${n}")
endforeach()
file(WRITE "${OUT_DIR}/KilnNativeLibs.cmake"
  "# What Rust's staticlib needs from the system (cmake/cargo-build.cmake).\nset(KILN_NATIVE_STATIC_LIBS ${names})\n")
file(WRITE "${OUT_DIR}/native-libs.txt" "${flags}")
