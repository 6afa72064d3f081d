// TBL v2 reader and writer (see tbl_format.h); the checksums are crc.cpp's.
#include "tbl_format.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <lz4.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>

namespace tbljax::tbl {
namespace {

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

constexpr uint64_t kLz4MaxExpansion = 255;

std::string ErrnoText() { return std::strerror(errno); }

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

std::string DirName(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}
std::string BaseName(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Hidden names for files being written: ".NAME.tbljax-tmp-PID-SERIAL-HOST" beside NAME. The
// host is part of the name because the named form is what network filesystems get (no
// O_TMPFILE there), and a PID means something only on its own host.
constexpr char kTempTag[] = ".tbljax-tmp-";

std::string HostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "localhost";
  for (char* c = host; *c; ++c)
    if (*c == '/') *c = '_';
  return host;
}

std::string TempName(const std::string& dst) {
  static std::atomic<uint64_t> serial{0};
  return DirName(dst) + "/." + BaseName(dst) + kTempTag + std::to_string(::getpid()) + "-" +
         std::to_string(serial++) + "-" + HostName();
}

// Removes hidden temp files of dst left by writers that were killed (SIGKILL, power loss on
// a filesystem without O_TMPFILE): those of this host whose process no longer exists. A
// live PID, another host's file or any name not of our form is left alone.
void RemoveStaleTemps(const std::string& dst) {
  const std::string dir = DirName(dst), prefix = "." + BaseName(dst) + kTempTag, host = HostName();
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    // PID-SERIAL-HOST after the prefix.
    size_t pos = prefix.size(), end = pos;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end == pos || end - pos > 9 || end >= name.size() || name[end] != '-') continue;
    const long pid = std::stol(name.substr(pos, end - pos));
    pos = end + 1;
    end = pos;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end == pos || end >= name.size() || name[end] != '-' || name.substr(end + 1) != host)
      continue;
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      ::unlinkat(::dirfd(d), name.c_str(), 0);
  }
  ::closedir(d);
}

void SyncDir(const std::string& dir) {
  int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d >= 0) {
    ::fsync(d);
    ::close(d);
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------
// Reader

Status TblFile::Open(const std::string& path, std::unique_ptr<TblFile>* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IOError(path + ": cannot open: " + ErrnoText());
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string e = ErrnoText();
    ::close(fd);
    return IOError(path + ": cannot stat: " + e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return IOError(path + ": not a regular file");
  }
  std::unique_ptr<TblFile> f(new TblFile());
  f->path_ = path;
  f->file_size_ = static_cast<uint64_t>(st.st_size);
  f->dev_ = st.st_dev;
  f->ino_ = st.st_ino;
  f->mtime_ns_ = MtimeNs(st);
  if (char* real = ::realpath(path.c_str(), nullptr)) {
    f->abs_path_ = real;
    std::free(real);
  }
  if (f->file_size_ < kHeaderBytes) {
    ::close(fd);
    return Corrupt(path + ": file is " + std::to_string(f->file_size_) +
                   " bytes, shorter than the 64-byte TBL header (truncated or not a TBL file)");
  }
  void* p = ::mmap(nullptr, f->file_size_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the file alive
  if (p == MAP_FAILED) return IOError(path + ": mmap failed: " + ErrnoText());
  f->base_ = static_cast<const uint8_t*>(p);
  TBLJAX_RETURN_IF_ERROR(f->Validate());
  *out = std::move(f);
  return Status::Ok();
}

TblFile::~TblFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), file_size_);
}

