# Findrdmacore: find rdma-core's verbs and connection-manager libraries.
#
#   find_package(rdmacore REQUIRED COMPONENTS ibverbs rdmacm)
#   target_link_libraries(app PRIVATE rdmacore::rdmacm rdmacore::ibverbs)
#
# Components: ibverbs (libibverbs, <infiniband/verbs.h>) and rdmacm
# (librdmacm, <rdma/rdma_cma.h>, needs ibverbs). Without COMPONENTS, both.
# Imported targets: rdmacore::ibverbs, rdmacore::rdmacm
# Result variables: rdmacore_FOUND, rdmacore_<component>_FOUND,
#   rdmacore_<component>_VERSION (from pkg-config, when known),
#   rdmacore_INCLUDE_DIRS, rdmacore_LIBRARIES
# Cache variables: rdmacore_<component>_INCLUDE_DIR, rdmacore_<component>_LIBRARY
# Hints: rdmacore_ROOT; pkg-config's libibverbs.pc / librdmacm.pc. A static
# archive gets the static link flags its .pc lists (providers, libnl).
# Installed with fusewire's CMake package, which uses it for fusewire::rdma.

if(NOT rdmacore_FIND_COMPONENTS)
  set(rdmacore_FIND_COMPONENTS ibverbs rdmacm)
  set(rdmacore_FIND_REQUIRED_ibverbs TRUE)
  set(rdmacore_FIND_REQUIRED_rdmacm TRUE)
endif()
# rdmacm is useless without ibverbs.
list(FIND rdmacore_FIND_COMPONENTS rdmacm _rdmacore_index)
if(NOT _rdmacore_index EQUAL -1)
  list(APPEND rdmacore_FIND_COMPONENTS ibverbs)
  list(REMOVE_DUPLICATES rdmacore_FIND_COMPONENTS)
  if(rdmacore_FIND_REQUIRED_rdmacm)
    set(rdmacore_FIND_REQUIRED_ibverbs TRUE)
  endif()
endif()
unset(_rdmacore_index)

set(_rdmacore_header_ibverbs infiniband/verbs.h)
set(_rdmacore_header_rdmacm rdma/rdma_cma.h)

find_package(PkgConfig QUIET)
set(rdmacore_INCLUDE_DIRS "")
set(rdmacore_LIBRARIES "")
foreach(_rdmacore_comp ${rdmacore_FIND_COMPONENTS})
  set(rdmacore_${_rdmacore_comp}_FOUND FALSE)
  if(NOT DEFINED _rdmacore_header_${_rdmacore_comp})
    continue()
  endif()
  set(_rdmacore_pc PC_rdmacore_${_rdmacore_comp})
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(${_rdmacore_pc} QUIET lib${_rdmacore_comp})
  endif()
  find_path(rdmacore_${_rdmacore_comp}_INCLUDE_DIR NAMES ${_rdmacore_header_${_rdmacore_comp}}
    HINTS ${${_rdmacore_pc}_INCLUDE_DIRS})
  find_library(rdmacore_${_rdmacore_comp}_LIBRARY NAMES ${_rdmacore_comp}
    HINTS ${${_rdmacore_pc}_LIBRARY_DIRS})
  mark_as_advanced(rdmacore_${_rdmacore_comp}_INCLUDE_DIR rdmacore_${_rdmacore_comp}_LIBRARY)
  if(rdmacore_${_rdmacore_comp}_INCLUDE_DIR AND rdmacore_${_rdmacore_comp}_LIBRARY)
    set(rdmacore_${_rdmacore_comp}_FOUND TRUE)
    if(${_rdmacore_pc}_VERSION)
      set(rdmacore_${_rdmacore_comp}_VERSION "${${_rdmacore_pc}_VERSION}")
    endif()
    list(APPEND rdmacore_INCLUDE_DIRS "${rdmacore_${_rdmacore_comp}_INCLUDE_DIR}")
    list(APPEND rdmacore_LIBRARIES "${rdmacore_${_rdmacore_comp}_LIBRARY}")
  endif()
endforeach()
if(rdmacore_INCLUDE_DIRS)
  list(REMOVE_DUPLICATES rdmacore_INCLUDE_DIRS)
endif()
if(rdmacore_rdmacm_FOUND AND NOT rdmacore_ibverbs_FOUND)
  set(rdmacore_rdmacm_FOUND FALSE)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(rdmacore
  REQUIRED_VARS rdmacore_LIBRARIES rdmacore_INCLUDE_DIRS
  HANDLE_COMPONENTS
  REASON_FAILURE_MESSAGE "Install rdma-core's development files (Debian: libibverbs-dev librdmacm-dev) or set rdmacore_ROOT.")

foreach(_rdmacore_comp ${rdmacore_FIND_COMPONENTS})
  if(rdmacore_${_rdmacore_comp}_FOUND AND NOT TARGET rdmacore::${_rdmacore_comp})
    add_library(rdmacore::${_rdmacore_comp} UNKNOWN IMPORTED)
    set_target_properties(rdmacore::${_rdmacore_comp} PROPERTIES
      IMPORTED_LOCATION "${rdmacore_${_rdmacore_comp}_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${rdmacore_${_rdmacore_comp}_INCLUDE_DIR}")
    if(_rdmacore_comp STREQUAL "rdmacm")
      set_property(TARGET rdmacore::rdmacm APPEND PROPERTY INTERFACE_LINK_LIBRARIES rdmacore::ibverbs)
    endif()
    if(rdmacore_${_rdmacore_comp}_LIBRARY MATCHES "\\.a$" AND PC_rdmacore_${_rdmacore_comp}_STATIC_LDFLAGS)
      set_property(TARGET rdmacore::${_rdmacore_comp} APPEND PROPERTY
        INTERFACE_LINK_LIBRARIES ${PC_rdmacore_${_rdmacore_comp}_STATIC_LDFLAGS})
    endif()
  endif()
endforeach()
unset(_rdmacore_comp)
unset(_rdmacore_pc)
unset(_rdmacore_header_ibverbs)
unset(_rdmacore_header_rdmacm)
