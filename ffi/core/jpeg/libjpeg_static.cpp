// Linked only into a wheel (TBLJAX_STATIC_DEPS): the one symbol that a static libjpeg.a built
// as position-independent executable code cannot reach from inside a shared module.
//
// Debian's libjpeg.a is compiled -fPIE: inside _core every symbol it uses resolves locally,
// except libc's `stderr`, which jerror.c's default message printer reads PC-relative (a
// relocation a shared object cannot hold). CMakeLists.txt renames that reference to this
// pointer, which lives inside _core. The core never prints through libjpeg (InitErrorMgr in
// decode.cpp replaces the printer): this only keeps libjpeg's own default well-defined.
#include <cstdio>

extern "C" __attribute__((visibility("hidden"))) FILE* tbljax_libjpeg_stderr = stderr;