Status TblFile::CheckUnchanged() const {
  struct stat st;
  if (abs_path_.empty() || ::stat(abs_path_.c_str(), &st) != 0) return Status::Ok();
  // Another inode at the path (renamed over, deleted and rewritten): ours can no longer be
  // reached by name, so the mapping keeps serving the bytes it had.
  if (static_cast<uint64_t>(st.st_dev) != dev_ || static_cast<uint64_t>(st.st_ino) != ino_)
    return Status::Ok();
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == file_size_ && MtimeNs(st) == mtime_ns_) return Status::Ok();
  return Corrupt(
      path_ + ": the file changed on disk while open (" +
      (size == file_size_
           ? "rewritten in place"
           : "size " + std::to_string(file_size_) + " -> " + std::to_string(size) + " bytes") +
      "): its records can no longer be trusted. Replace TBL files by renaming a complete "
      "new file over them (as tbljax.convert does), and reopen");
}

std::string TblFile::Where(uint64_t i) const {
  return path_ + ": record " + std::to_string(i) + ": ";
}

RecordInfo TblFile::record(uint64_t i) const {
  const uint8_t* e = base_ + kHeaderBytes + i * kIndexEntryBytes;
  RecordInfo r;
  r.offset = Load<uint64_t>(e);
  r.size = Load<uint32_t>(e + 8);
  r.uncompressed_size = Load<uint32_t>(e + 12);
  r.width = Load<uint16_t>(e + 16);
  r.height = Load<uint16_t>(e + 18);
  r.format = e[20];
  r.flags = e[21];
  r.crc16 = Load<uint16_t>(e + 22);
  return r;
}

