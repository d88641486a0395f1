# gRPC + protobuf (Debian 12), spdlog, SQLite, libsystemd and prometheus-cpp (Debian 13 binaries
# unpacked by deploy/install-deps.sh into ${RP_PREFIX}/prometheus, see ARCHITECTURE §7).
find_package(Protobuf REQUIRED)
# Debian's protobuf runtime under our own name, the one target our generated code links.
add_library(rp_protobuf INTERFACE)
target_link_libraries(rp_protobuf INTERFACE ${Protobuf_LIBRARY})
target_include_directories(rp_protobuf INTERFACE ${Protobuf_INCLUDE_DIRS})
find_package(gRPC CONFIG REQUIRED)
find_program(RP_PROTOC protoc REQUIRED)
find_program(RP_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(SQLite3 REQUIRED)
# OpenSSL's libcrypto (a cluster job's data-file digest): Debian's libgrpc++-dev depends on
# libssl-dev, so wherever gRPC builds, it is there.
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_package(PkgConfig REQUIRED)
pkg_check_modules(SYSTEMD REQUIRED IMPORTED_TARGET libsystemd)

set(_rp_prom_prefix "${RP_PREFIX}/prometheus/usr")
if(EXISTS "${_rp_prom_prefix}")
  list(APPEND CMAKE_PREFIX_PATH "${_rp_prom_prefix}")
endif()
find_package(prometheus-cpp CONFIG REQUIRED)
include(RoundpipeProto)
