// libFuzzer harness for the TBL reader: TblFile::Open on arbitrary bytes, then every accessor
// and ReadPayload / VerifyRecord on every record. Any crash, sanitizer report or hang is a bug.
//
// Input: the file's bytes followed by one control byte. Random bytes almost never carry a
// valid header CRC-32 or record CRC-16, which would stop the fuzzer at the first checksum; the
// control byte lets it ask for them to be made right, so the code behind them is reached too:
//   bit 0  rewrite the header CRC-32          bit 1  rewrite each plain record's CRC-16
//   bit 2  rewrite the dataset block's CRC-16
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tbl_format.h"

using namespace tbljax;
using namespace tbljax::tbl;

namespace {

template <typename T>
T Get(const std::vector<uint8_t>& b, uint64_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof(T));
  return v;
}
template <typename T>
void Put(std::vector<uint8_t>* b, uint64_t off, T v) {
  std::memcpy(b->data() + off, &v, sizeof(T));
}

// Makes the checksums the control byte asks for right. Bounds-checked: the bytes are hostile.
void FixChecksums(std::vector<uint8_t>* b, uint8_t ctrl) {
  const uint64_t size = b->size();
  if (size < kHeaderBytes) return;
  const uint64_t n = Get<uint64_t>(*b, 8);
  if (ctrl & 2) {
    for (uint64_t i = 0; i < n && i < (size - kHeaderBytes) / kIndexEntryBytes; ++i) {
      const uint64_t e = kHeaderBytes + i * kIndexEntryBytes;
      const uint64_t off = Get<uint64_t>(*b, e);
      const uint32_t len = Get<uint32_t>(*b, e + 8);
      if (!((*b)[e + 21] & kRecordLz4) && off <= size && len <= size - off)
        Put<uint16_t>(b, e + 22, Crc16Modbus(b->data() + off, len));
    }
  }
  if (ctrl & 4) {
    const uint64_t mo = Get<uint64_t>(*b, 24);
    if (mo <= size && size - mo >= kMetaBlockHeaderBytes) {
      const uint32_t len = Get<uint32_t>(*b, mo + 8);
      if (len <= size - mo - kMetaBlockHeaderBytes)
        Put<uint16_t>(b, mo + 14, Crc16Modbus(b->data() + mo + kMetaBlockHeaderBytes, len));
    }
  }
  if (ctrl & 1) {
    Put<uint32_t>(b, 44, 0);
    Put<uint32_t>(b, 44, Crc32(b->data(), kHeaderBytes));
  }
}

// Reads every byte a caller may read after a successful Open, so ASan sees any that lie
// outside the mapping.
uint64_t Touch(const TblFile& f) {
  uint64_t sum = 0;
  for (char c : f.dataset_json()) sum += static_cast<uint8_t>(c);
  for (char c : f.metadata_section()) sum += static_cast<uint8_t>(c);
  if (f.uniform_raw()) {
    const uint64_t bytes = f.num_records() * f.raw_height() * f.raw_width() * 3;
    if (f.raw_offset() > f.file_size() || bytes > f.file_size() - f.raw_offset()) __builtin_trap();
    const uint8_t* p = f.base() + f.raw_offset();
    if (bytes) sum += p[0] + p[bytes - 1];
  }
  std::vector<uint8_t> out;
  const uint64_t n = f.num_records() < 4096 ? f.num_records() : 4096;
  for (uint64_t i = 0; i < n; ++i) {
    const RecordInfo r = f.record(i);
    if (r.offset > f.file_size() || r.size > f.file_size() - r.offset) __builtin_trap();
    Status s = f.ReadPayload(i, &out, i % 2 == 0);
    if (s.ok() && out.size() != r.uncompressed_size) __builtin_trap();
    for (uint8_t c : out) sum += c;
    (void)f.VerifyRecord(i);
  }
  if (f.ReadPayload(f.num_records(), &out, true).code() != Code::kOutOfRange) __builtin_trap();
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::vector<uint8_t> file(data, data + size - 1);
  FixChecksums(&file, data[size - 1]);
  // Replaying a crash with TBLJAX_FUZZ_SAVE=PATH writes the file the reader saw (checksums
  // fixed), the form kept under tests/regressions/.
  if (const char* save = std::getenv("TBLJAX_FUZZ_SAVE")) {
    if (FILE* out = std::fopen(save, "wb")) {
      std::fwrite(file.data(), 1, file.size(), out);
      std::fclose(out);
    }
  }

  // The reader opens a path: a memory file named through /proc keeps the disk out of it.
  static const int fd = memfd_create("fuzz.tbl", 0);
  if (fd < 0) __builtin_trap();
  if (ftruncate(fd, 0) != 0 ||
      pwrite(fd, file.data(), file.size(), 0) != static_cast<ssize_t>(file.size()))
    __builtin_trap();
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);

  std::unique_ptr<TblFile> f;
  Status s = TblFile::Open(path, &f);
  if (!s.ok()) {
    if (f || s.message().empty()) __builtin_trap();
    return 0;
  }
  volatile uint64_t sink = Touch(*f);
  (void)sink;
  return 0;
}