Status TblFile::Validate() {
  const uint8_t* h = base_;
  if (std::memcmp(h, kMagic, 4) != 0) {
    if (std::memcmp(h, kMagic, 3) == 0)
      return Corrupt(path_ + ": TBL version byte is " + std::to_string(h[3]) +
                     "; only TBL v2 is supported");
    return Corrupt(path_ + ": not a TBL file (bad magic bytes)");
  }
  uint32_t version = Load<uint32_t>(h + 4);
  if (version != kVersion)
    return Corrupt(path_ + ": header says version " + std::to_string(version) + "; expected 2");
  std::array<uint8_t, kHeaderBytes> copy;
  std::memcpy(copy.data(), h, kHeaderBytes);
  uint32_t stored_crc = Load<uint32_t>(h + 44);
  Store<uint32_t>(copy.data() + 44, 0);
  if (Crc32(copy.data(), kHeaderBytes) != stored_crc)
    return Corrupt(path_ + ": header checksum mismatch (the 64-byte header is damaged)");
  num_records_ = Load<uint64_t>(h + 8);
  meta_offset_ = Load<uint64_t>(h + 24);
  meta_size_ = Load<uint64_t>(h + 32);
  flags_ = Load<uint32_t>(h + 40);

  const uint64_t max_records = (file_size_ - kHeaderBytes) / kIndexEntryBytes;
  if (num_records_ > max_records)
    return Corrupt(path_ + ": header claims " + std::to_string(num_records_) +
                   " records but the file (" + std::to_string(file_size_) +
                   " bytes) cannot hold their index: truncated?");
  const uint64_t index_end = kHeaderBytes + num_records_ * kIndexEntryBytes;
  if (flags_ & kFlagHasMetadata) {
    if (meta_offset_ < index_end || meta_offset_ > file_size_ ||
        meta_size_ > file_size_ - meta_offset_)
      return Corrupt(path_ + ": metadata section [" + std::to_string(meta_offset_) + ", +" +
                     std::to_string(meta_size_) + ") lies outside the file (" +
                     std::to_string(file_size_) + " bytes): truncated?");
  }

  uniform_raw_ = num_records_ > 0;
  for (uint64_t i = 0; i < num_records_; ++i) {
    RecordInfo r = record(i);
    if (r.offset < index_end || r.offset > file_size_ || r.size > file_size_ - r.offset)
      return Corrupt(Where(i) + "payload [" + std::to_string(r.offset) + ", +" +
                     std::to_string(r.size) + ") lies outside the file (" +
                     std::to_string(file_size_) + " bytes): truncated?");
    if (r.format > kMaxFormat)
      return Corrupt(Where(i) + "unknown record format " + std::to_string(r.format));
    if (!r.lz4() && r.uncompressed_size != r.size)
      return Corrupt(Where(i) + "uncompressed size " + std::to_string(r.uncompressed_size) +
                     " differs from stored size " + std::to_string(r.size) +
                     " of an uncompressed record");
    // A reader allocates uncompressed_size before decompressing: a 100-byte file must not
    // be able to ask for 4 GiB. LZ4 expands a block at most 255-fold (one length byte can
    // add 255 output bytes), and its API takes sizes up to LZ4_MAX_INPUT_SIZE.
    if (r.lz4() && (r.uncompressed_size > kLz4MaxExpansion * r.size ||
                    r.size > LZ4_MAX_INPUT_SIZE || r.uncompressed_size > LZ4_MAX_INPUT_SIZE))
      return Corrupt(Where(i) + "LZ4 record claims " + std::to_string(r.uncompressed_size) +
                     " bytes from " + std::to_string(r.size) +
                     " stored bytes, more than LZ4 can produce (at most 255x)");
    if (r.format == kRawU8) {
      const uint64_t want = uint64_t{r.width} * r.height * 3;
      if (want == 0 || r.uncompressed_size != want)
        return Corrupt(Where(i) + "RAW_U8 record of " + std::to_string(r.width) + "x" +
                       std::to_string(r.height) + " must hold " + std::to_string(want) +
                       " bytes, index says " + std::to_string(r.uncompressed_size));
    }
    if (uniform_raw_) {
      if (i == 0) {
        raw_offset_ = r.offset;
        raw_h_ = r.height;
        raw_w_ = r.width;
      }
      uniform_raw_ = r.format == kRawU8 && !r.lz4() && r.height == raw_h_ && r.width == raw_w_ &&
                     r.offset == raw_offset_ + i * uint64_t{r.size};
    }
  }
  if (!uniform_raw_) raw_offset_ = raw_h_ = raw_w_ = 0;

  if ((flags_ & kFlagHasMetadata) && meta_size_ >= kMetaBlockHeaderBytes) {
    const uint8_t* m = base_ + meta_offset_;
    uint64_t sample = Load<uint64_t>(m);
    uint32_t size = Load<uint32_t>(m + 8);
    uint16_t type = Load<uint16_t>(m + 12);
    if (sample == kDatasetBlockIndex && type == kMetaDataset) {
      if (size > meta_size_ - kMetaBlockHeaderBytes)
        return Corrupt(path_ +
                       ": dataset metadata block runs past the end of the file: truncated?");
      if (Crc16Modbus(m + kMetaBlockHeaderBytes, size) != Load<uint16_t>(m + 14))
        return Corrupt(path_ + ": dataset metadata block checksum mismatch (labels/keys damaged)");
      dataset_json_ =
          std::string_view(reinterpret_cast<const char*>(m + kMetaBlockHeaderBytes), size);
    }
  }
  return Status::Ok();
}

std::string_view TblFile::metadata_section() const {
  if (!(flags_ & kFlagHasMetadata)) return {};
  return std::string_view(reinterpret_cast<const char*>(base_ + meta_offset_), meta_size_);
}

Status TblFile::ReadPayload(uint64_t i, std::vector<uint8_t>* out, bool verify) const {
  if (i >= num_records_)
    return OutOfRange(path_ + ": record " + std::to_string(i) + " out of range [0, " +
                      std::to_string(num_records_) + ")");
  RecordInfo r = record(i);
  const uint8_t* src = base_ + r.offset;
  out->resize(r.uncompressed_size);
  if (r.lz4()) {
    int got = LZ4_decompress_safe(reinterpret_cast<const char*>(src),
                                  reinterpret_cast<char*>(out->data()), static_cast<int>(r.size),
                                  static_cast<int>(r.uncompressed_size));
    if (got != static_cast<int>(r.uncompressed_size))
      return Corrupt(Where(i) + "LZ4 payload does not decompress to " +
                     std::to_string(r.uncompressed_size) + " bytes (corrupt data)");
  } else if (r.size) {
    std::memcpy(out->data(), src, r.size);
  }
  if (verify && (flags_ & kFlagHasChecksums) && Crc16Modbus(out->data(), out->size()) != r.crc16)
    return Corrupt(Where(i) + "checksum mismatch (CRC-16 of the payload differs from the index)");
  return Status::Ok();
}

