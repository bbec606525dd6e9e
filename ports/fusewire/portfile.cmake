# vcpkg overlay port for fusewire, built from the source tree it lives in
# (fusewire is header-only, so "building" is installing the headers and the
# CMake package). From the repository root:
#
#   vcpkg install "fusewire[uring]" --overlay-ports=ports
#
# or, in a manifest project, list "fusewire" in vcpkg.json and pass
# --overlay-ports=<fusewire>/ports (or VCPKG_OVERLAY_PORTS) to vcpkg.
#
# vcpkg keys its binary cache on the files of this folder only, not on the
# headers: after changing them, reinstall with --no-binarycaching (and, in
# classic mode, `vcpkg remove fusewire` first).
#
# The CMake package is configured from the same templates meson installs
# (cmake/*.in); the config finds the prefix relative to share/fusewire.

get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
if(NOT EXISTS "${SOURCE_PATH}/include/fusewire/fusewire.hpp" OR NOT EXISTS "${SOURCE_PATH}/meson.build")
  message(FATAL_ERROR "fusewire's port builds from its own source tree, but ${SOURCE_PATH} is not one "
    "(no include/fusewire/fusewire.hpp or meson.build). Use --overlay-ports=<fusewire checkout>/ports.")
endif()

# vcpkg.json's version must be the project's (meson.build is the source of truth).
file(READ "${SOURCE_PATH}/meson.build" _fusewire_meson)
string(REGEX MATCH "project\\([^)]*[^_a-z]version *: *'([^']+)'" _fusewire_match "${_fusewire_meson}")
if(NOT CMAKE_MATCH_1 STREQUAL VERSION)
  message(FATAL_ERROR "ports/fusewire/vcpkg.json says version ${VERSION} but meson.build says "
    "'${CMAKE_MATCH_1}'; update vcpkg.json.")
endif()

file(INSTALL "${SOURCE_PATH}/include/fusewire" DESTINATION "${CURRENT_PACKAGES_DIR}/include"
  FILES_MATCHING PATTERN "*.hpp")

set(FUSEWIRE_VERSION "${VERSION}")
set(FUSEWIRE_CONFIG_TO_PREFIX "../..")
set(FUSEWIRE_INCLUDEDIR "include")
configure_file("${SOURCE_PATH}/cmake/fusewireConfig.cmake.in"
  "${CURRENT_PACKAGES_DIR}/share/${PORT}/fusewireConfig.cmake" @ONLY)
configure_file("${SOURCE_PATH}/cmake/fusewireConfigVersion.cmake.in"
  "${CURRENT_PACKAGES_DIR}/share/${PORT}/fusewireConfigVersion.cmake" @ONLY)
file(INSTALL "${SOURCE_PATH}/cmake/Findliburing.cmake" "${SOURCE_PATH}/cmake/Findrdmacore.cmake"
  DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
