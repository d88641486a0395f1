# rp_proto_library(NAME target PROTOS a.proto ... [IMPORT_DIRS dir ...] [GRPC] [DEPS targets...])
# Generates C++ (and with GRPC the gRPC service stubs) from .proto files with Debian's protoc and
# grpc_cpp_plugin into the build tree, and builds a static library `target` from them. Generated
# headers are included as "<path relative to the first import dir>.pb.h".
function(rp_proto_library)
  cmake_parse_arguments(ARG "GRPC" "NAME" "PROTOS;IMPORT_DIRS;DEPS" ${ARGN})
  if(NOT ARG_IMPORT_DIRS)
    set(ARG_IMPORT_DIRS "${CMAKE_CURRENT_SOURCE_DIR}")
  endif()
  list(GET ARG_IMPORT_DIRS 0 root)
  set(out "${CMAKE_CURRENT_BINARY_DIR}/gen")
  file(MAKE_DIRECTORY "${out}")
  set(import_flags "")
  foreach(d IN LISTS ARG_IMPORT_DIRS)
    list(APPEND import_flags "-I${d}")
  endforeach()
  set(srcs "")
  foreach(p IN LISTS ARG_PROTOS)
    get_filename_component(abs "${p}" ABSOLUTE)
    file(RELATIVE_PATH rel "${root}" "${abs}")
    string(REGEX REPLACE "\\.proto$" "" stem "${rel}")
    set(gen "${out}/${stem}.pb.cc" "${out}/${stem}.pb.h")
    set(cmd_args --cpp_out=${out})
    if(ARG_GRPC)
      list(APPEND gen "${out}/${stem}.grpc.pb.cc" "${out}/${stem}.grpc.pb.h")
      list(APPEND cmd_args --grpc_out=${out} --plugin=protoc-gen-grpc=${RP_GRPC_CPP_PLUGIN})
    endif()
    add_custom_command(
      OUTPUT ${gen}
      COMMAND ${RP_PROTOC} ${import_flags} ${cmd_args} "${abs}"
      DEPENDS "${abs}" ${RP_PROTOC}
      COMMENT "protoc ${rel}"
      VERBATIM)
    list(APPEND srcs ${gen})
  endforeach()
  add_library(${ARG_NAME} STATIC ${srcs})
  target_include_directories(${ARG_NAME} PUBLIC "${out}")
  target_link_libraries(${ARG_NAME} PUBLIC rp_protobuf ${ARG_DEPS})
  if(ARG_GRPC)
    target_link_libraries(${ARG_NAME} PUBLIC gRPC::grpc++)
  endif()
endfunction()
