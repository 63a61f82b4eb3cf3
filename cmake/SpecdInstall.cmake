# `cmake --install` for C++ embedders: headers, libraries and a CMake package so that
#   find_package(specd CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE specd::core)   # and specd::cuda when it was built
# works. The Python wheel installs only the "python" component (see pyproject.toml).
include(CMakePackageConfigHelpers)
set(SPECD_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/specd")

install(TARGETS specd_core EXPORT specdTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(DIRECTORY cpp/include/specd DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)
install(EXPORT specdTargets NAMESPACE specd:: DESTINATION ${SPECD_CMAKE_DIR} COMPONENT dev)

if(SPECD_WITH_CUDA)
  install(TARGETS specd_cuda EXPORT specdCudaTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
  install(DIRECTORY cuda/include/specd DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)
  install(EXPORT specdCudaTargets NAMESPACE specd:: DESTINATION ${SPECD_CMAKE_DIR} COMPONENT dev)
endif()

configure_package_config_file(cmake/specdConfig.cmake.in
  "${CMAKE_CURRENT_BINARY_DIR}/specdConfig.cmake" INSTALL_DESTINATION ${SPECD_CMAKE_DIR})
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/specdConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/specdConfig.cmake"
              "${CMAKE_CURRENT_BINARY_DIR}/specdConfigVersion.cmake"
        DESTINATION ${SPECD_CMAKE_DIR} COMPONENT dev)
