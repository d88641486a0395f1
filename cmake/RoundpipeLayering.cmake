# rp_forbid_link(target regex): record that `target` must never link (directly or through any
# transitive INTERFACE_LINK_LIBRARIES) a library whose name matches `regex`.
# rp_check_forbidden_links(): walk every recorded target's link closure and fail the configure
# step with the offending chain. Call it once, after all targets exist.
set_property(GLOBAL PROPERTY RP_FORBIDDEN_LINKS "")

function(rp_forbid_link target regex)
  set_property(GLOBAL APPEND PROPERTY RP_FORBIDDEN_LINKS "${target}=>${regex}")
endfunction()

# Depth-first walk; `chain` is the path so far (for the error message).
function(_rp_walk_links item regex chain visited_var)
  set(visited ${${visited_var}})
  if(item IN_LIST visited)
    return()
  endif()
  list(APPEND visited "${item}")
  set(${visited_var} ${visited} PARENT_SCOPE)
  string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" name "${item}")
  # LibTorch forwards link interfaces as $<TARGET_PROPERTY:tgt,INTERFACE_LINK_LIBRARIES>.
  if(name MATCHES "^\\$<TARGET_PROPERTY:([^,>]+),INTERFACE_LINK_LIBRARIES>$")
    set(name "${CMAKE_MATCH_1}")
  elseif(name MATCHES "^\\$<")   # other generator expressions: not resolvable here
    return()
  endif()
  get_filename_component(base "${name}" NAME)
  set(is_interface_target FALSE)
  if(TARGET ${name})
    get_target_property(_real ${name} ALIASED_TARGET)
    if(NOT _real)
      set(_real ${name})
    endif()
    get_target_property(_type ${_real} TYPE)
    if(_type STREQUAL "INTERFACE_LIBRARY")
      set(is_interface_target TRUE)  # links nothing itself: judge what it forwards
    endif()
  endif()
  if(base MATCHES "${regex}" AND NOT is_interface_target)
    message(FATAL_ERROR "layering violation: ${chain} -> ${name} (matches '${regex}'); "
                        "see ARCHITECTURE §1: planning and workers/ never link these")
  endif()
  if(TARGET ${name})
    get_target_property(aliased ${name} ALIASED_TARGET)
    if(aliased)
      set(name ${aliased})
    endif()
    get_target_property(type ${name} TYPE)
    set(deps "")
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(direct ${name} LINK_LIBRARIES)
      if(direct)
        list(APPEND deps ${direct})
      endif()
    endif()
    get_target_property(iface ${name} INTERFACE_LINK_LIBRARIES)
    if(iface)
      list(APPEND deps ${iface})
    endif()
    foreach(dep IN LISTS deps)
      _rp_walk_links("${dep}" "${regex}" "${chain} -> ${name}" visited)
    endforeach()
    set(${visited_var} ${visited} PARENT_SCOPE)
  endif()
endfunction()

# rp_forbid_link_in_directory(dir regex): rp_forbid_link for every target defined in `dir` (a
# source directory already added with add_subdirectory) and its subdirectories, including
# targets added there later by other issues.
function(rp_forbid_link_in_directory dir regex)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS targets)
    rp_forbid_link(${t} "${regex}")
  endforeach()
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(d IN LISTS subdirs)
    rp_forbid_link_in_directory("${d}" "${regex}")
  endforeach()
endfunction()

function(rp_check_forbidden_links)
  get_property(rules GLOBAL PROPERTY RP_FORBIDDEN_LINKS)
  foreach(rule IN LISTS rules)
    string(REPLACE "=>" ";" parts "${rule}")
    list(GET parts 0 target)
    list(GET parts 1 regex)
    if(NOT TARGET ${target})
      message(FATAL_ERROR "rp_forbid_link: unknown target ${target}")
    endif()
    set(visited "")
    _rp_walk_links(${target} "${regex}" "" visited)
  endforeach()
endfunction()

# rp_include_view(target scope folder...): give `target` (with `scope` PUBLIC, PRIVATE or
# INTERFACE) an include root that shows only the named top-level folders of the source tree —
# symlinks under <build>/include-views/ — instead of the whole tree. A header outside those
# folders does not exist for the target's sources: `#include "workers/..."` in a target whose
# view is {server} fails to compile, naming the header (tests/CMakeLists.txt proves it).
# A folder may be nested (`workers/base`): the view then holds that folder alone at its path.
function(rp_include_view target scope)
  string(REPLACE ";" "+" key "${ARGN}")
  string(REPLACE "/" "_" key "${key}")
  set(view "${PROJECT_BINARY_DIR}/include-views/${key}")
  file(MAKE_DIRECTORY "${view}")
  foreach(folder IN LISTS ARGN)
    get_filename_component(parent "${view}/${folder}" DIRECTORY)
    file(MAKE_DIRECTORY "${parent}")
    if(NOT IS_SYMLINK "${view}/${folder}")
      file(CREATE_LINK "${PROJECT_SOURCE_DIR}/${folder}" "${view}/${folder}" SYMBOLIC)
    endif()
  endforeach()
  target_include_directories(${target} ${scope} "${view}")
endfunction()
