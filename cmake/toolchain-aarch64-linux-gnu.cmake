# Cross build for Linux/aarch64 with Debian's gcc-aarch64-linux-gnu (scripts/build_aarch64.sh).
# Programs (python3, ccache, patch) come from the host; headers and libraries from the target.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# try_run checks and anything CMake runs for the target go through qemu.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static -cpu max)
