include(CMakePackageConfigHelpers)

install(TARGETS hss EXPORT hssTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT hss_dev
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT hss_dev
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT hss_dev)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/hss DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT hss_dev)
install(EXPORT hssTargets NAMESPACE hss:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/hss
  COMPONENT hss_dev)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/hssConfig.cmake.in
  ${PROJECT_BINARY_DIR}/hssConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/hss)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/hssConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/hssConfig.cmake ${PROJECT_BINARY_DIR}/hssConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/hss COMPONENT hss_dev)
