# SPECNATIVE_CUDA=ON turns on ggml's CUDA backend when the toolkit can build it; a machine with
# nvcc but without cuBLAS (or without nvcc) falls back to a CPU-only build instead of failing.
# cuBLAS may come from the `nvidia-cublas` Python package instead of the toolkit, and the driver
# library is not needed to build (cmake/cuda_pip_libraries.cmake). bench/build_cuda.sh is the
# developer's one command; bench/results/cuda-build-record.md says what it costs.
set(SPECNATIVE_BACKEND "CPU")
if(SPECNATIVE_CUDA)
  find_package(CUDAToolkit QUIET)
  include(CheckLanguage)
  check_language(CUDA)
  include(cmake/cuda_pip_libraries.cmake)
  specnative_cuda_complete_toolkit()
  if(CUDAToolkit_FOUND AND CMAKE_CUDA_COMPILER AND TARGET CUDA::cublas)
    set(GGML_CUDA ON CACHE BOOL "" FORCE)
    set(SPECNATIVE_BACKEND "CUDA")
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES native)
    endif()
    # Record the options that change what is compiled or how it runs (build_info() shows them).
    string(APPEND SPECNATIVE_BUILD_FLAGS "GGML_CUDA=ON CMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES} ")
    foreach(option_name GGML_CUDA_FA GGML_CUDA_FA_QUANTS GGML_CUDA_GRAPHS GGML_CUDA_NO_VMM
                        GGML_CUDA_FORCE_MMQ GGML_CUDA_FORCE_CUBLAS)
      if(DEFINED ${option_name})
        string(APPEND SPECNATIVE_BUILD_FLAGS "${option_name}=${${option_name}} ")
      endif()
    endforeach()
    message(STATUS "specnative: CUDA backend on (architectures ${CMAKE_CUDA_ARCHITECTURES})")
  else()
    set(GGML_CUDA OFF CACHE BOOL "" FORCE)
    message(WARNING "specnative: SPECNATIVE_CUDA=ON but the CUDA toolkit with cuBLAS was not "
                    "found; building CPU-only")
  endif()
endif()

# Call after the targets' INSTALL_RPATH is set: a wheel whose cuBLAS comes from the nvidia-cublas
# package finds it in site-packages/nvidia/cuN/lib beside site-packages/specnative.
function(specnative_cuda_runtime_rpath)
  if(TARGET ggml-cuda AND SPECNATIVE_CUDA_PIP_RPATH)
    get_target_property(imported ggml-cuda IMPORTED)
    if(NOT imported)
      set_property(TARGET ggml-cuda APPEND PROPERTY INSTALL_RPATH "${SPECNATIVE_CUDA_PIP_RPATH}")
    endif()
  endif()
endfunction()

# What a build of llama.cpp was made with, for a later SPECNATIVE_PREBUILT_LLAMA build of the
# extension alone (cmake/prebuilt_llama.cmake reads it back).
file(WRITE "${CMAKE_BINARY_DIR}/specnative-llama-build.cmake"
  "set(SPECNATIVE_LLAMA_COMMIT \"${SPECNATIVE_LLAMA_COMMIT}\")\n"
  "set(SPECNATIVE_BUILD_FLAGS \"${SPECNATIVE_BUILD_FLAGS}\")\n"
  "set(SPECNATIVE_BACKEND \"${SPECNATIVE_BACKEND}\")\n")
