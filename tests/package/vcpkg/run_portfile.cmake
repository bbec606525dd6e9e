# Runs ports/fusewire/portfile.cmake outside vcpkg, with stand-ins for what
# vcpkg provides (PORT, VERSION, CURRENT_PACKAGES_DIR, vcpkg_install_copyright),
# so tests/package/run.sh can build a consumer against what the port installs.
#
#   cmake -DPORT_DIR=<repo>/ports/fusewire -DCURRENT_PACKAGES_DIR=<empty dir> -P run_portfile.cmake
cmake_minimum_required(VERSION 3.19)

foreach(var PORT_DIR CURRENT_PACKAGES_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_portfile.cmake: pass -D${var}=...")
  endif()
endforeach()

set(CMAKE_INSTALL_MESSAGE NEVER)
file(READ "${PORT_DIR}/vcpkg.json" _manifest)
string(JSON PORT GET "${_manifest}" name)
string(JSON VERSION GET "${_manifest}" version)

# vcpkg's helper writes share/<port>/copyright from the listed files.
function(vcpkg_install_copyright)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "COMMENT" "FILE_LIST")
  set(text "")
  foreach(file IN LISTS arg_FILE_LIST)
    file(READ "${file}" content)
    string(APPEND text "${content}")
  endforeach()
  file(WRITE "${CURRENT_PACKAGES_DIR}/share/${PORT}/copyright" "${text}")
endfunction()

include("${PORT_DIR}/portfile.cmake")
