# Cross toolchain for the manylinux_2_28 wheels (scripts/build-manylinux.sh): zig's clang with a
# glibc 2.28 target (ziglang from PyPI), so the binaries need no glibc symbol newer than 2.28.
# The wrappers in TBLJAX_ZIG_BIN (written by the script) run `zig cc|c++|ar|ranlib` for
# TBLJAX_ARCH (x86_64 | aarch64).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR $ENV{TBLJAX_ARCH})
set(CMAKE_C_COMPILER $ENV{TBLJAX_ZIG_BIN}/cc)
set(CMAKE_CXX_COMPILER $ENV{TBLJAX_ZIG_BIN}/c++)
set(CMAKE_ASM_COMPILER $ENV{TBLJAX_ZIG_BIN}/cc)
set(CMAKE_AR $ENV{TBLJAX_ZIG_BIN}/ar CACHE FILEPATH "")
set(CMAKE_RANLIB $ENV{TBLJAX_ZIG_BIN}/ranlib CACHE FILEPATH "")
# The host's objcopy reads only x86 objects; binutils-aarch64-linux-gnu's reads aarch64 ones.
if($ENV{TBLJAX_ARCH} STREQUAL "aarch64")
  set(CMAKE_OBJCOPY aarch64-linux-gnu-objcopy CACHE FILEPATH "")
else()
  set(CMAKE_OBJCOPY objcopy CACHE FILEPATH "")
endif()
