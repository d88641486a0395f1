# Import LibTorch (the CUDA build inside PyPI's torch wheel, installed by deploy/install-deps.sh
# into ${RP_PREFIX}/venv) as one interface target, `rp_torch`, safe to mix with Debian's libraries.
#
# Why not find_package(Torch): LibTorch's CMake package (Caffe2/public/cuda.cmake) calls
# enable_language(CUDA) and find_package(CUDAToolkit REQUIRED). It demands nvcc and a full CUDA
# toolkit of a matching version even from a program that compiles no CUDA code, and fails on a
# CPU-only machine, on a GPU machine with only the driver, and with a toolkit in /usr/local/cuda
# that is not on PATH. We compile no .cu file: all the CUDA backend needs is the runtime API
# header (cuda_runtime_api.h) and libcudart, and the torch wheel depends on the nvidia-cuda-runtime
# wheel that ships both, in exactly the version libtorch_cuda was built against. So we import the
# wheel's shared libraries ourselves, with the compile definitions its CMake package would add.
# A CUDA toolkit is never needed; one that is installed is used only if the wheel lacks the header.
#
# Inputs (cache): RP_TORCH_PREFIX, the torch package directory (holds include/ and lib/; default:
# the venv's `torch`, else python3's). -DTorch_DIR=<prefix>/share/cmake/Torch is accepted too.
#
# The clash (ARCHITECTURE §7): the wheel's include/ directory ships its own fmt (12.x) and protobuf
# headers. Debian's spdlog is built against fmt 9 and our generated .pb.h files against Debian's
# protobuf; with torch's include dir first on the path, a TU would silently compile against the
# wrong headers (ODR violations / link errors). We therefore include a filtered directory in the
# build tree that mirrors torch/include *without* fmt/ and google/. No LibTorch header we use needs
# either (checked: only CUDA tunable-GEMM and profiler internals include fmt; nothing in
# ATen/c10/torch-api includes protobuf). Symbols do not clash: libc10/libtorch keep fmt
# inline-namespaced (fmt::v12) and protobuf's runtime hidden. The libraries link no protobuf, so
# `protobuf::libprotobuf` means Debian's everywhere; our generated code links it as `rp_protobuf`.

set(RP_TORCH_PREFIX "" CACHE PATH "The torch package directory (include/, lib/); empty: ask Python")
if(NOT RP_TORCH_PREFIX AND Torch_DIR)
  get_filename_component(RP_TORCH_PREFIX "${Torch_DIR}/../../.." ABSOLUTE)
endif()
if(NOT RP_TORCH_PREFIX)
  set(_rp_py "${RP_PREFIX}/venv/bin/python")
  if(NOT EXISTS "${_rp_py}")
    set(_rp_py python3)
  endif()
  # find_spec locates the package without importing it (no CUDA initialisation, no seconds spent).
  execute_process(
    COMMAND "${_rp_py}" -c
            "import importlib.util as u; print(u.find_spec('torch').submodule_search_locations[0])"
    OUTPUT_VARIABLE _rp_found OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _rp_rc ERROR_QUIET)
  if(NOT _rp_rc EQUAL 0 OR NOT EXISTS "${_rp_found}/include/ATen/ATen.h")
    message(FATAL_ERROR "LibTorch not found (asked ${_rp_py}): run deploy/install-deps.sh, or pass "
                        "-DRP_TORCH_PREFIX=<site-packages>/torch, or -DRP_WITH_TORCH=OFF")
  endif()
  set(RP_TORCH_PREFIX "${_rp_found}" CACHE PATH "The torch package directory" FORCE)
endif()
set(_rp_tp "${RP_TORCH_PREFIX}")
foreach(_lib torch torch_cpu torch_cuda c10 c10_cuda)
  if(NOT EXISTS "${_rp_tp}/lib/lib${_lib}.so")
    message(FATAL_ERROR "${_rp_tp}/lib/lib${_lib}.so is missing: roundpipe needs a CUDA build of "
                        "LibTorch (PyPI's default torch wheel; deploy/install-deps.sh pins one)")
  endif()
endforeach()
set(_rp_ver_line "")
if(EXISTS "${_rp_tp}/version.py")
  file(STRINGS "${_rp_tp}/version.py" _rp_ver_line REGEX "^__version__" LIMIT_COUNT 1)
endif()
string(REGEX MATCH "[0-9]+\\.[0-9]+\\.[0-9]+[^'\"]*" RP_TORCH_VERSION "${_rp_ver_line}")

# The CUDA runtime: the nvidia-* wheels beside torch first (cu13 wheels share nvidia/cu13, cu12
# wheels use nvidia/cuda_runtime), an installed toolkit only as a fallback.
get_filename_component(_rp_site "${_rp_tp}/.." ABSOLUTE)
file(GLOB _rp_nv_cuda_dirs LIST_DIRECTORIES true "${_rp_site}/nvidia/cu[0-9]*" "${_rp_site}/nvidia/cuda_runtime")
set(_rp_cuda_hints ${_rp_nv_cuda_dirs})
foreach(_root "${CUDAToolkit_ROOT}" "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}" /usr/local/cuda)
  if(_root)
    list(APPEND _rp_cuda_hints "${_root}")
  endif()
endforeach()
# The header directory: the first candidate with both cuda_runtime_api.h and the crt/ headers it
# includes (the nvidia-cuda-crt wheel, which install-deps adds; a toolkit has both).
set(RP_CUDA_INCLUDE_DIR "")
foreach(_h IN LISTS _rp_cuda_hints)
  if(EXISTS "${_h}/include/cuda_runtime_api.h" AND EXISTS "${_h}/include/crt/host_config.h")
    set(RP_CUDA_INCLUDE_DIR "${_h}/include")
    break()
  endif()
