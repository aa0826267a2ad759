# Passed as -DCMAKE_PROJECT_INCLUDE=<this file> when building against the ROS 2 wheels from PyPI.
# Some of those wheels export interface include directories of the machine they were built on; CMake rejects an
# imported target whose include directory does not exist. At the end of configuration this drops such entries.
# A normal ROS 2 install does not need this file.
function(oxygen_ros_drop_missing_include_dirs)
  get_property(targets DIRECTORY "${CMAKE_SOURCE_DIR}" PROPERTY IMPORTED_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
    if(NOT dirs)
      continue()
    endif()
    set(kept "")
    foreach(dir IN LISTS dirs)
      if(dir MATCHES "^\\$<" OR EXISTS "${dir}")
        list(APPEND kept "${dir}")
      endif()
    endforeach()
    set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${kept}")
  endforeach()
endfunction()
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL oxygen_ros_drop_missing_include_dirs)
