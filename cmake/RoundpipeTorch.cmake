# Locate LibTorch (the CUDA build inside PyPI's torch wheel, installed by
# deploy/install-deps.sh into ${RP_PREFIX}/venv) and make it safe to mix with Debian's libraries.
#
# The clash (DESIGN §7): the wheel's include/ directory ships its own fmt (12.x) and protobuf
# headers. Debian's spdlog is built against fmt 9 and our generated .pb.h files against Debian's
# protobuf; with torch's include dir first on the path, a TU would silently compile against the
# wrong headers (ODR violations / link errors). We therefore give the `torch` target a filtered
# include directory in the build tree that mirrors torch/include *without* fmt/ and google/.
# No public LibTorch header we use needs either (checked: only CUDA tunable-GEMM and profiler
# internals include fmt; nothing in ATen/c10/torch-api includes protobuf). Symbols do not clash:
# libc10/libtorch keep fmt inline-namespaced (fmt::v12) and protobuf's runtime hidden.
if(NOT Torch_DIR)
  set(_rp_py "${RP_PREFIX}/venv/bin/python")
  if(NOT EXISTS "${_rp_py}")
    set(_rp_py python3)
  endif()
  execute_process(
    COMMAND "${_rp_py}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _rp_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _rp_rc ERROR_QUIET)
  if(NOT _rp_rc EQUAL 0)
    message(FATAL_ERROR "LibTorch not found: run deploy/install-deps.sh, or pass -DTorch_DIR=... "
                        "or -DRP_WITH_TORCH=OFF")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${_rp_torch_prefix}")
endif()

if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
  set(CUDAToolkit_ROOT /usr/local/cuda)
endif()
if(NOT TORCH_CUDA_ARCH_LIST)
  set(TORCH_CUDA_ARCH_LIST "8.9;9.0" CACHE STRING "CUDA archs (RTX 4090 = 8.9, H100/H200 = 9.0)")
endif()
find_package(Torch CONFIG REQUIRED)
message(STATUS "LibTorch ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX}")

set(_rp_torch_inc "${TORCH_INSTALL_PREFIX}/include")
set(_rp_filtered "${CMAKE_BINARY_DIR}/torch-include")
file(MAKE_DIRECTORY "${_rp_filtered}")
file(GLOB _rp_entries RELATIVE "${_rp_torch_inc}" "${_rp_torch_inc}/*")
foreach(_e IN LISTS _rp_entries)
  if(NOT _e MATCHES "^(fmt|google)$" AND NOT EXISTS "${_rp_filtered}/${_e}")
    file(CREATE_LINK "${_rp_torch_inc}/${_e}" "${_rp_filtered}/${_e}" SYMBOLIC)
  endif()
endforeach()

foreach(_t torch torch_cpu torch_cuda c10 c10_cuda)
  if(TARGET ${_t})
    get_target_property(_incs ${_t} INTERFACE_INCLUDE_DIRECTORIES)
    if(_incs)
      list(TRANSFORM _incs REPLACE "^${_rp_torch_inc}$" "${_rp_filtered}")
      list(TRANSFORM _incs REPLACE "^${_rp_torch_inc}/" "${_rp_filtered}/")
      set_target_properties(${_t} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_incs}")
    endif()
  endif()
endforeach()

# rp_torch: what our targets link instead of ${TORCH_LIBRARIES}. The wheel's libtorch_cuda.so has
# no RUNPATH: Python preloads the nvidia-* wheels' libraries, a C++ program must find them itself.
# We give every executable a DT_RPATH (--disable-new-dtags; unlike DT_RUNPATH it also applies to
# libtorch_cuda's own dependencies) listing torch/lib and the nvidia-* wheel library directories
# first, so the loader never mixes in the system CUDA toolkit's older runtime or NCCL.
get_filename_component(_rp_site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
file(GLOB _rp_nv_dirs LIST_DIRECTORIES true "${_rp_site}/nvidia/*/lib" "${_rp_site}/nvidia/cu*/lib")
list(REMOVE_DUPLICATES _rp_nv_dirs)
set(RP_TORCH_RUNTIME_DIRS "${TORCH_INSTALL_PREFIX}/lib" ${_rp_nv_dirs})
add_library(rp_torch INTERFACE)
target_link_libraries(rp_torch INTERFACE ${TORCH_LIBRARIES})
target_link_options(rp_torch INTERFACE "LINKER:--disable-new-dtags")
foreach(_d IN LISTS RP_TORCH_RUNTIME_DIRS)
  target_link_options(rp_torch INTERFACE "LINKER:-rpath,${_d}" "LINKER:-rpath-link,${_d}")
endforeach()

# rp_torch_pch(target): precompile the heavy ATen header for a target's TUs (2-core budget).
function(rp_torch_pch target)
  target_precompile_headers(${target} PRIVATE <ATen/ATen.h>)
endfunction()
