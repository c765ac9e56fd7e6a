# Enable each x86 SIMD extension that this CPU reports in /proc/cpuinfo, with GGML_NATIVE off.
# Why not GGML_NATIVE: -march=native also turns on AMX, which some VMs advertise and then trap.
# Pass -DSPECNATIVE_CPU_AUTO=OFF to leave ggml's own defaults alone (e.g. for a portable build).
option(SPECNATIVE_CPU_AUTO "pick ggml x86 flags from /proc/cpuinfo (never AMX)" ON)

set(SPECNATIVE_BUILD_FLAGS "")
if(SPECNATIVE_CPU_AUTO AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64" AND EXISTS "/proc/cpuinfo")
  file(STRINGS "/proc/cpuinfo" _cpu_flags_line REGEX "^flags" LIMIT_COUNT 1)
  string(REPLACE " " ";" _cpu_flags "${_cpu_flags_line}")
  set(GGML_NATIVE OFF CACHE BOOL "" FORCE)
  # ggml option -> cpuinfo flag
  foreach(pair
      "GGML_AVX:avx" "GGML_AVX2:avx2" "GGML_FMA:fma" "GGML_F16C:f16c" "GGML_BMI2:bmi2"
      "GGML_AVX_VNNI:avx_vnni" "GGML_AVX512:avx512f" "GGML_AVX512_VBMI:avx512vbmi"
      "GGML_AVX512_VNNI:avx512_vnni" "GGML_AVX512_BF16:avx512_bf16")
    string(REPLACE ":" ";" pair "${pair}")
    list(GET pair 0 option_name)
    list(GET pair 1 cpu_flag)
    if(cpu_flag IN_LIST _cpu_flags)
      set(${option_name} ON CACHE BOOL "" FORCE)
      string(APPEND SPECNATIVE_BUILD_FLAGS "${option_name}=ON ")
    else()
      set(${option_name} OFF CACHE BOOL "" FORCE)
    endif()
  endforeach()
  foreach(option_name GGML_AMX_TILE GGML_AMX_INT8 GGML_AMX_BF16)
    set(${option_name} OFF CACHE BOOL "" FORCE)
  endforeach()
  string(PREPEND SPECNATIVE_BUILD_FLAGS "GGML_NATIVE=OFF ")
  message(STATUS "specnative: CPU flags ${SPECNATIVE_BUILD_FLAGS}")
endif()
