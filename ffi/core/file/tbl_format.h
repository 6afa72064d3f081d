// The TBL v2 file: constants, checksums, a validating memory-mapped reader and a streaming
// atomic writer. Byte layout is turboloader 2.39's (see DESIGN.md §2); tbljax adds a
// 4 KiB-aligned contiguous RAW region and one dataset-level metadata block.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sizes.h"  // kMaxImageSide
#include "status.h"

namespace tbljax::tbl {

// ---- format constants: defined here once, exported to Python by the bindings ----
inline constexpr char kMagic[4] = {'T', 'B', 'L', '\x02'};
inline constexpr uint32_t kVersion = 2;
inline constexpr uint64_t kHeaderBytes = 64;
inline constexpr uint64_t kIndexEntryBytes = 24;
inline constexpr uint64_t kMetaBlockHeaderBytes = 16;
inline constexpr uint64_t kRawAlignment = 4096;
// The largest width or height a record can have: the index stores them as u16.
inline constexpr uint32_t kMaxSide = kMaxImageSide;
static_assert(kMaxSide == 0xFFFF, "the index stores sides as u16");

enum Format : uint8_t {
  kUnknown = 0,
  kJpeg = 1,
  kPng = 2,
  kWebp = 3,
  kBmp = 4,
  kTiff = 5,
  kMp4 = 6,
  kAvi = 7,
  kRawU8 = 8,
};
inline constexpr uint8_t kMaxFormat = kRawU8;

enum HeaderFlag : uint32_t { kFlagCompressed = 1, kFlagHasMetadata = 2, kFlagHasChecksums = 4 };
enum RecordFlag : uint8_t { kRecordLz4 = 1, kRecordHasMetadata = 2 };

inline constexpr uint16_t kMetaJson = 1;
inline constexpr uint16_t kMetaDataset = 255;                 // tbljax's dataset block type
inline constexpr uint64_t kDatasetBlockIndex = ~uint64_t{0};  // its sample_index

// ---- checksums (table-driven, slicing-by-8) ----
uint32_t Crc32(const uint8_t* data, size_t n, uint32_t crc = 0);  // zlib's CRC-32
uint16_t Crc16Modbus(const uint8_t* data, size_t n);              // poly 0xA001, init 0xFFFF

// One index entry, decoded.
struct RecordInfo {
  uint64_t offset = 0;
  uint32_t size = 0;               // stored bytes
  uint32_t uncompressed_size = 0;  // bytes after LZ4 (== size when not compressed)
  uint16_t width = 0, height = 0;
  uint8_t format = kUnknown;
  uint8_t flags = 0;
  uint16_t crc16 = 0;
  bool lz4() const { return flags & kRecordLz4; }
};

// A TBL file opened read-only through mmap. Open validates the header, its CRC and every
// index entry's bounds and sizes, so later reads cannot leave the mapping.
class TblFile {
 public:
  static Status Open(const std::string& path, std::unique_ptr<TblFile>* out);
  ~TblFile();
  TblFile(const TblFile&) = delete;
  TblFile& operator=(const TblFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t num_records() const { return num_records_; }
  uint64_t file_size() const { return file_size_; }
  uint32_t header_flags() const { return flags_; }
  RecordInfo record(uint64_t i) const;  // i < num_records(), checked by callers
  const uint8_t* base() const { return base_; }

  // Uniform RAW: every record RAW_U8, uncompressed, one (height, width), stored back to back.
  bool uniform_raw() const { return uniform_raw_; }
  uint64_t raw_offset() const { return raw_offset_; }
  uint32_t raw_height() const { return raw_h_; }
  uint32_t raw_width() const { return raw_w_; }

  // The dataset block's JSON (empty if the file has none: e.g. written by turboloader).
  std::string_view dataset_json() const { return dataset_json_; }
  // The whole metadata section, for the slow per-sample scan of foreign files.
  std::string_view metadata_section() const;

  // The mapping serves the bytes the file held at Open. Replacing the file by rename (as
  // TblWriter does) leaves it intact: it keeps the old inode. Writing or truncating the same
  // inode in place changes what it serves, and reading a page past a truncated end raises
  // SIGBUS. This says whether that happened to the file at path(): an error if the inode
  // it names is still ours and its size or modification time changed since Open.
  Status CheckUnchanged() const;

  // Payload bytes after LZ4 decompression, checked against the record's CRC-16 when
  // verify is set.
  Status ReadPayload(uint64_t i, std::vector<uint8_t>* out, bool verify) const;
  // Checks the CRC-16 of record i without keeping the bytes.
  Status VerifyRecord(uint64_t i) const;

 private:
  TblFile() = default;
  Status Validate();
  std::string Where(uint64_t i) const;

  std::string path_;
  std::string abs_path_;  // path_ resolved at Open, so a later chdir does not change it
  uint64_t dev_ = 0, ino_ = 0;
  int64_t mtime_ns_ = 0;
  const uint8_t* base_ = nullptr;
  uint64_t file_size_ = 0, num_records_ = 0;
  uint64_t meta_offset_ = 0, meta_size_ = 0;
  uint32_t flags_ = 0;
  bool uniform_raw_ = false;
  uint64_t raw_offset_ = 0;
  uint32_t raw_h_ = 0, raw_w_ = 0;
  std::string_view dataset_json_;
};

// Streams records into a new TBL file. Memory stays flat in N: each index entry goes to its
// slot in the file as its record is added. The file is built under a hidden name (an
// unnamed O_TMPFILE where the filesystem has it) and appears at `dst` only in Finalize,
// complete and synced; a crash or Abort leaves nothing at `dst`. Without O_TMPFILE (or with
// TBLJAX_NO_O_TMPFILE=1, for tests) the hidden name is ".NAME.tbljax-tmp-PID-SERIAL-HOST";
// one left by a killed writer is removed by the next Create for the same dst on that host.
class TblWriter {
 public:
  // capacity bounds the number of records (it sizes the index region).
  static Status Create(const std::string& dst, uint64_t capacity, bool overwrite,
                       std::unique_ptr<TblWriter>* out);
  ~TblWriter();  // aborts if not finalized
  TblWriter(const TblWriter&) = delete;
  TblWriter& operator=(const TblWriter&) = delete;

  // Appends one record; with lz4 the payload is stored LZ4-compressed when that is smaller.
  Status Add(const uint8_t* data, size_t size, uint8_t format, uint32_t width, uint32_t height,
             bool lz4);
  // Appends bytes no index entry points to (a field block of the dataset, found through the
  // dataset JSON), after every record: the first byte lands at a multiple of `align` (a power
  // of two; 1 continues the previous block) and *offset says where. Records cannot follow,
  // so uniform RAW stays contiguous.
  Status AddExtra(const uint8_t* data, size_t size, uint64_t align, uint64_t* offset);
  // Writes the dataset block and header, syncs, and moves the file to dst.
  Status Finalize(std::string_view dataset_json);
  void Abort();
  uint64_t num_records() const { return count_; }
  uint64_t capacity() const { return capacity_; }

 private:
  TblWriter() = default;
  Status WriteAt(const void* p, size_t n, uint64_t off);

  std::string dst_, tmp_path_;  // tmp_path_ empty when the file is unnamed (O_TMPFILE)
  int fd_ = -1;
  bool overwrite_ = false, done_ = false, any_lz4_ = false, any_extra_ = false;
  uint64_t capacity_ = 0, count_ = 0, cursor_ = 0;
  std::vector<uint8_t> scratch_;
};

}  // namespace tbljax::tbl
