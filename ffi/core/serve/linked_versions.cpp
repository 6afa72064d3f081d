// The versions of libjpeg-turbo and lz4 that this process runs (see linked_versions.h).
#include "linked_versions.h"

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>  // jpeglib.h needs FILE
#include <cstring>

#include <jpeglib.h>
#include <lz4.h>

#if defined(__linux__)
#include <link.h>
#endif

namespace tbljax {
namespace {

#if defined(__linux__)
// The loaded object (executable or shared library) whose segments hold `addr`, and what was
// found in it.
struct Probe {
  const void* addr;
  std::string path;
  std::string version;
};

bool Holds(const dl_phdr_info* info, const void* addr) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && a >= start && a < start + ph.p_memsz) return true;
  }
  return false;
}

// Searches the object's readable segments for "libjpeg-turbo version X.Y.Z". The pattern is
// assembled at run time, so that its own bytes are never found in this module's constants.
void FindVersion(const dl_phdr_info* info, Probe* probe) {
  const std::string needle = std::string("libjpeg-turbo") + " version ";
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_R)) continue;
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_filesz;  // p_filesz: the bytes that came from the file
    while (p < end) {
      const void* hit = memmem(p, end - p, needle.data(), needle.size());
      if (!hit) break;
      const char* v = static_cast<const char*>(hit) + needle.size();
      const char* stop = v;
      while (stop < end && (std::isdigit(static_cast<unsigned char>(*stop)) || *stop == '.'))
        ++stop;
      if (stop > v && std::isdigit(static_cast<unsigned char>(*v))) {
        probe->version.assign(v, stop);
        return;
      }
      p = v;
    }
  }
}

int VisitObject(dl_phdr_info* info, size_t, void* data) {
  auto* probe = static_cast<Probe*>(data);
  if (!Holds(info, probe->addr)) return 0;
  probe->path = info->dlpi_name ? info->dlpi_name : "";
  FindVersion(info, probe);
  return 1;  // found the object: stop
}

Probe ProbeLibjpeg() {
  Probe probe{reinterpret_cast<const void*>(&jpeg_std_error), "", ""};
  dl_iterate_phdr(VisitObject, &probe);
  return probe;
}
#endif

}  // namespace

std::string LinkedLibjpegTurboVersion() {
#if defined(__linux__)
  return ProbeLibjpeg().version;
#else
  return "";
#endif
}

std::string LinkedLibjpegPath() {
#if defined(__linux__)
  return ProbeLibjpeg().path;
#else
  return "";
#endif
}

std::string LinkedLz4Version() { return LZ4_versionString(); }

}  // namespace tbljax
