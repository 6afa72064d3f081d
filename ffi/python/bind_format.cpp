// Python bindings for the TBL file: constants, checksums, the reader and the writer.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <mutex>

#include "common.h"
#include "lz4_blocks.h"
#include "tbl_format.h"
#include "thread_pool.h"

namespace tbljax::py {
namespace {

using tbl::TblFile;
using tbl::TblWriter;

// Holds the mapping; numpy views of it keep this object alive as their owner.
struct PyTblFile {
  std::unique_ptr<TblFile> f;
};
struct PyTblWriter {
  std::unique_ptr<TblWriter> w;
};

using U8Bytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

nb::bytes BytesOf(std::string_view s) { return nb::bytes(s.data(), s.size()); }

}  // namespace

void BindFormat(nb::module_& m) {
  m.def(
      "lz4_compress",
      [](U8Bytes data) {
        std::vector<uint8_t> out;
        Status st;
        {
          nb::gil_scoped_release release;
          st = tbl::Lz4CompressBlock(data.data(), static_cast<int64_t>(data.shape(0)), &out);
        }
        Check(st);
        return nb::bytes(reinterpret_cast<const char*>(out.data()), out.size());
      },
      nb::arg("data"), "data (uint8, 1-D) as one LZ4 block.");
  m.def(
      "lz4_decode_blocks",
      [](U8Bytes src, I64Array begin, I64Array end,
         nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> out, I64Array out_offsets,
         int threads) {
        const int64_t n = static_cast<int64_t>(begin.shape(0));
        if (static_cast<int64_t>(end.shape(0)) != n ||
            static_cast<int64_t>(out_offsets.shape(0)) != n + 1 || out_offsets.data()[0] < 0 ||
            out_offsets.data()[n] > static_cast<int64_t>(out.shape(0)))
          Check(
              InvalidArgument("begin and end need one entry per row and out_offsets one more, "
                              "rising inside out"));
        for (int64_t b = 0; b < n; ++b)
          if (out_offsets.data()[b + 1] < out_offsets.data()[b])
            Check(InvalidArgument("out_offsets must rise"));
        CheckThreads(threads);
        int64_t bad;
        {
          nb::gil_scoped_release release;
          bad = tbl::Lz4DecodeBlocks(src.data(), static_cast<int64_t>(src.shape(0)), begin.data(),
                                     end.data(), n, out.data(), out_offsets.data(),
                                     &PoolFor(threads));
        }
        return bad;
      },
      nb::arg("src"), nb::arg("begin").noconvert(), nb::arg("end").noconvert(),
      nb::arg("out").noconvert(), nb::arg("out_offsets").noconvert(), nb::arg("threads") = 0,
      "Row b's LZ4 block src[begin[b]:end[b]] into out[out_offsets[b]:out_offsets[b + 1]], "
      "exactly that many bytes, rows in parallel with the GIL released. Returns the first row "
      "whose block does not decompress to its size, -1 when all did.");
  m.attr("MAGIC") = nb::bytes(tbl::kMagic, 4);
  m.attr("VERSION") = tbl::kVersion;
  m.attr("HEADER_BYTES") = tbl::kHeaderBytes;
  m.attr("INDEX_ENTRY_BYTES") = tbl::kIndexEntryBytes;
  m.attr("META_BLOCK_HEADER_BYTES") = tbl::kMetaBlockHeaderBytes;
  m.attr("RAW_ALIGNMENT") = tbl::kRawAlignment;
  m.attr("MAX_SIDE") = tbl::kMaxSide;
  m.attr("META_JSON") = tbl::kMetaJson;
  m.attr("META_DATASET") = tbl::kMetaDataset;
  m.attr("DATASET_BLOCK_INDEX") = tbl::kDatasetBlockIndex;
  m.attr("FLAG_COMPRESSED") = static_cast<uint32_t>(tbl::kFlagCompressed);
  m.attr("FLAG_HAS_METADATA") = static_cast<uint32_t>(tbl::kFlagHasMetadata);
  m.attr("FLAG_HAS_CHECKSUMS") = static_cast<uint32_t>(tbl::kFlagHasChecksums);
  m.attr("RECORD_LZ4") = static_cast<uint32_t>(tbl::kRecordLz4);
  nb::dict formats;
  formats["UNKNOWN"] = int{tbl::kUnknown};
  formats["JPEG"] = int{tbl::kJpeg};
  formats["PNG"] = int{tbl::kPng};
  formats["WEBP"] = int{tbl::kWebp};
  formats["BMP"] = int{tbl::kBmp};
  formats["TIFF"] = int{tbl::kTiff};
  formats["MP4"] = int{tbl::kMp4};
  formats["AVI"] = int{tbl::kAvi};
  formats["RAW_U8"] = int{tbl::kRawU8};
  m.attr("FORMATS") = formats;

  m.def(
      "crc32", [](U8Bytes b, uint32_t crc) { return tbl::Crc32(b.data(), b.shape(0), crc); },
      nb::arg("data"), nb::arg("crc") = 0, "zlib-compatible CRC-32.");
  m.def(
      "crc16_modbus", [](U8Bytes b) { return tbl::Crc16Modbus(b.data(), b.shape(0)); },
      nb::arg("data"), "CRC-16/MODBUS, the per-record checksum of TBL v2.");

  nb::class_<PyTblFile>(m, "TblFile", "A validated, memory-mapped TBL v2 file.")
      .def(
          "__init__",
          [](PyTblFile* self, const std::string& path) {
            std::unique_ptr<TblFile> f;
            Status s;
            {
              nb::gil_scoped_release release;
              s = TblFile::Open(path, &f);
            }
            Check(s);
            new (self) PyTblFile{std::move(f)};
          },
          nb::arg("path"))
      .def_prop_ro("path", [](const PyTblFile& s) { return s.f->path(); })
      .def_prop_ro("num_records", [](const PyTblFile& s) { return s.f->num_records(); })
      .def_prop_ro("file_size", [](const PyTblFile& s) { return s.f->file_size(); })
      .def_prop_ro("header_flags", [](const PyTblFile& s) { return s.f->header_flags(); })
      .def_prop_ro("uniform_raw", [](const PyTblFile& s) { return s.f->uniform_raw(); })
      .def_prop_ro("raw_offset", [](const PyTblFile& s) { return s.f->raw_offset(); })
      .def_prop_ro(
          "raw_shape",
          [](const PyTblFile& s) { return std::make_tuple(s.f->raw_height(), s.f->raw_width()); })
      // These read the mapping: a file truncated or rewritten since it was opened is an
      // error here, not bytes of zeros (or SIGBUS) handed on.
      .def_prop_ro("dataset_json",
                   [](const PyTblFile& s) {
                     Check(s.f->CheckUnchanged());
                     return BytesOf(s.f->dataset_json());
                   })
      .def("metadata_section",
           [](const PyTblFile& s) {
             Check(s.f->CheckUnchanged());
             return BytesOf(s.f->metadata_section());
           })
      .def(
          "index_bytes",
          [](nb::handle self_h) {
            const PyTblFile& s = nb::cast<const PyTblFile&>(self_h);
            Check(s.f->CheckUnchanged());
            size_t shape[2] = {static_cast<size_t>(s.f->num_records()), tbl::kIndexEntryBytes};
            return nb::ndarray<nb::numpy, const uint8_t, nb::ndim<2>>(
                s.f->base() + tbl::kHeaderBytes, 2, shape, self_h);
          },
          "The index as a read-only (N, 24) uint8 view of the mapping.")
      .def(
          "raw_view",
          [](nb::handle self_h) {
            const PyTblFile& s = nb::cast<const PyTblFile&>(self_h);
            Check(s.f->CheckUnchanged());
            if (s.f->num_records() == 0)
              Raise(InvalidArgument(s.f->path() +
                                    ": the file holds no records, so there is no image view"));
            if (!s.f->uniform_raw())
              Raise(InvalidArgument(s.f->path() +
                                    ": records are not uniform uncompressed RAW_U8, so there "
                                    "is no zero-copy view (use read(i))"));
            size_t shape[4] = {static_cast<size_t>(s.f->num_records()), s.f->raw_height(),
                               s.f->raw_width(), 3};
            return nb::ndarray<nb::numpy, const uint8_t, nb::ndim<4>>(
                s.f->base() + s.f->raw_offset(), 4, shape, self_h);
          },
          "Zero-copy read-only (N, H, W, 3) uint8 view of a uniform RAW file.")
      .def(
          "file_view",
          [](nb::handle self_h) {
            const PyTblFile& s = nb::cast<const PyTblFile&>(self_h);
            Check(s.f->CheckUnchanged());
            size_t shape[1] = {static_cast<size_t>(s.f->file_size())};
            return nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>>(s.f->base(), 1, shape,
                                                                      self_h);
          },
          "The whole file as a read-only 1-D uint8 view of the mapping (records at the "
          "index's offsets).")
      .def(
          "check_unchanged", [](const PyTblFile& s) { Check(s.f->CheckUnchanged()); },
          "Raises CorruptFileError if the file was truncated or rewritten in place since it "
          "was opened (a rename over it is fine: the mapping keeps the old file).")
      .def(
          "read_payload",
          [](const PyTblFile& s, uint64_t i, bool verify) {
            std::vector<uint8_t> buf;
            Status st = s.f->CheckUnchanged();
            if (st.ok()) {
              nb::gil_scoped_release release;
              st = s.f->ReadPayload(i, &buf, verify);
            }
            if (st.ok()) st = s.f->CheckUnchanged();
            Check(st);
            return nb::bytes(reinterpret_cast<const char*>(buf.data()), buf.size());
          },
          nb::arg("i"), nb::arg("verify") = true, "Record i's payload bytes, LZ4 undone.")
      .def(
          "verify",
          [](const PyTblFile& s, int threads) {
            // Checks every record's CRC-16 in parallel; returns [(record, message)] of failures.
            // The pool is made per call; kMaxThreads keeps a typo from starting a million.
            CheckThreads(threads);
            const uint64_t n = s.f->num_records();
            std::vector<std::tuple<uint64_t, std::string>> bad;
            {
              nb::gil_scoped_release release;
              std::mutex mu;
              auto check = [&](int64_t i) {
                Status st = s.f->VerifyRecord(static_cast<uint64_t>(i));
                if (!st.ok()) {
                  std::lock_guard<std::mutex> lock(mu);
                  bad.emplace_back(static_cast<uint64_t>(i), st.message());
                }
              };
              if (threads <= 0) {
                ThreadPool::Default().ParallelFor(static_cast<int64_t>(n), check);
              } else {
                ThreadPool pool(threads, "tbljax-verify");
                pool.ParallelFor(static_cast<int64_t>(n), check);
              }
            }
            std::sort(bad.begin(), bad.end());
            return bad;
          },
          nb::arg("threads") = 0);

  nb::class_<PyTblWriter>(m, "TblWriter",
                          "Streaming, atomic TBL v2 writer (see tbljax.format.Writer).")
      .def(
          "__init__",
          [](PyTblWriter* self, const std::string& dst, uint64_t capacity, bool overwrite) {
            std::unique_ptr<TblWriter> w;
            Check(TblWriter::Create(dst, capacity, overwrite, &w));
            new (self) PyTblWriter{std::move(w)};
          },
          nb::arg("dst"), nb::arg("capacity"), nb::arg("overwrite") = false)
      .def(
          "add",
          [](PyTblWriter& s, U8Bytes data, uint8_t format, uint32_t width, uint32_t height,
             bool lz4) {
            // A typical record (a 160 px image: ~60 us of CRC and write) keeps the GIL: releasing
            // it makes this thread queue behind any other Python thread for a whole switch interval
            // (5 ms), which measured 6x slower per record inside convert. Large records let go.
            Status st;
            if (data.shape(0) < (size_t{1} << 20)) {
              st = s.w->Add(data.data(), data.shape(0), format, width, height, lz4);
            } else {
              nb::gil_scoped_release release;
              st = s.w->Add(data.data(), data.shape(0), format, width, height, lz4);
            }
            Check(st);
          },
          nb::arg("data"), nb::arg("format"), nb::arg("width"), nb::arg("height"),
          nb::arg("lz4") = false)
      .def(
          "add_extra",
          [](PyTblWriter& s, U8Bytes data, uint64_t align) {
            Status st;
            uint64_t offset = 0;
            {
              nb::gil_scoped_release release;
              st = s.w->AddExtra(data.data(), data.shape(0), align, &offset);
            }
            Check(st);
            return offset;
          },
          nb::arg("data"), nb::arg("align"),
          "Appends a field block after the records; returns its byte offset.")
      .def(
          "finalize",
          [](PyTblWriter& s, const std::string& json) {
            Status st;
            {
              nb::gil_scoped_release release;
              st = s.w->Finalize(json);
            }
            Check(st);
          },
          nb::arg("dataset_json"))
      .def("abort", [](PyTblWriter& s) { s.w->Abort(); })
      .def_prop_ro("num_records", [](const PyTblWriter& s) { return s.w->num_records(); })
      .def_prop_ro("capacity", [](const PyTblWriter& s) { return s.w->capacity(); });
}

}  // namespace tbljax::py
