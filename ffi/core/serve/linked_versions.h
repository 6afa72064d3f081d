// The versions of libjpeg-turbo and lz4 that this process runs: read from the linked code
// itself, not from the headers the build saw (a shared library can be upgraded under a built
// module; a wheel links static archives whose headers may not be the system's).
#pragma once
#include <string>

namespace tbljax {

// libjpeg-turbo's version ("2.1.5"), read from the version string that libjpeg-turbo compiles
// into its own code ("libjpeg-turbo version 2.1.5 (build ...)"), found in the memory of the
// loaded object that holds libjpeg's functions: the system's libjpeg.so, or this module when
// it was linked statically. Empty when no such string is there (not libjpeg-turbo, or not
// Linux).
std::string LinkedLibjpegTurboVersion();

// lz4's version ("1.9.4"), from the linked library's LZ4_versionString().
std::string LinkedLz4Version();

// Where libjpeg's code lives: the path of the loaded object that holds jpeg_std_error (this
// module's path when it was linked statically). Empty when unknown.
std::string LinkedLibjpegPath();

}  // namespace tbljax