Status TblFile::VerifyRecord(uint64_t i) const {
  if (i >= num_records_)
    return OutOfRange(path_ + ": record " + std::to_string(i) + " out of range");
  RecordInfo r = record(i);
  if (!r.lz4()) {
    if ((flags_ & kFlagHasChecksums) && Crc16Modbus(base_ + r.offset, r.size) != r.crc16)
      return Corrupt(Where(i) + "checksum mismatch (CRC-16 of the payload differs from the index)");
    return Status::Ok();
  }
  std::vector<uint8_t> tmp;
  return ReadPayload(i, &tmp, true);
}

// ------------------------------------------------------------------------------------------
// Writer

Status TblWriter::Create(const std::string& dst, uint64_t capacity, bool overwrite,
                         std::unique_ptr<TblWriter>* out) {
  if (dst.empty()) return InvalidArgument("destination path is empty");
  struct stat st;
  if (::stat(dst.c_str(), &st) == 0) {
    if (!overwrite)
      return InvalidArgument(dst + ": already exists (pass overwrite=True to replace it)");
    if (!S_ISREG(st.st_mode)) return InvalidArgument(dst + ": exists and is not a regular file");
  }
  const std::string dir = DirName(dst);
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return IOError(dst + ": directory " + dir + " does not exist");
  if (capacity > (uint64_t{1} << 40))
    return InvalidArgument("capacity " + std::to_string(capacity) + " is too large");

  RemoveStaleTemps(dst);
  std::unique_ptr<TblWriter> w(new TblWriter());
  w->dst_ = dst;
  w->overwrite_ = overwrite;
  w->capacity_ = capacity;
#ifdef O_TMPFILE
  // TBLJAX_NO_O_TMPFILE=1 takes the named path below, as on filesystems without O_TMPFILE
  // (tests use it to cover that path).
  const char* no_tmpfile = std::getenv("TBLJAX_NO_O_TMPFILE");
  if (no_tmpfile == nullptr || std::strcmp(no_tmpfile, "1") != 0)
    w->fd_ = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0644);
#endif
  if (w->fd_ < 0) {  // filesystem without O_TMPFILE: a hidden, unique name beside dst
    w->tmp_path_ = TempName(dst);
    w->fd_ = ::open(w->tmp_path_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0644);
    if (w->fd_ < 0) {
      std::string e = ErrnoText();
      w->tmp_path_.clear();
      return IOError(dst + ": cannot create a file in " + dir + ": " + e);
    }
  }
  // Payloads start on a 4 KiB boundary after an index sized for `capacity` records.
  w->cursor_ = AlignUp(kHeaderBytes + capacity * kIndexEntryBytes, kRawAlignment);
  if (::ftruncate(w->fd_, static_cast<off_t>(w->cursor_)) != 0)
    return IOError(dst + ": cannot size the new file: " + ErrnoText());
  *out = std::move(w);
  return Status::Ok();
}

TblWriter::~TblWriter() { Abort(); }

void TblWriter::Abort() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!done_ && !tmp_path_.empty()) ::unlink(tmp_path_.c_str());
  done_ = true;
}

Status TblWriter::WriteAt(const void* p, size_t n, uint64_t off) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = ::pwrite(fd_, c, n, static_cast<off_t>(off));
    if (k < 0) {
      if (errno == EINTR) continue;
      return IOError(dst_ + ": write failed: " + ErrnoText());
    }
    c += k;
    n -= static_cast<size_t>(k);
    off += static_cast<uint64_t>(k);
  }
  return Status::Ok();
}

