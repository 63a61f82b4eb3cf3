# Decide whether the CUDA kernels are built, from SPECD_CUDA (AUTO|ON|OFF).
# Result: SPECD_WITH_CUDA (ON/OFF). When ON, the CUDA language is enabled, the kernels are
# compiled for sm_80 and sm_90 (plus compute_90 PTX for newer GPUs) unless the caller sets
# CMAKE_CUDA_ARCHITECTURES, and the CUDA runtime is linked statically, so the binaries load
# on machines without a CUDA installation and report "no device" at run time.
string(TOUPPER "${SPECD_CUDA}" _specd_cuda_mode)
if(NOT _specd_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "SPECD_CUDA must be AUTO, ON or OFF (got '${SPECD_CUDA}')")
endif()

set(SPECD_WITH_CUDA OFF)
if(NOT _specd_cuda_mode STREQUAL "OFF")
  # An explicitly given compiler that does not exist: fall back (AUTO) or stop (ON) with a
  # clear message instead of failing inside enable_language().
  if(CMAKE_CUDA_COMPILER AND NOT EXISTS "${CMAKE_CUDA_COMPILER}")
    if(_specd_cuda_mode STREQUAL "ON")
      message(FATAL_ERROR "SPECD_CUDA=ON but CMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER} does not exist")
    endif()
    message(WARNING "CMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER} does not exist; "
                    "building without CUDA kernels (SPECD_CUDA=AUTO)")
    unset(CMAKE_CUDA_COMPILER CACHE)
    set(CMAKE_CUDA_COMPILER "")
  else()
    include(CheckLanguage)
    check_language(CUDA)
  endif()
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80-real 90)
    endif()
    set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(SPECD_WITH_CUDA ON)
  elseif(_specd_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "SPECD_CUDA=ON but no CUDA compiler (nvcc) was found; "
                        "set CMAKE_CUDA_COMPILER or use SPECD_CUDA=AUTO/OFF")
  else()
    message(STATUS "specd: no CUDA compiler found, building without CUDA kernels")
  endif()
endif()
