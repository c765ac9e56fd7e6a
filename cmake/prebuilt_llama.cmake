# SPECNATIVE_PREBUILT_LLAMA=<dir>: build only the extension, against llama.cpp libraries built
# elsewhere, instead of fetching and compiling llama.cpp here. For a GPU machine without network
# and with little time: compiling ggml-cuda takes far longer than the extension, and the libraries
# do not depend on the Python version, the extension does. bench/build_cuda.sh makes <dir>:
#   lib/      libllama.so*, libggml.so*, libggml-base.so*, libggml-cpu.so*[, libggml-cuda.so*]
#             with RPATH $ORIGIN, so they find each other wherever they are copied together
#   include/  llama.h and the ggml headers of the same llama.cpp tree
#   specnative-llama-build.cmake   the commit, build flags and backend they were built with
#   llama.cpp/  the sources the extension compiles itself (common/ for the n-gram drafters, src/
#             headers, vendor/nlohmann); without it, vendor/llama.cpp of this checkout if present
# Defines imported targets under the names add_subdirectory() would create (llama, ggml, ...),
# and specnative_install_prebuilt_libs() to copy them into the wheel as they are.

set(_prebuilt "${SPECNATIVE_PREBUILT_LLAMA}")
foreach(required include/llama.h include/ggml.h specnative-llama-build.cmake lib/libllama.so lib/libggml.so)
  if(NOT EXISTS "${_prebuilt}/${required}")
    message(FATAL_ERROR "SPECNATIVE_PREBUILT_LLAMA=${_prebuilt}: ${required} is missing "
                        "(make the folder with bench/build_cuda.sh)")
  endif()
endforeach()

# SPECNATIVE_LLAMA_COMMIT, SPECNATIVE_BUILD_FLAGS, SPECNATIVE_BACKEND as the libraries were built
include("${_prebuilt}/specnative-llama-build.cmake")
string(APPEND SPECNATIVE_BUILD_FLAGS "SPECNATIVE_PREBUILT_LLAMA=ON ")

foreach(name llama ggml ggml-base ggml-cpu ggml-cuda)
  set(library "${_prebuilt}/lib/lib${name}.so")
  if(EXISTS "${library}")
    add_library(${name} SHARED IMPORTED)
    set_target_properties(${name} PROPERTIES
      IMPORTED_LOCATION "${library}"
      INTERFACE_INCLUDE_DIRECTORIES "${_prebuilt}/include")
  endif()
endforeach()
message(STATUS "specnative: prebuilt llama.cpp from ${_prebuilt} (backend ${SPECNATIVE_BACKEND})")

# Where cmake/llama_drafters.cmake finds llama.cpp's common/ sources
if(EXISTS "${_prebuilt}/llama.cpp/common")
  set(SPECNATIVE_PREBUILT_LLAMA_SRC "${_prebuilt}/llama.cpp")
else()
  set(SPECNATIVE_PREBUILT_LLAMA_SRC "${CMAKE_CURRENT_SOURCE_DIR}/vendor/llama.cpp")
endif()

# The wheel gets the files as built: the real library and its SONAME/name links (their RPATH
# already says $ORIGIN). install(TARGETS) cannot install imported targets.
function(specnative_install_prebuilt_libs)
  foreach(name IN LISTS ARGN)
    file(GLOB files "${SPECNATIVE_PREBUILT_LLAMA}/lib/lib${name}.so*")
    install(FILES ${files} DESTINATION specnative)
  endforeach()
endfunction()

# Nothing to add: the prebuilt libraries carry their RPATH already (cmake/cuda_backend.cmake
# defines the real one for source builds).
function(specnative_cuda_runtime_rpath)
endfunction()