Status TblWriter::Add(const uint8_t* data, size_t size, uint8_t format, uint32_t width,
                      uint32_t height, bool lz4) {
  if (done_) return InvalidArgument(dst_ + ": writer is already finalized or aborted");
  if (count_ >= capacity_)
    return InvalidArgument(dst_ + ": writer capacity of " + std::to_string(capacity_) +
                           " records is full");
  if (any_extra_) return InvalidArgument(dst_ + ": records must be added before the field blocks");
  if (format > kMaxFormat)
    return InvalidArgument("unknown record format " + std::to_string(format));
  if (width > kMaxSide || height > kMaxSide)
    return InvalidArgument("record of " + std::to_string(width) + "x" + std::to_string(height) +
                           " exceeds the format's " + std::to_string(kMaxSide) + "-pixel side");
  if (size > 0xFFFFFFFFull)
    return InvalidArgument("record of " + std::to_string(size) + " bytes exceeds 4 GiB");
  // The reader refuses RAW_U8 records of no pixels, so the writer must not make them.
  if (format == kRawU8 && (width == 0 || height == 0))
    return InvalidArgument("RAW_U8 record of " + std::to_string(width) + "x" +
                           std::to_string(height) + " pixels: an image needs at least 1x1");
  if (format == kRawU8 && size != uint64_t{width} * height * 3)
    return InvalidArgument(
        "RAW_U8 record of " + std::to_string(width) + "x" + std::to_string(height) + " must hold " +
        std::to_string(uint64_t{width} * height * 3) + " bytes, got " + std::to_string(size));
  const uint8_t* stored = data;
  size_t stored_size = size;
  uint8_t flags = 0;
  if (lz4 && size > 0) {
    scratch_.resize(static_cast<size_t>(LZ4_compressBound(static_cast<int>(size))));
    int c = LZ4_compress_default(reinterpret_cast<const char*>(data),
                                 reinterpret_cast<char*>(scratch_.data()), static_cast<int>(size),
                                 static_cast<int>(scratch_.size()));
    if (c > 0 && static_cast<size_t>(c) < size) {
      stored = scratch_.data();
      stored_size = static_cast<size_t>(c);
      flags |= kRecordLz4;
      any_lz4_ = true;
    }
  }
  uint8_t e[kIndexEntryBytes] = {};
  Store<uint64_t>(e, cursor_);
  Store<uint32_t>(e + 8, static_cast<uint32_t>(stored_size));
  Store<uint32_t>(e + 12, static_cast<uint32_t>(size));
  Store<uint16_t>(e + 16, static_cast<uint16_t>(width));
  Store<uint16_t>(e + 18, static_cast<uint16_t>(height));
  e[20] = format;
  e[21] = flags;
  Store<uint16_t>(e + 22, Crc16Modbus(data, size));
  TBLJAX_RETURN_IF_ERROR(WriteAt(stored, stored_size, cursor_));
  TBLJAX_RETURN_IF_ERROR(WriteAt(e, sizeof e, kHeaderBytes + count_ * kIndexEntryBytes));
  cursor_ += stored_size;
  ++count_;
  return Status::Ok();
}

Status TblWriter::AddExtra(const uint8_t* data, size_t size, uint64_t align, uint64_t* offset) {
  if (done_) return InvalidArgument(dst_ + ": writer is already finalized or aborted");
  if (align == 0 || (align & (align - 1)) != 0 || align > kRawAlignment)
    return InvalidArgument("block alignment must be a power of two <= 4096, got " +
                           std::to_string(align));
  const uint64_t at = AlignUp(cursor_, align);  // the gap reads as zeros (a hole)
  TBLJAX_RETURN_IF_ERROR(WriteAt(data, size, at));
  cursor_ = at + size;
  any_extra_ = true;
  *offset = at;
  return Status::Ok();
}