endforeach()
find_library(RP_CUDART_LIBRARY NAMES cudart libcudart.so.13 libcudart.so.12 NAMES_PER_DIR
             HINTS ${_rp_cuda_hints}
             PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
if(NOT RP_CUDA_INCLUDE_DIR OR NOT RP_CUDART_LIBRARY)
  message(FATAL_ERROR "the CUDA runtime (cuda_runtime_api.h with crt/host_config.h, libcudart) was not "
                      "found beside torch (${_rp_site}/nvidia) nor in a toolkit (${_rp_cuda_hints}): "
                      "run deploy/install-deps.sh (it adds the nvidia-cuda-crt wheel of the runtime's "
                      "version) or set CUDAToolkit_ROOT")
endif()
if(RP_CUDA_INCLUDE_DIR MATCHES "^${_rp_site}/")
  set(_rp_from "the torch wheel's nvidia-* wheels: no CUDA toolkit used")
else()
  set(_rp_from "a CUDA toolkit: the wheels lack crt/ (deploy/install-deps.sh adds nvidia-cuda-crt)")
endif()
message(STATUS "LibTorch ${RP_TORCH_VERSION} at ${_rp_tp}; CUDA runtime header ${RP_CUDA_INCLUDE_DIR}, "
               "library ${RP_CUDART_LIBRARY} (headers from ${_rp_from})")

set(_rp_filtered "${CMAKE_BINARY_DIR}/torch-include")
file(MAKE_DIRECTORY "${_rp_filtered}")
file(GLOB _rp_entries RELATIVE "${_rp_tp}/include" "${_rp_tp}/include/*")
foreach(_e IN LISTS _rp_entries)
  if(NOT _e MATCHES "^(fmt|google)$" AND NOT EXISTS "${_rp_filtered}/${_e}")
    file(CREATE_LINK "${_rp_tp}/include/${_e}" "${_rp_filtered}/${_e}" SYMBOLIC)
  endif()
endforeach()

# rp_torch: what our targets link. libtorch_cuda registers the CUDA kernels in static
# initialisers and is referenced by no symbol of ours, hence --no-as-needed around it (as
# LibTorch's own torch_cuda_library does). The wheel's libtorch_cuda.so has no RUNPATH: Python
# preloads the nvidia-* wheels' libraries, a C++ program must find them itself. Every executable
# gets a DT_RPATH (--disable-new-dtags; unlike DT_RUNPATH it also applies to libtorch_cuda's own
# dependencies) listing torch/lib and the nvidia-* wheel library directories first, so the loader
# never mixes in a system CUDA toolkit's runtime or NCCL.
file(GLOB _rp_nv_dirs LIST_DIRECTORIES true "${_rp_site}/nvidia/*/lib")
list(REMOVE_DUPLICATES _rp_nv_dirs)
set(RP_TORCH_RUNTIME_DIRS "${_rp_tp}/lib" ${_rp_nv_dirs})
add_library(rp_torch INTERFACE)
target_include_directories(rp_torch SYSTEM INTERFACE
  "${_rp_filtered}" "${_rp_filtered}/torch/csrc/api/include" "${RP_CUDA_INCLUDE_DIR}")
# The definitions LibTorch's package puts on torch_cpu and torch_cuda (they select declarations in
# torch/csrc headers; keep them equal to the wheel's build).
target_compile_definitions(rp_torch INTERFACE
  USE_DISTRIBUTED USE_C10D_GLOO USE_RPC USE_TENSORPIPE USE_C10D_NCCL USE_NVSHMEM)
target_compile_features(rp_torch INTERFACE cxx_std_20)
target_link_libraries(rp_torch INTERFACE
  "${_rp_tp}/lib/libtorch.so" "${_rp_tp}/lib/libtorch_cpu.so"
  "-Wl,--no-as-needed,${_rp_tp}/lib/libtorch_cuda.so,--as-needed"
  "${_rp_tp}/lib/libc10_cuda.so" "${_rp_tp}/lib/libc10.so" "${RP_CUDART_LIBRARY}")
target_link_options(rp_torch INTERFACE "LINKER:--disable-new-dtags")
foreach(_d IN LISTS RP_TORCH_RUNTIME_DIRS)
  target_link_options(rp_torch INTERFACE "LINKER:-rpath,${_d}" "LINKER:-rpath-link,${_d}")
endforeach()

# rp_torch_pch(target): the heavy ATen header precompiled once for the whole build (about a
# minute of a core per precompile): every target reuses rp_torch_pch_host's. GCC takes a PCH made
# with the same code-generation flags; the targets differ only in include directories, warnings
# and -D macros that ATen never reads, and a PCH GCC finds unusable is parsed as text instead.
# -pthread on every LibTorch target: gRPC's targets add it (it defines _REENTRANT), and GCC
# refuses a PCH made without a macro the including TU defines.
target_compile_options(rp_torch INTERFACE -pthread)
add_library(rp_torch_pch_host STATIC ${CMAKE_CURRENT_LIST_DIR}/torch_pch_host.cc)
target_link_libraries(rp_torch_pch_host PUBLIC rp_torch)
target_precompile_headers(rp_torch_pch_host PRIVATE <ATen/ATen.h>)
function(rp_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM rp_torch_pch_host)
endfunction()
