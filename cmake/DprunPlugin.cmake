# dprun_add_plugin(NAME SOURCE...): a model plugin, the shared library libdprun_NAME.so, built
# against libdpcore. The same function serves the plugins in this tree and plugins built
# outside it against an installed dprun:
#
#   cmake_minimum_required(VERSION 3.25)
#   project(mynet CXX)
#   find_package(dprun REQUIRED)
#   dprun_add_plugin(mynet mynet.cpp)
#
# then `dprun --plugins <that build folder> ...`. Plugins link libdpcore (shared with the host),
# are built with hidden visibility (the plugin API exports what the loader needs) and need
# Boost.DLL's headers for DPRUN_PLUGIN.
function(dprun_add_plugin name)
  if(NOT ARGN)
    message(FATAL_ERROR "dprun_add_plugin(${name}): give the plugin's source files")
  endif()
  add_library(${name} MODULE ${ARGN})
  if(TARGET dpcore)
    target_link_libraries(${name} PRIVATE dpcore)  # in dprun's own tree
  else()
    target_link_libraries(${name} PRIVATE dprun::dpcore)
  endif()
  target_link_libraries(${name} PRIVATE Boost::headers)
  target_compile_definitions(${name} PRIVATE DPRUN_BUILDING_PLUGIN=1 BOOST_DLL_USE_STD_FS=1)
  target_compile_features(${name} PRIVATE cxx_std_20)
  set_target_properties(${name} PROPERTIES
    PREFIX "libdprun_"
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
endfunction()
