# Findliburing: find liburing, the userspace helpers for Linux io_uring.
#
#   find_package(liburing 2.2 REQUIRED)
#   target_link_libraries(app PRIVATE liburing::liburing)
#
# Imported target: liburing::liburing
# Result variables: liburing_FOUND, liburing_VERSION, liburing_INCLUDE_DIRS,
#   liburing_LIBRARIES
# Cache variables: liburing_INCLUDE_DIR, liburing_LIBRARY
# Hints: liburing_ROOT; pkg-config's liburing.pc when pkg-config is present.
# Installed with fusewire's CMake package, which uses it for fusewire::uring.

find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(PC_liburing QUIET liburing)
endif()

find_path(liburing_INCLUDE_DIR NAMES liburing.h HINTS ${PC_liburing_INCLUDE_DIRS})
find_library(liburing_LIBRARY NAMES uring HINTS ${PC_liburing_LIBRARY_DIRS})
mark_as_advanced(liburing_INCLUDE_DIR liburing_LIBRARY)

# liburing >= 2.4 states its version in a header; older ones only in the .pc.
unset(liburing_VERSION)
if(liburing_INCLUDE_DIR AND EXISTS "${liburing_INCLUDE_DIR}/liburing/io_uring_version.h")
  file(STRINGS "${liburing_INCLUDE_DIR}/liburing/io_uring_version.h" _liburing_version_lines
    REGEX "^#define IO_URING_VERSION_(MAJOR|MINOR)[ \t]+[0-9]+")
  string(REGEX REPLACE ".*MAJOR[ \t]+([0-9]+).*" "\\1" _liburing_major "${_liburing_version_lines}")
  string(REGEX REPLACE ".*MINOR[ \t]+([0-9]+).*" "\\1" _liburing_minor "${_liburing_version_lines}")
  set(liburing_VERSION "${_liburing_major}.${_liburing_minor}")
  unset(_liburing_version_lines)
  unset(_liburing_major)
  unset(_liburing_minor)
elseif(liburing_INCLUDE_DIR AND PC_liburing_VERSION)
  set(liburing_VERSION "${PC_liburing_VERSION}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(liburing
  REQUIRED_VARS liburing_LIBRARY liburing_INCLUDE_DIR
  VERSION_VAR liburing_VERSION
  REASON_FAILURE_MESSAGE "Install liburing's development files (Debian: liburing-dev) or set liburing_ROOT.")

if(liburing_FOUND)
  set(liburing_INCLUDE_DIRS "${liburing_INCLUDE_DIR}")
  set(liburing_LIBRARIES "${liburing_LIBRARY}")
  if(NOT TARGET liburing::liburing)
    add_library(liburing::liburing UNKNOWN IMPORTED)
    set_target_properties(liburing::liburing PROPERTIES
      IMPORTED_LOCATION "${liburing_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${liburing_INCLUDE_DIR}")
  endif()
endif()
