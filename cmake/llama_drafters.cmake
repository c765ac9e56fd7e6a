# llama.cpp's model-free drafters for the extension (csrc/drafters/ngram.cpp): common/speculative.cpp,
# ngram-*.cpp and the common sources they call, compiled from llama.cpp's own files into a static
# library linked into _core. Not the whole llama-common library: that is ~100 translation units
# (chat parsers, jinja, an HTTP client) the drafters never call -- most of an hour on the 2 loaded
# cores here; these 13 take minutes, and the wheel gains no library to ship.
# Works for source builds and SPECNATIVE_PREBUILT_LLAMA alike (the same tree's common/ sources,
# linked against the prebuilt libllama of that tree). Without them, the n-gram drafters refuse at
# start (SPECNATIVE_HAVE_COMMON undefined).
function(specnative_add_llama_drafters target llama_src)
  set(common "${llama_src}/common")
  if(NOT EXISTS "${common}/speculative.cpp")
    message(WARNING "specnative: ${common}/speculative.cpp not found: n-gram drafters disabled")
    return()
  endif()
  # llama.cpp's build-info template, filled with what this build knows
  set(LLAMA_BUILD_NUMBER 0)
  set(LLAMA_BUILD_COMMIT "${SPECNATIVE_LLAMA_COMMIT}")
  set(BUILD_COMPILER "${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}")
  set(BUILD_TARGET "${CMAKE_SYSTEM_PROCESSOR}")
  configure_file("${common}/build-info.cpp.in" "${CMAKE_CURRENT_BINARY_DIR}/specnative-llama-build-info.cpp")
  add_library(specnative_llama_spec STATIC
    "${CMAKE_CURRENT_BINARY_DIR}/specnative-llama-build-info.cpp"
    "${common}/speculative.cpp" "${common}/ngram-cache.cpp" "${common}/ngram-map.cpp" "${common}/ngram-mod.cpp"
    "${common}/common.cpp" "${common}/log.cpp" "${common}/sampling.cpp" "${common}/fit.cpp"
    "${common}/unicode.cpp" "${common}/reasoning-budget.cpp" "${common}/trie.cpp" "${common}/json.cpp"
    "${common}/llguidance.cpp")
  set_target_properties(specnative_llama_spec PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_compile_features(specnative_llama_spec PUBLIC cxx_std_17)
  # common/ for its headers, vendor/ for <nlohmann/json.hpp>
  target_include_directories(specnative_llama_spec PUBLIC "${common}" "${llama_src}/vendor")
  target_link_libraries(specnative_llama_spec PUBLIC llama ggml)
  target_link_libraries(${target} PRIVATE specnative_llama_spec)
  target_compile_definitions(${target} PRIVATE SPECNATIVE_HAVE_COMMON=1)
endfunction()
