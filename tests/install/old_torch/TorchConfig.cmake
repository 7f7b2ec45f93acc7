# A stand-in for an older LibTorch's CMake config (the version is in
# TorchConfigVersion.cmake): enough for find_package(Torch) to succeed, so
# that gac's own version check is what stops the configure.
set(TORCH_FOUND TRUE)
get_filename_component(TORCH_INSTALL_PREFIX "${CMAKE_CURRENT_LIST_DIR}" ABSOLUTE)
set(TORCH_INCLUDE_DIRS "")
set(TORCH_LIBRARIES "")
set(TORCH_CXX_FLAGS "")