Status TblWriter::Finalize(std::string_view dataset_json) {
  if (done_) return InvalidArgument(dst_ + ": writer is already finalized or aborted");
  if (dataset_json.size() > 0xFFFFFFFFull) return InvalidArgument("dataset metadata exceeds 4 GiB");
  const uint64_t meta_offset = cursor_;
  uint64_t meta_size = 0;
  if (!dataset_json.empty()) {
    uint8_t b[kMetaBlockHeaderBytes] = {};
    Store<uint64_t>(b, kDatasetBlockIndex);
    Store<uint32_t>(b + 8, static_cast<uint32_t>(dataset_json.size()));
    Store<uint16_t>(b + 12, kMetaDataset);
    // The block header's reserved u16 carries a CRC-16 of the JSON (turboloader ignores it).
    Store<uint16_t>(b + 14, Crc16Modbus(reinterpret_cast<const uint8_t*>(dataset_json.data()),
                                        dataset_json.size()));
    TBLJAX_RETURN_IF_ERROR(WriteAt(b, sizeof b, meta_offset));
    TBLJAX_RETURN_IF_ERROR(
        WriteAt(dataset_json.data(), dataset_json.size(), meta_offset + sizeof b));
    meta_size = sizeof b + dataset_json.size();
  }
  uint8_t h[kHeaderBytes] = {};
  std::memcpy(h, kMagic, 4);
  Store<uint32_t>(h + 4, kVersion);
  Store<uint64_t>(h + 8, count_);
  Store<uint32_t>(h + 16, static_cast<uint32_t>(kHeaderBytes + count_ * kIndexEntryBytes));
  Store<uint64_t>(h + 24, meta_offset);
  Store<uint64_t>(h + 32, meta_size);
  uint32_t flags = kFlagHasChecksums;
  if (any_lz4_) flags |= kFlagCompressed;
  if (meta_size) flags |= kFlagHasMetadata;
  Store<uint32_t>(h + 40, flags);
  Store<uint32_t>(h + 44, Crc32(h, kHeaderBytes));
  TBLJAX_RETURN_IF_ERROR(WriteAt(h, sizeof h, 0));
  if (::ftruncate(fd_, static_cast<off_t>(meta_offset + meta_size)) != 0)
    return IOError(dst_ + ": cannot size the file: " + ErrnoText());
  if (::fdatasync(fd_) != 0) return IOError(dst_ + ": sync failed: " + ErrnoText());

  // Publish: link the finished file at dst (no-replace), or rename over it when overwriting.
  std::string staged = tmp_path_;
  if (staged.empty()) {  // unnamed O_TMPFILE: give it a name first
    std::string fdpath = "/proc/self/fd/" + std::to_string(fd_);
    if (!overwrite_) {
      if (::linkat(AT_FDCWD, fdpath.c_str(), AT_FDCWD, dst_.c_str(), AT_SYMLINK_FOLLOW) != 0) {
        std::string e =
            errno == EEXIST ? "it appeared while converting; not overwritten" : ErrnoText();
        return IOError(dst_ + ": cannot create: " + e);
      }
      ::close(fd_);
      fd_ = -1;
      done_ = true;
      SyncDir(DirName(dst_));
      return Status::Ok();
    }
    staged = TempName(dst_);
    if (::linkat(AT_FDCWD, fdpath.c_str(), AT_FDCWD, staged.c_str(), AT_SYMLINK_FOLLOW) != 0)
      return IOError(dst_ + ": cannot stage the new file: " + ErrnoText());
    tmp_path_ = staged;  // so a failure below removes it
  }
  int rc;
  if (overwrite_) {
    rc = ::rename(staged.c_str(), dst_.c_str());
  } else {
    rc = ::link(staged.c_str(), dst_.c_str());
    if (rc == 0) ::unlink(staged.c_str());
  }
  if (rc != 0) {
    std::string e = errno == EEXIST ? "it appeared while converting; not overwritten" : ErrnoText();
    return IOError(dst_ + ": cannot publish: " + e);
  }
  ::close(fd_);
  fd_ = -1;
  done_ = true;
  SyncDir(DirName(dst_));
  return Status::Ok();
}

}  // namespace tbljax::tbl
